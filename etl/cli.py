"""The ETL command line: `mpitrain etl ...` and `spark-submit etl/prepare.py ...` share it."""
from __future__ import annotations

import argparse
import os
import sys

from mpitrain.errors import MpitrainError
from mpitrain.etl.job import plan_etl, write_dataset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ETL options to `parser`."""
    parser.add_argument("--source", required=True, help="idx:/folder (MNIST-format IDX files) or digits:")
    parser.add_argument("--out", required=True, help="dataset folder to write; it appears only when complete")
    parser.add_argument("--shards", type=int, required=True, help="shards per split (sizes differ by at most 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row shuffle (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")
    parser.add_argument("--test-fraction", type=float, default=0.2,
                        help="test split cut from a source without one, e.g. digits: (default 0.2)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's --master or "
                                         "spark-defaults.conf, else local[*])")


def run(args: argparse.Namespace) -> int:
    """Validate the request, run the Spark job and print a summary; a DataError propagates."""
    from pyspark.sql import SparkSession

    # Checked before Spark starts (seconds), so a wrong --out or --shards fails at once.
    plan = plan_etl(args.source, args.out, args.shards, args.seed, args.overwrite, args.test_fraction)
    # Executors run this Python (and its installed mpitrain) unless the user chose another.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("mpitrain-etl")
    if args.master:
        builder = builder.master(args.master)
    # Without --master, Spark's own default applies: spark-submit always sets spark.master
    # (its --master, spark-defaults.conf, or local[*]), also when PySpark starts it itself.
    spark = builder.getOrCreate()
    try:
        spark.sparkContext.setLogLevel("WARN")
        master = spark.sparkContext.master
        manifest = write_dataset(spark, plan)
    finally:
        spark.stop()
    rows = ", ".join(f"{split} {manifest.rows(split)} rows" for split in manifest.splits)
    print(f"wrote {plan.out}: {rows}; {plan.shards} shards per split (Spark master {master})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The `spark-submit etl/prepare.py` entry: parse `argv`, run, print an input error as one line."""
    parser = argparse.ArgumentParser(prog="etl/prepare.py", description="Spark ETL: a source to HDF5 shards")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except MpitrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
