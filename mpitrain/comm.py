"""The only module that imports mpi4py.

Array calls (`allreduce_`, `allgatherv`, `bcast_`) move flat buffers without pickling;
object calls (`bcast_obj`, `gather_obj`, `allgather_obj`) pickle small Python values.
Every array call counts the bytes this rank contributes, so each sync mode can report
bytes sent per rank per step on the same scale.
"""
from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from mpitrain.errors import MpitrainError

_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
              np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T}


class Communicator:
    """World rank/size, node-local rank, and the collectives mpitrain uses, on one MPI communicator."""

    def __init__(self, mpi_comm=None):
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        if mpi_comm is None:
            _check_srun_world(self.size)
        node = self.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self.bytes_sent = 0

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def allreduce_(self, buf) -> None:
        """Sum a contiguous array over all ranks, in place."""
        _synchronize_device(buf)
        self.bytes_sent += buf.nbytes
        self.mpi.Allreduce(MPI.IN_PLACE, [buf, _mpi_type(buf)], op=MPI.SUM)

    def average_(self, buf) -> None:
        """Average a contiguous array over all ranks, in place."""
        self.allreduce_(buf)
        buf /= self.size

    def bcast_(self, buf, root: int = 0) -> None:
        """Broadcast a contiguous array from `root`, in place."""
        _synchronize_device(buf)
        if self.rank == root:
            self.bytes_sent += buf.nbytes * (self.size - 1)
        self.mpi.Bcast([buf, _mpi_type(buf)], root=root)

    def allgatherv(self, message: np.ndarray) -> list[np.ndarray]:
        """Exchange variable-length 1-D messages: Allgather of sizes, then Allgatherv of bodies."""
        _synchronize_device(message)
        counts = np.zeros(self.size, dtype=np.int64)
        self.mpi.Allgather(np.array([message.size], dtype=np.int64), counts)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out = np.empty(int(counts.sum()), dtype=message.dtype)
        self.bytes_sent += 8 + message.nbytes
        self.mpi.Allgatherv([message, _mpi_type(message)], [out, counts, offsets, _mpi_type(out)])
        return [out[o:o + c] for o, c in zip(offsets, counts)]

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
            MPI.COMM_WORLD.Abort(1)
        os._exit(1)

    sys.excepthook = hook
