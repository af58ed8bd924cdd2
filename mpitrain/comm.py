"""The only module that imports mpi4py.

Array calls (`allreduce_`, `allgatherv`, `bcast_`) move flat buffers without pickling;
object calls (`bcast_obj`, `gather_obj`, `allgather_obj`) pickle small Python values.
Every array call counts the bytes this rank contributes, so each sync mode can report
bytes sent per rank per step on the same scale.

Device (cupy) buffers go to MPI directly when the MPI library is CUDA-aware; otherwise
`HostStaging` copies them device -> pinned host -> MPI -> device, and counts the copies.
Either way the current CUDA stream is synchronized before MPI reads a buffer.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
import traceback
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from mpitrain.errors import MpitrainError

_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
              np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T}


class Communicator:
    """World rank/size, node-local rank, and the collectives mpitrain uses, on one MPI communicator."""

    def __init__(self, mpi_comm=None, staging: HostStaging | None = None):
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        if mpi_comm is None:
            _check_srun_world(self.size)
        node = self.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self.bytes_sent = 0
        self.staging = staging
        self.cuda_aware = False  # set by use_backend

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def use_backend(self, backend, cuda_aware="auto") -> None:
        """Collectives on `backend`'s arrays: staged through pinned host memory when they live on a
        GPU and MPI cannot read device memory (`cuda_aware`: auto asks MPI, true/false overrides)."""
        self.cuda_aware = cuda_aware_mpi() if cuda_aware == "auto" else bool(cuda_aware)
        self.staging = HostStaging(backend) if backend.on_gpu and not self.cuda_aware else None

    def allreduce_(self, buf) -> None:
        """Sum a contiguous array over all ranks, in place."""
        _synchronize_device(buf)
        self.bytes_sent += buf.nbytes
        if not self._staged(buf):
            self.mpi.Allreduce(MPI.IN_PLACE, [buf, _mpi_type(buf)], op=MPI.SUM)
            return
        host = self.staging.to_host(buf)
        self.mpi.Allreduce(MPI.IN_PLACE, [host, _mpi_type(host)], op=MPI.SUM)
        self.staging.to_device(host, buf)

    def average_(self, buf) -> None:
        """Average a contiguous array over all ranks, in place."""
        self.allreduce_(buf)
        buf /= self.size

    def bcast_(self, buf, root: int = 0) -> None:
        """Broadcast a contiguous array from `root`, in place."""
        _synchronize_device(buf)
        if self.rank == root:
            self.bytes_sent += buf.nbytes * (self.size - 1)
        if not self._staged(buf):
            self.mpi.Bcast([buf, _mpi_type(buf)], root=root)
            return
        host = self.staging.to_host(buf) if self.rank == root else self.staging.pinned("send", buf.dtype, buf.size)
        self.mpi.Bcast([host, _mpi_type(host)], root=root)
        if self.rank != root:
            self.staging.to_device(host, buf)

    def allgatherv(self, message) -> list:
        """Exchange variable-length 1-D messages: Allgather of sizes, then Allgatherv of bodies.

        The messages come back as views into one array on the device `message` is on.
        """
        _synchronize_device(message)
        counts = np.zeros(self.size, dtype=np.int64)
        self.mpi.Allgather(np.array([message.size], dtype=np.int64), counts)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.bytes_sent += 8 + message.nbytes
        total = int(counts.sum())
        if not self._staged(message):
            out = _empty_like(message, total)
            self.mpi.Allgatherv([message, _mpi_type(message)], [out, counts, offsets, _mpi_type(out)])
        else:
            send, received = self.staging.to_host(message), self.staging.pinned("recv", message.dtype, total)
            self.mpi.Allgatherv([send, _mpi_type(send)], [received, counts, offsets, _mpi_type(received)])
            out = _empty_like(message, total)
            self.staging.to_device(received, out)
        return [out[o:o + c] for o, c in zip(offsets, counts)]

    def _staged(self, buf) -> bool:
        return self.staging is not None and self.staging.stages(buf)

    def bcast_obj(self, value, root: int = 0):
        return self.mpi.bcast(value, root=root)

    def gather_obj(self, value, root: int = 0):
        return self.mpi.gather(value, root=root)

    def allgather_obj(self, value) -> list:
        return self.mpi.allgather(value)

    def max(self, value: float) -> float:
        return self.mpi.allreduce(value, op=MPI.MAX)

    def barrier(self) -> None:
        self.mpi.Barrier()

    def abort(self) -> None:
        """End every rank of the job now (MPI_Abort on COMM_WORLD)."""
        MPI.COMM_WORLD.Abort(1)

    @contextmanager
    def agreed_errors(self):
        """Make a user error seen on some ranks (a bad shard of theirs) an error on every rank.

        A collective: every rank must enter and leave the block. The first failing rank's
        message is raised everywhere, so all ranks exit non-zero instead of waiting in the
        next collective for the one that failed.
        """
        error = None
        try:
            yield
        except MpitrainError as e:
            error = e
        failures = [(rank, message) for rank, message in enumerate(self.allgather_obj(error and str(error)))
                    if message is not None]
        if failures:
            if error is not None:
                raise error
            rank, message = failures[0]
            raise MpitrainError(f"{message} (seen on rank {rank})")


def _check_srun_world(size: int) -> None:
    """Refuse to start when srun started several tasks but MPI made each one a world of its own.

    That is what an srun `--mpi` plugin the MPI library does not speak gives: every task
    would train alone and all of them would write the same run directory.
    """
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))
    if size == 1 and tasks > 1:
        raise MpitrainError(f"srun started {tasks} tasks, but each sees an MPI world of 1 rank: srun's MPI plugin "
                            f"(--mpi={os.environ.get('SLURM_MPI_TYPE', 'none')}) does not match this MPI library; "
                            "use srun --mpi=pmi2 for MPICH, --mpi=pmix for Open MPI, or mpiexec")


class HostStaging:
    """Device -> pinned host -> MPI -> device, for an MPI that cannot read device memory.

    Copies go through the backend (`copy_to_host`, `copy_to_device`), which counts them; the
    pinned buffers are kept and reused, one per role ("send", "recv") and dtype, grown when a
    larger one is needed. With the numpy backend the same code runs with plain host buffers,
    so the staging path is tested without a GPU.
    """

    def __init__(self, backend):
        self.backend = backend
        self.buffers = {}
        self.copies, self.bytes = 0, 0

    def stages(self, buf) -> bool:
        """Device buffers are staged; host ones too with the numpy backend (the tests' way to run this path)."""
        return not (self.backend.on_gpu and isinstance(buf, np.ndarray))

    def pinned(self, role: str, dtype, size: int) -> np.ndarray:
        """A reused host buffer of `size` elements for `role`."""
        key = (role, np.dtype(dtype))
        buffer = self.buffers.get(key)
        if buffer is None or buffer.size < size:  # grown to twice its size at least: few pinned allocations
            grown = max(size, 2 * buffer.size if buffer is not None else 0)
            buffer = self.buffers[key] = self.backend.empty_pinned(grown, dtype)
        return buffer[:size]

    def to_host(self, buf) -> np.ndarray:
        """A host copy of `buf`, in the "send" buffer."""
        host = self.pinned("send", buf.dtype, buf.size)
        self.backend.copy_to_host(buf.reshape(-1), host)
        self._count(host.nbytes)
        return host

    def to_device(self, host: np.ndarray, buf) -> None:
        """Copy `host` back into the device buffer `buf`."""
        self.backend.copy_to_device(host, buf.reshape(-1))
        self._count(host.nbytes)

    def _count(self, nbytes: int) -> None:
        self.copies += 1
        self.bytes += nbytes


def cuda_aware_mpi() -> bool:
    """Whether the MPI library mpi4py loaded reads and writes device memory itself.

    Asks the library's `int MPIX_Query_cuda_support(void)` (Open MPI, MVAPICH2 and MPICH
    export it; 1 when built with CUDA and enabled at run time). mpi4py has no binding for
    it, so it is looked up with ctypes in the loaded libmpi; False when there is none.
    """
    for path in _loaded_mpi_libraries():
        query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
        if query is not None:
            query.restype = ctypes.c_int
            return query() == 1
    return False


def _loaded_mpi_libraries() -> list[str]:
    """Paths of the MPI libraries mapped into this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libmpi" in line and ".so" in line}
    except OSError:
        return []
    return sorted(paths)


def _empty_like(message, size: int):
    from mpitrain.backend import array_module
    return array_module(message).empty(size, dtype=message.dtype)


def _mpi_type(buf):
    try:
        return _MPI_TYPES[np.dtype(buf.dtype)]
    except KeyError:
        raise TypeError(f"no MPI type for dtype {buf.dtype}") from None


def _synchronize_device(buf) -> None:
    """Finish pending GPU work on `buf` before MPI reads it (a no-op for numpy arrays)."""
    if not isinstance(buf, np.ndarray):
        import cupy
        cupy.cuda.get_current_stream().synchronize()


def install_abort_hook() -> None:
    """Turn an uncaught exception on any rank into MPI_Abort.

    Without this, the failing rank exits while the others wait forever in their next
    collective: the job hangs until the wall-clock limit instead of failing at once.
    """
    def hook(kind, value, tb):
        rank = MPI.COMM_WORLD.Get_rank()
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.rstrip().splitlines()))
        sys.stderr.flush()
        if MPI.COMM_WORLD.Get_size() > 1:
            time.sleep(0.5)  # let the launcher forward the traceback: Abort tears the job down, pipes and all
            MPI.COMM_WORLD.Abort(1)
        os._exit(1)

    sys.excepthook = hook
