"""The SparkSession of one job (an ETL, a scoring, a barrier stage of ranks): its settings, its log level, stopped
afterwards.

    with spark_session(args.master, "mpitrain-etl") as spark:
        ...
"""
from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def spark_session(master: str | None, name: str, conf: dict | None = None):
    """A SparkSession for one job, with the settings `conf`, stopped afterwards; its executors run this Python
    unless told otherwise."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(name)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if master:
        builder = builder.master(master)
    # Without --master, Spark's own default applies: spark-submit always sets spark.master
    # (its --master, spark-defaults.conf, or local[*]), also when PySpark starts it itself.
    spark = builder.getOrCreate()
    try:
        spark.sparkContext.setLogLevel("WARN")
        yield spark
    finally:
        spark.stop()
