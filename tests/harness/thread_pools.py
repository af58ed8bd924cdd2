"""The thread pools a process got, printed as one JSON line: run as `python -m mpitrain.testing.thread_pools`
under a launcher (mpiexec, srun, a Spark task) with no thread variables, by the thread tests.

`import mpitrain` comes first, as in a user's script; then numba's parallel kernels start their
pool (the count is what a kernel launch would use) and threadpoolctl lists every BLAS and OpenMP pool.
"""
import json
import os
import sys

import mpitrain  # noqa: F401  (sizes the pools: it must come first)

# isort: split
import numba
import numpy as np
from threadpoolctl import threadpool_info

MODULE = ["-m", "mpitrain.testing.thread_pools"]  # the command line after the Python executable


def pools() -> dict:
    """numba's pool (its size and the threads a kernel uses) and every pool threadpoolctl finds (BLAS, OpenMP)."""
    @numba.njit(parallel=True)
    def touch(a):
        for i in numba.prange(a.size):
            a[i] += 1
    touch(np.zeros(4))  # starts numba's pool
    return {"cores": len(os.sched_getaffinity(0)), "numba_pool": numba.config.NUMBA_NUM_THREADS,
            "numba_threads": numba.get_num_threads(), "numba_layer": numba.threading_layer(),
            "pools": [[pool["user_api"], pool["internal_api"], pool["num_threads"]] for pool in threadpool_info()],
            "launcher": mpitrain.THREADS.launcher, "ranks_on_node": mpitrain.THREADS.ranks_on_node}


def bare_env(**extra) -> dict:
    """This process's environment without any thread variable, as a user's shell has it."""
    from mpitrain.base.threads import with_pools
    return {**with_pools(os.environ, {}), "PYTHONUNBUFFERED": "1", **extra}


def pools_of(stdout: str) -> list[dict]:
    """The JSON objects the processes printed (the ranks' lines may run together)."""
    decoder, found, at = json.JSONDecoder(), [], stdout.find("{")
    while at >= 0:
        value, end = decoder.raw_decode(stdout, at)
        found.append(value)
        at = stdout.find("{", end)
    return found


def assert_every_pool(pool: dict, threads: int) -> None:
    """numba's pool and every pool threadpoolctl found in one process have `threads` threads."""
    assert pool["numba_pool"] == pool["numba_threads"] == threads, pool
    assert pool["pools"] and all(n == threads for _, _, n in pool["pools"]), pool


if __name__ == "__main__":
    print(json.dumps(pools()), file=sys.stdout, flush=True)
