"""The array module `xp` (numpy or cupy), chosen once per run, and the counted copies between host and device.

Layers and updaters are written once against `xp`; nothing tests `if gpu:` inside them.
Every copy the trainer makes between host and device goes through a `Backend` method,
which counts it in `Backend.transfers`. The numpy backend counts the same calls (they cost
nothing there), so tests on the CPU check where the GPU path would cross the bus.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import numpy as np

from mpitrain.base.errors import ConfigError
from mpitrain.base.threads import check_ranks_on_node, thread_plan

log = logging.getLogger(__name__)

BACKENDS = ("auto", "numpy", "cupy")


@dataclass
class Transfers:
    """Copies host -> device (`to_device`) and device -> host (`to_host`), and their bytes.

    Thread-safe: the batch prefetch thread uploads while the training thread reads.
    """

    to_device: int = 0
    to_device_bytes: int = 0
    to_host: int = 0
    to_host_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, direction: str, nbytes: int) -> None:
        with self.lock:
            setattr(self, direction, getattr(self, direction) + 1)
            setattr(self, direction + "_bytes", getattr(self, direction + "_bytes") + nbytes)

    def to_dict(self) -> dict:
        return {"to_device": self.to_device, "to_device_bytes": self.to_device_bytes,
                "to_host": self.to_host, "to_host_bytes": self.to_host_bytes}


@dataclass(frozen=True)
class Backend:
    """An array module, its device, and the counted copies between it and host memory."""

    name: str
    xp: object
    device: int | None = None  # the GPU this rank uses; None on the CPU
    transfers: Transfers = field(default_factory=Transfers, compare=False)

    @property
    def on_gpu(self) -> bool:
        return self.device is not None

    def to_device(self, array):
        """A backend array holding `array` (a host array), on this rank's GPU from any thread.

        (The current CUDA device is per thread: the batch prefetch thread would otherwise
        allocate on GPU 0.)
        """
        array = np.asarray(array)
        self.transfers.count("to_device", array.nbytes)
        if self.on_gpu:
            with self.xp.cuda.Device(self.device):
                return self.xp.asarray(array)
        return array

    def to_host(self, array) -> np.ndarray:
        """A host (numpy) copy of a backend array, or of a 0-d device scalar."""
        host = self.xp.asnumpy(array) if self.on_gpu else np.array(array)
        self.transfers.count("to_host", host.nbytes)
        return host

    def copy_to_host(self, array, out: np.ndarray) -> None:
        """Copy a backend array into the host array `out` (e.g. a pinned staging buffer)."""
        self.transfers.count("to_host", out.nbytes)
        if self.on_gpu:
            self.xp.asnumpy(array, out=out)
        else:
            np.copyto(out, array)

    def copy_to_device(self, host: np.ndarray, out) -> None:
        """Copy the host array `host` into the backend array `out`."""
        self.transfers.count("to_device", host.nbytes)
        if self.on_gpu:
            with self.xp.cuda.Device(self.device):  # from any thread (the batch prefetch thread too)
                out.set(host)
        else:
            np.copyto(out, host)

    def empty_pinned(self, size: int, dtype) -> np.ndarray:
        """A host buffer for staging: page-locked on the GPU path, so copies run at full bus speed."""
        if self.on_gpu:
            import cupyx
            return cupyx.empty_pinned(size, dtype=dtype)
        return np.empty(size, dtype=dtype)


def create_backend(name: str, local_rank: int = 0, local_size: int = 1) -> Backend:
    """Build the backend `name` (auto: cupy when a GPU is available, else numpy).

    With cupy, rank `local_rank` on a node takes GPU `local_rank % n_gpus`, made current
    before anything is allocated (for cupy and for the numba-CUDA kernels alike). With numpy,
    the thread pools sized at import (`mpitrain.base.threads`) are logged and checked against the
    `local_size` ranks MPI found on this node.
    """
    if name == "auto":
        name = "cupy" if gpu_available() else "numpy"
    if name == "numpy":
        log.info(thread_plan().describe())
        check_ranks_on_node(thread_plan(), local_size)
        return Backend("numpy", np)
    if name == "cupy":
        if not gpu_available():
            raise ConfigError("backend: 'cupy' needs a CUDA GPU and cupy (pip install 'mpitrain[gpu]'), and "
                              "none is available; use backend: numpy or auto")
        import cupy
        device = local_rank % cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(device).use()
        from numba import cuda
        cuda.select_device(device)
        return Backend("cupy", cupy, device)
    raise ConfigError(f"backend: {name!r}, expected one of {BACKENDS}")


def gpu_available() -> bool:
    """Whether cupy is installed and sees a CUDA GPU."""
    try:
        import cupy
    except ImportError:
        return False
    return bool(cupy.is_available())
