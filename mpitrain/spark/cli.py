"""`mpitrain spark-train CONFIG --ranks N` (local[N] unless --master) and `spark-submit etl/train.py CONFIG
--ranks N` (spark-submit's master): `mpitrain train CONFIG` on N ranks in one barrier stage, the same run
directory, metrics, checkpoints and final parameters as `mpiexec -n N mpitrain train CONFIG`.

Everything checkable is checked before Spark starts (the config, the MPI's manual launcher), then the
cluster's settings once it has (`stage.check_cluster`). A user error is one line and exit 2; a failed job is
one line naming the rank and host, exit 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from mpitrain.base.errors import MpitrainError


def add_arguments(parser: argparse.ArgumentParser, default_master: str) -> None:
    parser.add_argument("config", help="YAML config file, as for `mpitrain train`")
    parser.add_argument("--ranks", type=int, required=True, help="MPI ranks, one per task of the barrier stage")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key (value parsed as YAML); repeatable")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the run's newest checkpoint (the same as --set resume=auto)")
    parser.add_argument("--master", help=f"Spark master (default: {default_master})")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, as spark-submit's --conf; repeatable")
    parser.add_argument("--mpiexec", help="MPICH Hydra's mpiexec on every node (default: the one beside the "
                                          "executors' Python, else the first on PATH)")


def run(args: argparse.Namespace) -> int:
    """Check the request, run the job in Spark, print the outcome; a user error propagates as MpitrainError."""
    from mpitrain.rundir.directory import load_run_config
    from mpitrain.spark.hydra import check_manual_launcher, find_mpiexec
    from mpitrain.spark.session import spark_session
    from mpitrain.spark.stage import run_mpi_job
    from mpitrain.spark.task import JobFailed, MpiJob

    if args.ranks < 1:
        raise MpitrainError(f"--ranks {args.ranks}: expected a positive number of ranks")
    settings = dict(setting.partition("=")[::2] for setting in args.conf)
    if any(not key or not value for key, value in settings.items()):
        raise MpitrainError(f"--conf {' '.join(args.conf)}: expected KEY=VALUE")
    check_classic_spark(args.master, settings)
    overrides = [*args.set, *(["resume=auto"] if args.resume else [])]
    config = load_run_config(args.config, overrides)  # a config error is one line now, not N ranks' later
    check_manual_launcher(find_mpiexec(args.mpiexec))
    python_args = ("-m", "mpitrain", "train", os.path.abspath(args.config), *(f"--set={o}" for o in overrides))
    # the ranks run where `mpiexec` would have been typed: the driver's working directory (it must exist on
    # every node, as under mpiexec), so relative paths in the config and --set mean the same
    job = MpiJob(args.ranks, python_args, os.getcwd(), ("", 0), args.mpiexec)
    started = time.monotonic()
    # Spark's console progress bar would cut into the ranks' lines; the driver prints those instead
    with spark_session(args.master, "mpitrain-spark-train",
                       {"spark.ui.showConsoleProgress": "false", **settings}) as spark:
        master = spark.sparkContext.master
        try:
            status = run_mpi_job(spark.sparkContext, job)
        except JobFailed as e:
            print(f"spark-train: the training job failed: {e}; nothing of it is left running; the run "
                  f"directory {config.run_dir} keeps its checkpoints", file=sys.stderr)
            return 1
    if status == 0:
        print(f"spark-train: trained {args.ranks} ranks in {time.monotonic() - started:.1f} s (Spark master "
              f"{master}); results in {config.run_dir}", file=sys.stderr)
    return status


def check_classic_spark(master: str | None, settings: dict) -> None:
    """Refuse Spark Connect (PySpark's own tests of it: an sc:// master, spark.remote, spark.api.mode=connect,
    SPARK_REMOTE or SPARK_CONNECT_MODE_ENABLED in the environment; under spark-submit, the connect settings it
    hands a Python driver in PYSPARK_REMOTE_INIT_CONF_*): its sessions have no SparkContext, whose RDD API the
    barrier stage and the task slots' count need."""
    api_mode = settings.get("spark.api.mode", os.environ.get("SPARK_API_MODE", "classic")).strip().lower()
    remote = [what for what, chosen in (
        (f"--master {master}", (master or "").startswith("sc://")), ("spark.remote", "spark.remote" in settings),
        ("spark.api.mode=connect", api_mode == "connect"), ("SPARK_REMOTE", "SPARK_REMOTE" in os.environ),
        ("SPARK_CONNECT_MODE_ENABLED", "SPARK_CONNECT_MODE_ENABLED" in os.environ),
        ("spark-submit's --remote or spark.api.mode=connect", "PYSPARK_REMOTE_INIT_CONF_LEN" in os.environ))
        if chosen]
    if remote:
        raise MpitrainError(f"{remote[0]} asks for Spark Connect, whose sessions have no RDD API, and the ranks' "
                            "barrier stage needs it; train with a classic session (spark.api.mode=classic and a "
                            "local, spark://, yarn or k8s master)")


def main(argv: list[str] | None = None) -> int:
    """The `spark-submit etl/train.py` entry: parse `argv`, train, print a user error as one line (exit 2)."""
    parser = argparse.ArgumentParser(prog="etl/train.py", description="MPI training in a Spark barrier stage")
    add_arguments(parser, "spark-submit's --master or spark-defaults.conf, else local[*]")
    try:
        return run(parser.parse_args(argv))
    except MpitrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
