"""The driver's side of an MPI job in a barrier stage: the refusals a barrier stage needs up front, the
stage itself (`task.run_barrier_task` on each of its N tasks), the ranks' output shown as it comes, and a
failed stage as one line.

    with spark_session(...) as spark:
        status = run_mpi_job(spark.sparkContext, MpiJob(2, ("-m", "mpitrain", "train", "exp.yaml"), ...))
"""
from __future__ import annotations

import dataclasses
import functools
import re
import time

from mpitrain.base.errors import MpitrainError
from mpitrain.base.threads import POOL_VARIABLES
from mpitrain.spark.logstream import LineServer
from mpitrain.spark.task import JobFailed, MpiJob, run_barrier_task

# Executors of a cluster register after the context starts: wait this long for enough task slots (Spark's
# own spark.scheduler.maxRegisteredResourcesWaitingTime), then refuse instead of Spark's retrying for minutes.
SLOTS_WAIT_S = 30
# The tasks that start no process wait in one barrier call (allGather) for the whole training, and Spark fails
# the stage when a barrier call outlasts spark.barrier.sync.timeout (default 365 days). mpitrain's watchdog,
# not that timeout, catches a stuck rank, so a timeout shorter than this (a training could outlast it) is
# refused rather than left to fail a long run midway.
MIN_BARRIER_SYNC_TIMEOUT_S = 24 * 3600
SPARK_TIME_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def check_cluster(sc, ranks: int) -> None:
    """Refuse, in one line each, what a barrier stage of `ranks` tasks cannot run on: the settings
    `check_settings` refuses, and fewer task slots than ranks (Spark would retry the stage's start for minutes
    before failing)."""
    conf = sc.getConf()
    check_settings(conf, ranks)
    slots = task_slots(sc)
    deadline = time.monotonic() + (0 if sc.master.startswith("local[") or sc.master == "local" else SLOTS_WAIT_S)
    while slots < ranks and time.monotonic() < deadline:
        time.sleep(0.5)
        slots = task_slots(sc)
    if slots < ranks:
        cpus = conf.get("spark.task.cpus", "1")
        raise MpitrainError(f"--ranks {ranks} needs {ranks} task slots at once, but Spark master {sc.master} has "
                            f"{slots} (executor cores / spark.task.cpus={cpus}); use at most --ranks {slots} or "
                            "give the cluster more cores")


def check_settings(conf, ranks: int) -> None:
    """Refuse the Spark settings (`conf`: a SparkConf) a barrier stage of `ranks` tasks cannot train under:
    dynamic allocation (Spark would refuse the stage) and a barrier timeout a training could outlast (Spark
    would fail the stage when the training reaches it)."""
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        raise MpitrainError("spark.dynamicAllocation.enabled is true, but the ranks' barrier stage needs all its "
                            f"{ranks} tasks at once; set spark.dynamicAllocation.enabled=false")
    timeout = conf.get("spark.barrier.sync.timeout", "365d").strip().lower()
    amount = re.fullmatch(r"(\d+)\s*([a-z]*)", timeout)
    if not amount or amount[2] not in ("", *SPARK_TIME_UNITS_S):
        raise MpitrainError(f"spark.barrier.sync.timeout={timeout}: expected a time such as 365d, 48h or 600s")
    if int(amount[1]) * SPARK_TIME_UNITS_S[amount[2] or "s"] < MIN_BARRIER_SYNC_TIMEOUT_S:
        raise MpitrainError(f"spark.barrier.sync.timeout={timeout} would fail any training longer than that: the "
                            "ranks' tasks wait in one barrier call until the training ends; leave it unset (365 "
                            f"days) or set at least {MIN_BARRIER_SYNC_TIMEOUT_S // 3600}h (train.watchdog_s ends a "
                            "stuck rank)")


def rank_threads(conf) -> dict[str, str]:
    """The thread pools of each rank (pool variable -> threads): those the user gave the executors
    (spark.executorEnv.VAR), else OMP_NUM_THREADS = spark.task.cpus, the cores Spark gives each task, which
    every other pool follows (`mpitrain.base.threads.plan_threads`). Set for the ranks explicitly: what
    the executors' Python workers have may be marked as mpitrain's own sizing by a driver that imported
    mpitrain (local modes start the workers from the driver's environment), and the ranks would resize it."""
    chosen = {v: conf.get(f"spark.executorEnv.{v}") for v in POOL_VARIABLES if conf.get(f"spark.executorEnv.{v}")}
    return {"OMP_NUM_THREADS": conf.get("spark.task.cpus", "1"), **chosen}


def task_slots(sc) -> int:
    """How many tasks the cluster's registered executors run at once (what Spark checks a barrier stage
    against)."""
    jsc = sc._jsc.sc()
    return jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile())


def run_mpi_job(sc, job: MpiJob, out=None) -> int:
    """Run `job` on its ranks, one per task of a barrier stage, printing its output to `out` (default stderr)
    as it comes. Returns its exit status: 0, 2 (a rank's user error, whose line the output shows) or 3
    (stopped by a signal, resumable); raises `JobFailed` with one line when the stage fails (a rank raised, a
    rank, proxy or executor was killed). `job.log_address` and `job.threads` are replaced by the driver's own
    and `rank_threads`'."""
    ranks = job.ranks
    check_cluster(sc, ranks)
    with LineServer(sc.getConf().get("spark.driver.host"), out) as server:
        job = dataclasses.replace(job, log_address=server.address, threads=rank_threads(sc.getConf()))
        # Spark reruns a failed barrier stage only when it is a shuffle map stage (a failed barrier result
        # stage ends the job: its results may have been taken), so the tasks' statuses pass through a shuffle
        # into one partition, and a rerun's `mpitrain train` resumes from the newest checkpoint.
        stage = sc.parallelize(range(ranks), ranks).barrier().mapPartitions(
            functools.partial(run_barrier_task, job)).repartition(1)
        try:
            return dict(stage.collect())[0]
        except Exception as e:  # Py4J's or PySpark's wrapper of the stage's failure
            raise JobFailed(failure_line(str(e))) from None


def failure_line(spark_error: str) -> str:
    """The one line of a failed stage: the tasks' `JobFailed` message, else the first line of Spark's reason (an
    executor lost, a task killed)."""
    ours = re.findall(rf"{JobFailed.__name__}: (.*)", spark_error)
    if ours:
        return ours[-1].strip()
    reason = re.search(r"(Job aborted due to stage failure: .*|Could not .*|.*Exception: .*)", spark_error)
    return (reason[1] if reason else spark_error.strip().splitlines()[0]).strip()
