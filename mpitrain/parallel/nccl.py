"""Device buffers' Allreduce and Bcast through NCCL (cupy's binding) beside MPI: `comm.device_collectives`.

    if wants_nccl(setting, comm, device_count(), nccl_available()):   # a collective: the job decides as one
        comm = NcclCommunicator(...)                                   # Communicator.for_backend picks it

- `mpi` never uses NCCL; `nccl` insists, and the job stops with one error naming the key and why not (cupy has no
  NCCL, or a node runs more ranks than it has GPUs: ranks take GPU `local_rank % count`, so two would share one,
  which NCCL refuses); `auto` takes NCCL only where nothing stands in its way on any rank.
- NCCL's unique id is made on rank 0 and broadcast over MPI as int32s (`unique_id_message`: nothing pickled), then
  every rank joins the NCCL communicator of the job's ranks.
- Allreduce, its posted form (the overlapped buckets) and Bcast of device (cupy) buffers are enqueued on cupy's
  current stream: the kernels after them on that stream read the sums, and a posted one needs no request to
  wait for. NCCL's ring gives every rank the same bits, so replicas stay identical. Host buffers, other dtypes
  and the other collectives (Allgatherv, Alltoallv: sparse exchanges, codecs) go through MPI as before, staged
  or not (`NcclStagedCommunicator` when MPI cannot read device memory).

What a GPU run checks: tests/system/test_gpu.py's NCCL test on one rank, and the GPU check's runs (docs/gpus.md).
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import ConfigError
from mpitrain.parallel.comm import NO_REQUEST, Communicator, StagedCommunicator


def nccl_available() -> bool:
    """Whether cupy is installed with NCCL."""
    try:
        from cupy.cuda import nccl
    except ImportError:
        return False
    return bool(getattr(nccl, "available", False))


def device_count() -> int:
    """The GPUs this rank sees."""
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


def why_not_nccl(local_size: int, devices: int, available: bool) -> str | None:
    """What keeps NCCL from this rank's node, or None: no NCCL in cupy, or fewer GPUs than ranks on the node."""
    if not available:
        return "cupy has no NCCL (pip install nvidia-nccl-cu13, or a cupy built with NCCL)"
    if local_size > devices:
        return (f"{local_size} ranks on a node with {devices} GPU(s) share GPUs (a rank takes GPU local_rank % "
                f"{devices}), and NCCL needs a GPU per rank")
    return None


def wants_nccl(setting: str, comm, devices: int, available: bool) -> bool:
    """Whether the job's device collectives go through NCCL under `comm.device_collectives: setting`, every rank
    answering alike. A collective (one allgather): `nccl` where any rank cannot is a ConfigError on every rank,
    naming the first such rank's reason."""
    if setting == "mpi":
        return False
    reasons = [(rank, reason) for rank, reason in
               enumerate(comm.allgather_obj(why_not_nccl(comm.local_size, devices, available))) if reason]
    if reasons and setting == "nccl":
        rank, reason = reasons[0]
        raise ConfigError(f"comm.device_collectives: 'nccl', but {reason} (seen on rank {rank}); use auto or mpi")
    return not reasons


def unique_id_message(uid) -> np.ndarray:
    """NCCL's unique id as int32s for an MPI Bcast: [1 if bytes (CuPy 14) else 0 (a tuple of signed chars, CuPy 13),
    then its 128 bytes]; zeros where `uid` is None (the ranks that receive it)."""
    message = np.zeros(129, np.int32)
    if uid is not None:
        message[0] = isinstance(uid, (bytes, bytearray))
        message[1:] = list(uid)
    return message


def unique_id_of(message: np.ndarray):
    """The unique id a `unique_id_message` carries, in the form this CuPy made it."""
    return bytes(message[1:].astype(np.uint8)) if message[0] else tuple(int(b) for b in message[1:])


_NCCL_TYPES = {np.dtype(np.float32): "NCCL_FLOAT32", np.dtype(np.float64): "NCCL_FLOAT64",
               np.dtype(np.int32): "NCCL_INT32", np.dtype(np.int64): "NCCL_INT64"}


class NcclCollectives:
    """Allreduce, posted Allreduce and Bcast of device buffers through NCCL; the rest as the MPI communicator it
    is mixed into (module docstring)."""

    def __init__(self, mpi_comm=None, backend=None, cuda_aware: bool = False):
        super().__init__(mpi_comm, backend, cuda_aware)
        from cupy.cuda import nccl
        self._nccl_module = nccl
        message = unique_id_message(nccl.get_unique_id() if self.rank == 0 else None)
        self.bcast_(message)  # a host buffer: MPI's, staged or not
        uid = unique_id_of(message)
        self.nccl = nccl.NcclCommunicator(self.size, uid, self.rank)
        self.bytes_sent = 0  # the id is set-up, not the job's traffic

    @property
    def device_collectives(self) -> str:
        return "nccl"

    def _nccl_type(self, buf):
        """NCCL's type of a device buffer it takes, else None (host buffers, dtypes NCCL does not sum)."""
        if isinstance(buf, np.ndarray) or np.dtype(buf.dtype) not in _NCCL_TYPES:
            return None
        return getattr(self._nccl_module, _NCCL_TYPES[np.dtype(buf.dtype)])

    @staticmethod
    def _stream() -> int:
        import cupy
        return cupy.cuda.get_current_stream().ptr

    def _allreduce(self, buf) -> None:
        kind = self._nccl_type(buf)
        if kind is None:
            return super()._allreduce(buf)
        self.nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, kind, self._nccl_module.NCCL_SUM, self._stream())

    def _iallreduce(self, buf) -> tuple:
        """Enqueued on the stream like the blocking one: nothing to wait for but the stream itself."""
        if self._nccl_type(buf) is None:
            return super()._iallreduce(buf)
        self._allreduce(buf)
        return NO_REQUEST, None

    def _bcast(self, buf, root: int) -> None:
        kind = self._nccl_type(buf)
        if kind is None:
            return super()._bcast(buf, root)
        self.nccl.bcast(buf.data.ptr, buf.size, kind, root, self._stream())


class NcclCommunicator(NcclCollectives, Communicator):
    """NCCL for device Allreduce and Bcast, a CUDA-aware MPI for the rest."""


class NcclStagedCommunicator(NcclCollectives, StagedCommunicator):
    """NCCL for device Allreduce and Bcast, the rest staged through host memory for an MPI that cannot read device
    memory."""
