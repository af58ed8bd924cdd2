"""Prints, as one JSON line per process, the thread pools this process got: run under a launcher
(mpiexec, srun, a Spark task) with no thread variables, by tests/test_threads.py.

`import mpitrain` comes first, as in a user's script; then numba's parallel kernels start their
pool (the count is what a kernel launch would use) and threadpoolctl lists every BLAS and OpenMP pool.
"""
import json
import os
import sys

import mpitrain  # noqa: F401  (sizes the pools: it must come first)
import numba
import numpy as np
from threadpoolctl import threadpool_info


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


if __name__ == "__main__":
    print(json.dumps(pools()), file=sys.stdout, flush=True)
