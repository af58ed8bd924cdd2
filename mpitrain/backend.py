"""The array module `xp` (numpy or cupy), chosen once per run, and host/device copies.

Layers and updaters are written once against `xp`; nothing tests `if gpu:` inside them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from mpitrain.errors import ConfigError

BACKENDS = ("numpy", "cupy")


@dataclass(frozen=True)
class Backend:
    """An array module plus the copies between it and host memory."""

    name: str
    xp: object

    def to_device(self, array):
        return self.xp.asarray(array)


def create_backend(name: str, local_rank: int = 0, local_size: int = 1) -> Backend:
    """Build the backend `name`; with cupy, rank `local_rank` on a node takes GPU `local_rank % n_gpus`."""
    if name == "numpy":
        _share_cores(local_size)
        return Backend("numpy", np)
    if name == "cupy":
        import cupy
        if not cupy.is_available():
            raise ConfigError("backend: 'cupy' needs a CUDA GPU, and none is available; use backend: numpy")
        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
        return Backend("cupy", cupy)
    raise ConfigError(f"backend: {name!r}, expected one of {BACKENDS}")


def _share_cores(local_size: int) -> None:
    """Give each of the node's ranks its share of the cores for BLAS and numba, unless the user chose.

    Several ranks per node each running one thread per core oversubscribe the node and run
    slower than one thread each; OMP_NUM_THREADS / NUMBA_NUM_THREADS set by the user win.
    """
    if local_size <= 1:
        return
    share = max(1, (os.cpu_count() or 1) // local_size)
    if "NUMBA_NUM_THREADS" not in os.environ:
        import numba
        numba.set_num_threads(min(share, numba.config.NUMBA_NUM_THREADS))
    if "OMP_NUM_THREADS" not in os.environ and "OPENBLAS_NUM_THREADS" not in os.environ:
        from threadpoolctl import threadpool_limits
        threadpool_limits(share)


def array_module(array):
    """numpy or cupy, whichever owns `array` (cupy.get_array_module without importing cupy for numpy)."""
    if isinstance(array, np.ndarray):
        return np
    import cupy
    return cupy.get_array_module(array)


def to_host(array) -> np.ndarray:
    """A host (numpy) copy of a cupy array; numpy arrays pass through."""
    return array.get() if hasattr(array, "get") else np.asarray(array)
