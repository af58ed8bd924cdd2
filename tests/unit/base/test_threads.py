"""Thread pools sized before they start (mpitrain/base/threads.py), from the environment alone: the ranks
on the node by launcher, each rank's share, the user's values, values an ancestor sized. The pools inside
real ranks: tests/mpi/test_thread_pools.py, tests/system/test_thread_pools_spark.py and the srun test."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mpitrain.base.threads import (
    POOL_VARIABLES,
    SIZED_MARK,
    ThreadPlan,
    check_ranks_on_node,
    plan_threads,
    ranks_on_node,
    size_thread_pools,
    users_environment,
)

CORES = len(os.sched_getaffinity(0))


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


def test_a_users_value_that_is_no_count_of_threads_is_replaced_by_the_share_and_named():
    """Before: NUMBA_NUM_THREADS=0 (or -3) kept, so numba's import raised `ValueError: Number of threads specified
    must be > 0.` on every rank: a traceback, exit 1."""
    plan = plan_threads({"MPI_LOCALNRANKS": "2", "NUMBA_NUM_THREADS": "0", "OMP_NUM_THREADS": "abc",
                         "OPENBLAS_NUM_THREADS": "-3", "MKL_NUM_THREADS": "2"}, 8)
    assert plan.threads == {"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "4", "MKL_NUM_THREADS": "2",
                            "NUMBA_NUM_THREADS": "4"}
    assert plan.chosen_by_user == ("MKL_NUM_THREADS",)
    assert plan.describe().endswith("; set by you: MKL_NUM_THREADS; ignored: OMP_NUM_THREADS=abc, "
                                    "OPENBLAS_NUM_THREADS=-3, NUMBA_NUM_THREADS=0 (expected a whole number of "
                                    "threads >= 1)")
    environ = {"NUMBA_NUM_THREADS": "0"}
    size_thread_pools(environ)
    assert environ["NUMBA_NUM_THREADS"] == str(CORES) and "NUMBA_NUM_THREADS" in environ[SIZED_MARK]
    started = subprocess.run([sys.executable, "-c", "import mpitrain, numba; print(numba.config.NUMBA_NUM_THREADS)"],
                             env={**os.environ, "NUMBA_NUM_THREADS": "0"}, capture_output=True, text=True, timeout=60)
    assert started.returncode == 0 and started.stdout.strip() == str(CORES), started.stderr


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




def test_the_users_environment_is_what_remains_without_mpitrains_own_values():
    """A benchmark that imported mpitrain starts PyTorch's peer from the environment its user set."""
    environ = {"PATH": "/bin", "OMP_NUM_THREADS": "3"}
    size_thread_pools(environ)
    assert environ["NUMBA_NUM_THREADS"] == "3" and SIZED_MARK in environ
    assert users_environment(environ) == {"PATH": "/bin", "OMP_NUM_THREADS": "3"}
    bare = {"PATH": "/bin"}
    size_thread_pools(bare)
    assert users_environment(bare) == {"PATH": "/bin"}
