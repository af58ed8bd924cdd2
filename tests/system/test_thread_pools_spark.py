"""Every thread pool inside Spark's Python workers that import mpitrain, with no thread variables set."""
from __future__ import annotations

import os
import subprocess
import sys

from mpitrain.testing.thread_pools import assert_every_pool, bare_env, pools_of


def test_spark_executors_that_import_mpitrain_run_one_thread_per_task(tmp_path):
    """spark-submit of a job whose tasks import mpitrain.etl, as the ETL's and the scoring's tasks do: Spark
    gives its Python workers OMP_NUM_THREADS = spark.task.cpus (1), which every pool follows."""
    job = tmp_path / "job.py"
    job.write_text(
        "import json\nfrom pyspark.sql import SparkSession\n"
        "def pools(_):\n"
        "    import mpitrain.etl  # noqa: F401\n"
        "    from mpitrain.testing.thread_pools import pools\n"
        "    yield json.dumps(pools())\n"
        "spark = SparkSession.builder.getOrCreate()\n"
        "for line in spark.sparkContext.parallelize(range(2), 2).mapPartitions(pools).collect():\n"
        "    print(line)\n")
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2]",
                             str(job)], capture_output=True, text=True, timeout=180,
                            env=bare_env(PYSPARK_PYTHON=sys.executable))
    assert result.returncode == 0, result.stderr[-3000:]
    tasks = pools_of(result.stdout)
    assert len(tasks) == 2
    for pool in tasks:
        assert_every_pool(pool, 1)

