"""Every thread pool inside real ranks under mpiexec, with no thread variables set: numba's pool and every pool
threadpoolctl reports (OpenBLAS, numpy's and scipy's, and GNU OpenMP), read by mpitrain.testing.thread_pools."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mpitrain.base.threads import size_thread_pools
from mpitrain.testing.launch import MPIEXEC
from mpitrain.testing.thread_pools import MODULE as THREAD_POOLS
from mpitrain.testing.thread_pools import assert_every_pool, bare_env, pools_of

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("started_by", ["a shell", "a script that imported mpitrain"])
def test_two_ranks_under_mpiexec_each_get_half_the_cores(started_by):
    parent = bare_env()
    if started_by != "a shell":  # as a benchmark or a driver script starts its mpiexec
        size_thread_pools(parent)
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, *THREAD_POOLS], capture_output=True, text=True,
                            timeout=120, env=parent)
    assert result.returncode == 0, result.stderr
    ranks = pools_of(result.stdout)
    assert len(ranks) == 2
    for pool in ranks:
        assert pool["launcher"] == "MPICH Hydra" and pool["ranks_on_node"] == 2
        assert_every_pool(pool, max(1, CORES // 2))


@pytest.mark.parametrize("launch", [[MPIEXEC, "-n", "1"], []], ids=["mpiexec -n 1", "no launcher"])
def test_one_rank_alone_uses_every_core(launch):
    result = subprocess.run([*launch, sys.executable, *THREAD_POOLS], capture_output=True, text=True, timeout=120,
                            env=bare_env())
    assert result.returncode == 0, result.stderr
    (pool,) = pools_of(result.stdout)
    assert pool["ranks_on_node"] == 1
    assert_every_pool(pool, CORES)


def test_numba_imported_before_mpitrain_gets_a_warning_naming_the_fix_and_blas_is_lowered():
    script = ("import numba, numpy, json\nimport mpitrain\nfrom threadpoolctl import threadpool_info\n"
              "print(json.dumps({'blas': [p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas']}))")
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env=bare_env())
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("numba was imported before mpitrain") == 2, result.stderr
    assert f"NUMBA_NUM_THREADS={max(1, CORES // 2)}" in result.stderr
    ranks = pools_of(result.stdout)
    assert len(ranks) == 2 and all(n == max(1, CORES // 2) for rank in ranks for n in rank["blas"]), result.stdout



def test_numpy_imported_before_mpitrain_still_gets_every_pool_sized_without_a_warning():
    """numpy's OpenBLAS started its pool before mpitrain: it is lowered (threadpoolctl); numba, imported after
    mpitrain, starts its pool at the right size."""
    script = ("import numpy\nimport mpitrain\nimport json\nfrom mpitrain.testing.thread_pools import pools\n"
              "print(json.dumps(pools()))")
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env=bare_env())
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    ranks = pools_of(result.stdout)
    assert len(ranks) == 2
    for pool in ranks:
        assert_every_pool(pool, max(1, CORES // 2))
