"""Thread pools sized before they start (mpitrain/threads.py): the launcher's environment read
alone, then every pool inside real ranks under mpiexec, srun and Spark with no thread variables set.

The pools are read inside each process by tests/mpi/thread_pools.py: numba's pool and every pool
threadpoolctl reports (OpenBLAS, numpy's and scipy's, and GNU OpenMP).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import MPIEXEC
from mpitrain.threads import (POOL_VARIABLES, SIZED_MARK, ThreadPlan, check_ranks_on_node, plan_threads,
                              ranks_on_node, size_thread_pools)

HERE = os.path.dirname(os.path.abspath(__file__))
THREAD_POOLS = os.path.join(HERE, "mpi", "thread_pools.py")
CORES = len(os.sched_getaffinity(0))


def bare_env(**extra) -> dict:
    """This process's environment without any thread variable, as a user's shell has it."""
    return {**{k: v for k, v in os.environ.items() if k not in (*POOL_VARIABLES, SIZED_MARK)},
            "PYTHONUNBUFFERED": "1", **extra}


def pools_of(stdout: str) -> list[dict]:
    """The JSON objects the processes printed (the ranks' lines may run together)."""
    decoder, found, at = json.JSONDecoder(), [], stdout.find("{")
    while at >= 0:
        value, end = decoder.raw_decode(stdout, at)
        found.append(value)
        at = stdout.find("{", end)
    return found


def assert_every_pool(pool: dict, threads: int) -> None:
    assert pool["numba_pool"] == pool["numba_threads"] == threads, pool
    assert pool["pools"] and all(n == threads for _, _, n in pool["pools"]), pool


# -- the environment alone --

@pytest.mark.parametrize("environ, expected", [
    ({"MPI_LOCALNRANKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0"}, (4, "MPICH Hydra")),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, (3, "Open MPI")),
    ({"MV2_COMM_WORLD_LOCAL_SIZE": "2"}, (2, "MVAPICH")),
    ({"PMIX_LOCAL_SIZE": "8"}, (8, "PMIx")),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "2"}, (2, "Slurm srun")),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}, (1, "Slurm srun")),
    ({"SLURM_STEP_TASKS_PER_NODE": "garbage", "SLURM_NODEID": "0"}, (1, None)),
    ({"SLURM_TASKS_PER_NODE": "4"}, (1, None)),  # a batch script, not a step: one process
    ({"MPI_LOCALNRANKS": "0"}, (1, None)),
    ({}, (1, None)),
])
def test_ranks_on_the_node_come_from_the_launcher(environ, expected):
    assert ranks_on_node(environ) == expected


def test_each_rank_gets_its_share_of_the_cores_and_at_least_one():
    assert plan_threads({"MPI_LOCALNRANKS": "4"}, 16).threads == dict.fromkeys(POOL_VARIABLES, "4")
    assert plan_threads({"MPI_LOCALNRANKS": "4"}, 2).threads == dict.fromkeys(POOL_VARIABLES, "1")
    alone = plan_threads({}, 16)
    assert alone.threads == dict.fromkeys(POOL_VARIABLES, "16") and alone.launcher is None
    assert "no MPI or Slurm launcher" in alone.describe()


def test_srun_gives_each_task_its_cpus_per_task():
    environ = {"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_CPUS_PER_TASK": "3"}
    assert plan_threads(environ, 8).threads == dict.fromkeys(POOL_VARIABLES, "3")


def test_the_users_values_win_and_omp_num_threads_speaks_for_every_pool():
    plan = plan_threads({"MPI_LOCALNRANKS": "2", "OMP_NUM_THREADS": "3", "NUMBA_NUM_THREADS": "5"}, 8)
    assert plan.threads == {"OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3", "MKL_NUM_THREADS": "3",
                            "NUMBA_NUM_THREADS": "5"}
    assert plan.chosen_by_user == ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")
    only_numba = plan_threads({"MPI_LOCALNRANKS": "2", "NUMBA_NUM_THREADS": "2"}, 8).threads
    assert only_numba == {"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "4", "MKL_NUM_THREADS": "4",
                          "NUMBA_NUM_THREADS": "2"}


def test_values_an_ancestor_process_sized_are_not_taken_for_the_users():
    """A script that imports mpitrain (1 rank: every core) and then starts mpiexec: its ranks size their own pools."""
    parent = {}
    size_thread_pools(parent)
    assert parent["NUMBA_NUM_THREADS"] == str(CORES) and SIZED_MARK in parent
    child = {**parent, "MPI_LOCALNRANKS": "2", "OMP_NUM_THREADS": "7"}  # the user pins OMP in the child's shell
    size_thread_pools(child)
    assert child["NUMBA_NUM_THREADS"] == child["OPENBLAS_NUM_THREADS"] == "7"
    assert child[SIZED_MARK] == "OPENBLAS_NUM_THREADS=7,MKL_NUM_THREADS=7,NUMBA_NUM_THREADS=7"
    grandchild = {**child, "MPI_LOCALNRANKS": "2"}
    del grandchild["OMP_NUM_THREADS"]
    size_thread_pools(grandchild)
    assert grandchild["NUMBA_NUM_THREADS"] == grandchild["OMP_NUM_THREADS"] == str(max(1, CORES // 2))


def test_a_launcher_mpitrain_does_not_know_is_caught_against_mpi_and_the_pools_lowered(caplog):
    import numba
    before = numba.get_num_threads()
    plan = ThreadPlan(1, None, 2, dict.fromkeys(POOL_VARIABLES, "2"), ())
    try:
        check_ranks_on_node(plan, 2)
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)
    assert "2 ranks share this node but the launcher's environment did not say so" in caplog.text
    assert "NUMBA_NUM_THREADS=1" in caplog.text


# -- real launchers, no thread variables --

@pytest.mark.parametrize("started_by", ["a shell", "a script that imported mpitrain"])
def test_two_ranks_under_mpiexec_each_get_half_the_cores(started_by):
    parent = bare_env()
    if started_by != "a shell":  # as a benchmark or a driver script starts its mpiexec
        size_thread_pools(parent)
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, THREAD_POOLS], capture_output=True, text=True,
                            timeout=120, env=parent)
    assert result.returncode == 0, result.stderr
    ranks = pools_of(result.stdout)
    assert len(ranks) == 2
    for pool in ranks:
        assert pool["launcher"] == "MPICH Hydra" and pool["ranks_on_node"] == 2
        assert_every_pool(pool, max(1, CORES // 2))


@pytest.mark.parametrize("launch", [[MPIEXEC, "-n", "1"], []], ids=["mpiexec -n 1", "no launcher"])
def test_one_rank_alone_uses_every_core(launch):
    result = subprocess.run([*launch, sys.executable, THREAD_POOLS], capture_output=True, text=True, timeout=120,
                            env=bare_env())
    assert result.returncode == 0, result.stderr
    (pool,) = pools_of(result.stdout)
    assert pool["ranks_on_node"] == 1
    assert_every_pool(pool, CORES)


def test_numba_imported_before_mpitrain_gets_a_warning_naming_the_fix_and_blas_is_lowered():
    script = ("import numba, numpy, json\nimport mpitrain\nfrom threadpoolctl import threadpool_info\n"
              "print(json.dumps([p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas']))")
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env=bare_env())
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("numba was imported before mpitrain") == 2, result.stderr
    assert f"NUMBA_NUM_THREADS={max(1, CORES // 2)}" in result.stderr
    assert all(n == max(1, CORES // 2) for line in result.stdout.split() for n in json.loads(line)), result.stdout


def test_spark_executors_that_import_mpitrain_run_one_thread_per_task(tmp_path):
    """spark-submit of a job whose tasks import mpitrain.etl, as the ETL's and the scoring's tasks do: Spark
    gives its Python workers OMP_NUM_THREADS = spark.task.cpus (1), which every pool follows."""
    job = tmp_path / "job.py"
    job.write_text(
        "import json\nfrom pyspark.sql import SparkSession\n"
        "def pools(_):\n"
        "    import runpy\n"
        "    import mpitrain.etl  # noqa: F401\n"
        f"    yield json.dumps(runpy.run_path({THREAD_POOLS!r})['pools']())\n"
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
