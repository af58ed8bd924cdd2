"""`spark-submit spark_job.py RANKS WORKDIR PYTHON_ARGS...`: the executors' Python runs PYTHON_ARGS on RANKS ranks,
in WORKDIR, in one barrier stage of spark-submit's master (`mpitrain.spark.stage.run_mpi_job`, as `mpitrain
spark-train` does); prints the ranks' output, then `status N` or `failed: LINE`. The driver of the tests' jobs
that `mpitrain train` alone does not make (a rank that raises) where the driver must run inside a simulated
node."""
import sys

from pyspark.sql import SparkSession

from mpitrain.spark.stage import run_mpi_job
from mpitrain.spark.task import JobFailed, MpiJob

if __name__ == "__main__":
    ranks, workdir, python_args = int(sys.argv[1]), sys.argv[2], tuple(sys.argv[3:])
    spark = SparkSession.builder.appName("mpitrain-test-job").getOrCreate()
    try:
        print(f"status {run_mpi_job(spark.sparkContext, MpiJob(ranks, python_args, workdir, ('', 0)))}", flush=True)
    except JobFailed as e:
        print(f"failed: {e}", flush=True)
    finally:
        spark.stop()
