"""The collectives mpitrain uses, on one MPI communicator; with `mpitrain.parallel.launch`, the only module that imports mpi4py.

    comm = Communicator()                           # COMM_WORLD: rank, size, node-local rank
    comm = comm.for_backend(backend, cuda_aware, device_collectives)   # the variant for the backend's arrays

Array calls (`allreduce_`, `average_`, `bcast_`, `allgather_counts`, `allgatherv`,
`alltoallv`, the point-to-point `sendrecv`, the host-only `gather_host` and `scatter_host`, and the non-blocking
`iallreduce_` with `progress` and `complete`) move flat buffers without pickling; object
calls (`bcast_obj`, `gather_obj`, `allgather_obj`, `max`) pickle small Python values. Every
array call counts the bytes this rank contributes, so each sync mode reports bytes sent per
rank per step on the same scale, and the time it took: `mpi_seconds`, the time spent inside
MPI (what communication cost this rank), and `comm_seconds`, the time from a collective's
start to its end (the same for blocking calls; for posted ones, from the first post to the
completion, partly hidden behind what the rank computed meanwhile).

Every method here is a collective unless it says otherwise: every rank of the
communicator must call it, in the same order, with buffers of the same size and dtype
(`allgatherv`, `alltoallv`: any length). A rank that skips one leaves the others waiting.
`sendrecv` pairs two ranks: each must make the call that matches the other's.

Device (cupy) buffers go to MPI directly when the MPI library is CUDA-aware. Otherwise
`for_backend` gives a `StagedCommunicator`, which copies them device -> pinned host ->
MPI -> device and counts the copies (ChainerMN's non-CUDA-aware communicator is the
model): the variant is chosen once, and no collective asks whether it stages. Either way
the current CUDA stream is synchronized before MPI reads a buffer. Where NCCL serves the job
(`comm.device_collectives`, `mpitrain.parallel.nccl`), device Allreduces and Bcasts go
through it instead.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import MpitrainError
from mpitrain.parallel.launch import abort_job, check_srun_world, cuda_aware_mpi
from mpitrain.parallel.rollcall import (
    ALLGATHER,
    ALLGATHER_OBJECT,
    ALLGATHERV,
    ALLREDUCE,
    ALLTOALLV,
    BARRIER,
    BCAST,
    BCAST_OBJECT,
    GATHER,
    GATHER_OBJECT,
    IALLREDUCE,
    IALLTOALLV,
    MAX,
    SCATTER,
    SENDRECV,
    WAIT,
    RollCall,
)

NO_REQUEST = MPI.REQUEST_NULL  # a posted collective with nothing for MPI to wait for
_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
              np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T,
              np.dtype(np.uint16): MPI.UINT16_T,  # 16-bit messages (`mpitrain.parallel.sync.compression`)
              np.dtype(np.uint8): MPI.UINT8_T}  # text (`mpitrain.parallel.vocabulary_lookup`)


class Communicator:
    """World rank/size, node-local rank and size, the number of nodes, and the collectives, with buffers handed to
    MPI as they are.

    `mpi_comm` defaults to COMM_WORLD (then an srun world of 1 rank per task is refused);
    tests pass a `Dup()`. `backend` is None until `for_backend` picks the variant.
    """

    staged_copies = staged_bytes = 0  # host staging's copies (a StagedCommunicator counts them)

    def __init__(self, mpi_comm=None, backend=None, cuda_aware: bool = False):
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        if mpi_comm is None:
            check_srun_world(self.size)
        node = self.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self.nodes = self.mpi.allreduce(int(self.local_rank == 0))  # ranks sharing memory count as one node
        self.backend, self.cuda_aware = backend, cuda_aware
        self.bytes_sent = 0
        self.mpi_seconds = self.comm_seconds = 0.0
        self.calls = RollCall(self.rank, MPI.Get_processor_name())  # where this rank is, for the watchdog

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def staged(self) -> bool:
        """Whether device buffers are staged through host memory."""
        return False

    @property
    def device_collectives(self) -> str:
        """What sums and broadcasts device buffers: "mpi", or "nccl" (`mpitrain.parallel.nccl`)."""
        return "mpi"

    def for_backend(self, backend, cuda_aware="auto", device_collectives="auto") -> Communicator:
        """The communicator for `backend`'s arrays, on the same MPI communicator (a collective).

        Device buffers behind an MPI that cannot read them (`cuda_aware`: auto asks the MPI
        library, true/false overrides) get a `StagedCommunicator`; otherwise a plain one. On a
        GPU, `device_collectives` (auto, nccl, mpi) says whether NCCL sums and broadcasts them
        (`mpitrain.parallel.nccl`: its variants of both).
        """
        aware = cuda_aware_mpi() if cuda_aware == "auto" else bool(cuda_aware)
        variant = StagedCommunicator if backend.on_gpu and not aware else Communicator
        if backend.on_gpu and device_collectives != "mpi":
            from mpitrain.parallel import nccl
            available = nccl.nccl_available()  # first: without cupy's NCCL, no device query
            if nccl.wants_nccl(device_collectives, self, nccl.device_count() if available else 0, available):
                variant = nccl.NcclStagedCommunicator if variant is StagedCommunicator else nccl.NcclCommunicator
        chosen = variant(self.mpi, backend, aware)
        chosen.calls = self.calls  # one roll-call per rank, whichever communicator runs the collective
        return chosen

    @contextmanager
    def _blocking(self, name: int, nbytes: int = 0):
        """Count the block's time as spent inside MPI and communicating, in the collective `name` (`COLLECTIVES`)
        of the roll-call."""
        start = time.perf_counter()
        slot = self.calls.enter(name, nbytes)
        try:
            yield
        finally:
            self.calls.leave(slot)
            spent = time.perf_counter() - start
            self.mpi_seconds += spent
            self.comm_seconds += spent

    @contextmanager
    def _inside(self, name: int):
        """The block as the collective `name` of the roll-call (the collectives of Python objects)."""
        slot = self.calls.enter(name, 0)
        try:
            yield
        finally:
            self.calls.leave(slot)

    def allreduce_(self, buf) -> None:
        """Sum a contiguous array over all ranks, in place. A collective."""
        _synchronize_device(buf)
        self.bytes_sent += buf.nbytes
        with self._blocking(ALLREDUCE, buf.nbytes):
            self._allreduce(buf)

    def iallreduce_(self, buf) -> Posted:
        """Post the sum of a contiguous array over all ranks, in place, without waiting. A collective: every rank
        posts the same buffers (sizes, dtypes) in the same order, then hands them all to `complete`; until then
        the buffer must not be touched."""
        _synchronize_device(buf)  # backward's kernels have written the bucket before MPI reads it
        self.bytes_sent += buf.nbytes
        return self._posted(IALLREDUCE, buf.nbytes, lambda: self._iallreduce(buf))

    def progress(self, posted: list[Posted]) -> None:
        """Let MPI move the posted collectives along (`Testall`; many MPI libraries progress only inside MPI
        calls). Not a collective: a rank may call it any number of times."""
        if posted:
            start = time.perf_counter()
            MPI.Request.Testall([p.request for p in posted])
            self.mpi_seconds += time.perf_counter() - start

    def complete(self, posted: list[Posted], last=None) -> None:
        """Sum `last` over all ranks in place by a blocking Allreduce, if given, then wait for the posted
        collectives and finish them (staged buffers are copied back). A collective when `last` is given (every
        rank passes one of the same size, after the same posts); otherwise not, the posts were.

        The blocking call moves the posted ones along too, and on MPICH ran faster than a posted one waited for
        (docs/benchmarks.md#measurements-behind-the-code): so the bucket that backward finishes last goes this
        way."""
        if not posted and last is None:
            return
        start = time.perf_counter()
        slot = self.calls.enter(WAIT if last is None else ALLREDUCE, 0 if last is None else last.nbytes)
        if last is not None:
            _synchronize_device(last)
            self.bytes_sent += last.nbytes
            self._allreduce(last)
        MPI.Request.Waitall([p.request for p in posted])
        self.calls.leave(slot)
        for p in posted:
            if p.finish is not None:
                p.finish()
        now = time.perf_counter()
        self.mpi_seconds += now - start
        self.comm_seconds += now - min([start] + [p.posted_at for p in posted])

    def average_(self, buf) -> None:
        """Average a contiguous array over all ranks, in place. A collective."""
        self.allreduce_(buf)
        buf /= self.size

    def bcast_(self, buf, root: int = 0) -> None:
        """Broadcast a contiguous array from `root`, in place. A collective."""
        _synchronize_device(buf)
        if self.rank == root:
            self.bytes_sent += buf.nbytes * (self.size - 1)
        with self._blocking(BCAST, buf.nbytes):
            self._bcast(buf, root)

    def gather_host(self, array: np.ndarray, root: int = 0) -> np.ndarray | None:
        """Every rank's 1-D host array (the same size and dtype on every rank), stacked in rank order on `root` as
        (ranks, size); None elsewhere. A collective (checkpoints: each rank's own state)."""
        array = np.ascontiguousarray(array).reshape(-1)
        stacked = np.empty((self.size, array.size), array.dtype) if self.rank == root else None
        if self.rank != root:
            self.bytes_sent += array.nbytes
        with self._blocking(GATHER, array.nbytes):
            self.mpi.Gather(_spec(array), [stacked, _mpi_type(array)] if stacked is not None else None, root=root)
        return stacked

    def scatter_host(self, stacked: np.ndarray | None, out: np.ndarray, root: int = 0) -> None:
        """Row r of `root`'s host array `stacked` (ranks, size) into rank r's 1-D host array `out` (size elements,
        the same dtype); `stacked` is read on `root` only. A collective (resuming each rank's own state)."""
        if self.rank == root:
            self.bytes_sent += out.nbytes * (self.size - 1)
            stacked = np.ascontiguousarray(stacked, dtype=out.dtype)
        with self._blocking(SCATTER, out.nbytes):
            self.mpi.Scatter([stacked, _mpi_type(out)] if self.rank == root else None, _spec(out), root=root)

    def allgather_counts(self, count: int) -> np.ndarray:
        """Every rank's `count` (an int), in rank order, as a host int64 array: an Allgather. A collective."""
        counts = np.zeros(self.size, dtype=np.int64)
        with self._blocking(ALLGATHER, 8):
            self.mpi.Allgather(np.array([count], dtype=np.int64), counts)
        self.bytes_sent += counts.itemsize
        return counts

    def allgatherv(self, message, counts=None, out=None) -> list:
        """Exchange variable-length 1-D messages: Allgather of sizes, then Allgatherv of bodies. A collective.

        `counts`, every rank's message size as `allgather_counts(message.size)` returned it, skips
        the Allgather of sizes. The messages come back, in rank order, as views into one array on
        the device `message` is on: the first values of `out` when given (long enough), else a new one.
        """
        _synchronize_device(message)
        if counts is None:
            counts = self.allgather_counts(message.size)  # timed by itself
        with self._blocking(ALLGATHERV, message.nbytes):
            offsets = _starts(counts)
            self.bytes_sent += message.nbytes
            out = _empty_like(message, int(counts.sum())) if out is None else out[:int(counts.sum())]
            self._allgatherv(message, out, counts, offsets)
        return [out[o:o + c] for o, c in zip(offsets, counts)]

    def alltoallv(self, parts, counts, received=None) -> list:
        """Send part j of `parts` to rank j: an Alltoall of the part sizes, then an Alltoallv. A collective.

        `parts` is one 1-D array holding the parts for ranks 0..N-1 back to back, `counts` their
        sizes (host ints). Returns the parts every rank sent to this one, in rank order, as views
        into one array on the device `parts` is on. Counts the sizes and the parts sent to other ranks.
        Where this rank knows the sizes it receives (`received`, host ints per rank: the answer to what it sent
        before), the Alltoall of the sizes is left out; every rank must then know them, or none.
        """
        _synchronize_device(parts)
        counts = np.asarray(counts, dtype=np.int64)
        with self._blocking(ALLTOALLV, parts.nbytes):
            others = np.arange(self.size) != self.rank
            if received is None:
                received = np.zeros(self.size, dtype=np.int64)
                self.mpi.Alltoall(counts, received)
                self.bytes_sent += counts.itemsize * (self.size - 1)
            received = np.asarray(received, dtype=np.int64)
            self.bytes_sent += int(counts[others].sum()) * parts.itemsize
            offsets, received_offsets = _starts(counts), _starts(received)
            out = _empty_like(parts, int(received.sum()))
            self._alltoallv(parts, counts, offsets, out, received, received_offsets)
        return [out[o:o + c] for o, c in zip(received_offsets, received)]

    def ialltoallv_(self, parts, counts, out) -> Posted:
        """Post sending part j of `parts` (the 1-D parts for ranks 0..N-1 back to back, `counts` their sizes, host
        ints) to rank j, without waiting; every rank's part for this one lands in `out`, in rank order, each of
        `counts[self.rank]` values (a rank's part is the same size on every rank). A collective: every rank posts
        the same sizes in the same order, then hands them all to `complete`; until then neither array may be
        touched. Counts the parts sent to other ranks."""
        _synchronize_device(parts)
        counts = np.asarray(counts, dtype=np.int64)
        received = np.full(self.size, counts[self.rank], np.int64)
        self.bytes_sent += int(counts[np.arange(self.size) != self.rank].sum()) * parts.itemsize
        return self._posted(IALLTOALLV, parts.nbytes,
                            lambda: self._ialltoallv(parts, counts, _starts(counts), out, received, _starts(received)))

    def _posted(self, name: int, nbytes: int, post) -> Posted:
        """`post()` (which returns the request and what completes it) as the roll-call's collective `name` of
        `nbytes`, its time counted inside MPI; the `Posted` for `complete`."""
        start = time.perf_counter()
        slot = self.calls.enter(name, nbytes)
        request, finish = post()
        self.calls.leave(slot)
        self.mpi_seconds += time.perf_counter() - start
        return Posted(request, start, finish)

    def sendrecv(self, message, dest: int | None, out, source: int | None):
        """Send the 1-D `message` to rank `dest` and receive one from rank `source` into the first values of `out`
        (long enough, of the sender's dtype); either side may be None: nothing sent, or nothing received. Returns
        the received values, a view of `out`, or None. Point to point, not a collective: `dest` must make the
        matching receive (from this rank) and `source` the matching send, in the same order on both sides, as in
        a pairwise exchange, where each rank sends to its partner and receives from it. Counts the bytes sent."""
        if message is not None:
            _synchronize_device(message)
            self.bytes_sent += message.nbytes
        with self._blocking(SENDRECV, 0 if message is None else message.nbytes):
            count = self._sendrecv(message, dest, out, source)
        return None if source is None else out[:count]

    def _allreduce(self, buf) -> None:
        self.mpi.Allreduce(MPI.IN_PLACE, _spec(buf), op=MPI.SUM)

    def _iallreduce(self, buf) -> tuple:
        """Post the sum; returns the request and what completes it afterwards (nothing here)."""
        return self.mpi.Iallreduce(MPI.IN_PLACE, _spec(buf), op=MPI.SUM), None

    def _bcast(self, buf, root: int) -> None:
        self.mpi.Bcast(_spec(buf), root=root)

    def _ialltoallv(self, parts, counts, offsets, out, received, received_offsets) -> tuple:
        """Post the Alltoallv; returns the request and what completes it afterwards (nothing here)."""
        return self.mpi.Ialltoallv([parts, counts, offsets, _mpi_type(parts)],
                                   [out, received, received_offsets, _mpi_type(out)]), None

    def _sendrecv(self, message, dest, out, source) -> int:
        """Sendrecv, MPI_PROC_NULL for a side that is None; returns the values received."""
        status = MPI.Status()
        self.mpi.Sendrecv(None if dest is None else _spec(message), MPI.PROC_NULL if dest is None else dest,
                          recvbuf=None if source is None else _spec(out),
                          source=MPI.PROC_NULL if source is None else source, status=status)
        return 0 if source is None else status.Get_count(_mpi_type(out))

    def _allgatherv(self, message, out, counts, offsets) -> None:
        self.mpi.Allgatherv(_spec(message), [out, counts, offsets, _mpi_type(out)])

    def _alltoallv(self, parts, counts, offsets, out, received, received_offsets) -> None:
        self.mpi.Alltoallv([parts, counts, offsets, _mpi_type(parts)],
                           [out, received, received_offsets, _mpi_type(out)])

    def iallreduce_max(self, send: np.ndarray, recv: np.ndarray):
        """Post the elementwise maximum of the ranks' small host arrays `send` into `recv`, without waiting; returns
        the request (its `Wait()` completes it). A collective: every rank posts it in the same order, and waits."""
        with self._inside(MAX):
            return self.mpi.Iallreduce(_spec(send), _spec(recv), op=MPI.MAX)

    def bcast_obj(self, value, root: int = 0):
        """`root`'s small Python value on every rank (pickled). A collective."""
        with self._inside(BCAST_OBJECT):
            return self.mpi.bcast(value, root=root)

    def gather_obj(self, value, root: int = 0):
        """Every rank's value as a list on `root` (None elsewhere; pickled). A collective."""
        with self._inside(GATHER_OBJECT):
            return self.mpi.gather(value, root=root)

    def allgather_obj(self, value) -> list:
        """Every rank's value as a list, in rank order, on every rank (pickled). A collective."""
        with self._inside(ALLGATHER_OBJECT):
            return self.mpi.allgather(value)

    def max(self, value: float) -> float:
        """The largest of the ranks' numbers, on every rank. A collective."""
        with self._inside(MAX):
            return self.mpi.allreduce(value, op=MPI.MAX)

    def barrier(self) -> None:
        """Wait until every rank got here. A collective."""
        with self._inside(BARRIER):
            self.mpi.Barrier()

    def abort(self) -> None:
        """End every rank of the job now (MPI_Abort on COMM_WORLD). Not a collective: one rank may call it."""
        abort_job()

    def raise_first_failure(self, failure: str | None, kind: type[MpitrainError] = MpitrainError) -> None:
        """Every rank passes its failure's message, or None; when any rank failed, every rank raises `kind` with the
        first failing rank's message, "(seen on rank R)". A collective (one allgather)."""
        failures = [(rank, message) for rank, message in enumerate(self.allgather_obj(failure)) if message is not None]
        if failures:
            rank, message = failures[0]
            raise kind(f"{message} (seen on rank {rank})")

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


class StagedCommunicator(Communicator):
    """Device -> pinned host -> MPI -> device, for an MPI that cannot read device memory.

    Copies go through the backend (`copy_to_host`, `copy_to_device`), which counts them;
    this communicator counts them too (`staged_copies`, `staged_bytes`). The pinned buffers
    are kept and reused, one per role ("send", "recv") and dtype, grown when a larger one is
    needed. Host (numpy) buffers of a GPU run (evaluation counts) go to MPI as they are.
    With the numpy backend every buffer is staged through plain host buffers, so this path
    is tested without a GPU.
    """

    def __init__(self, mpi_comm=None, backend=None, cuda_aware: bool = False):
        super().__init__(mpi_comm, backend, cuda_aware)
        self.pinned_buffers = {}
        self.staged_copies, self.staged_bytes = 0, 0
        self.in_flight = 0  # posted collectives not yet completed, each with its own host buffer

    @property
    def staged(self) -> bool:
        return True

    def stages(self, buf) -> bool:
        """Device buffers are staged; host ones too with the numpy backend (the tests' way to run this path)."""
        return not (self.backend.on_gpu and isinstance(buf, np.ndarray))

    def _allreduce(self, buf) -> None:
        if not self.stages(buf):
            return super()._allreduce(buf)
        host = self._to_host(buf)
        super()._allreduce(host)
        self._to_device(host, buf)

    def _bcast(self, buf, root: int) -> None:
        if not self.stages(buf):
            return super()._bcast(buf, root)
        host = self._to_host(buf) if self.rank == root else self.pinned("send", buf.dtype, buf.size)
        super()._bcast(host, root)
        if self.rank != root:
            self._to_device(host, buf)

    def complete(self, posted: list[Posted], last=None) -> None:
        super().complete(posted, last)
        self.in_flight = 0

    def _iallreduce(self, buf) -> tuple:
        """Each buffer in flight is staged through a host buffer of its own, copied back by `complete`."""
        if not self.stages(buf):
            return super()._iallreduce(buf)
        host = self._to_host(buf, role=f"posted {self.in_flight}")
        self.in_flight += 1
        request, _ = super()._iallreduce(host)
        return request, lambda: self._to_device(host, buf)

    def _ialltoallv(self, parts, counts, offsets, out, received, received_offsets) -> tuple:
        """The parts and what arrives staged through host buffers of their own, what arrived copied back by
        `complete`."""
        if not self.stages(parts):
            return super()._ialltoallv(parts, counts, offsets, out, received, received_offsets)
        send = self._to_host(parts, role=f"posted {self.in_flight}")
        into = self.pinned(f"posted {self.in_flight} received", out.dtype, out.size)
        self.in_flight += 1
        request, _ = super()._ialltoallv(send, counts, offsets, into, received, received_offsets)
        return request, lambda: self._to_device(into, out)

    def _allgatherv(self, message, out, counts, offsets) -> None:
        if not self.stages(message):
            return super()._allgatherv(message, out, counts, offsets)
        self._through_host(message, out, lambda send, received: Communicator._allgatherv(
            self, send, received, counts, offsets))

    def _alltoallv(self, parts, counts, offsets, out, received, received_offsets) -> None:
        if not self.stages(parts):
            return super()._alltoallv(parts, counts, offsets, out, received, received_offsets)
        self._through_host(parts, out, lambda send, into: Communicator._alltoallv(
            self, send, counts, offsets, into, received, received_offsets))

    def _sendrecv(self, message, dest, out, source) -> int:
        """The message through the "send" host buffer, what arrives through the "recv" one (only the values that
        arrived are copied back)."""
        if not self.stages(message if message is not None else out):
            return super()._sendrecv(message, dest, out, source)
        host = None if source is None else self.pinned("recv", out.dtype, out.size)
        count = super()._sendrecv(None if message is None else self._to_host(message), dest, host, source)
        if source is not None:
            self._to_device(host[:count], out[:count])
        return count

    def _through_host(self, send, out, collective) -> None:
        """`collective(host send, host out)` on a host copy of `send`, its result copied into `out`."""
        received = self.pinned("recv", out.dtype, out.size)
        collective(self._to_host(send), received)
        self._to_device(received, out)

    def pinned(self, role: str, dtype, size: int) -> np.ndarray:
        """A reused host buffer of `size` elements for `role`. Not a collective."""
        key = (role, np.dtype(dtype))
        buffer = self.pinned_buffers.get(key)
        if buffer is None or buffer.size < size:  # grown to twice its size at least: few pinned allocations
            grown = max(size, 2 * buffer.size if buffer is not None else 0)
            buffer = self.pinned_buffers[key] = self.backend.empty_pinned(grown, dtype)
        return buffer[:size]

    def _to_host(self, buf, role: str = "send") -> np.ndarray:
        """A host copy of `buf`, in the buffer of `role`."""
        host = self.pinned(role, buf.dtype, buf.size)
        self.backend.copy_to_host(buf.reshape(-1), host)
        self._count(host.nbytes)
        return host

    def _to_device(self, host: np.ndarray, buf) -> None:
        """Copy `host` back into the device buffer `buf`."""
        self.backend.copy_to_device(host, buf.reshape(-1))
        self._count(host.nbytes)

    def _count(self, nbytes: int) -> None:
        self.staged_copies += 1
        self.staged_bytes += nbytes


@dataclass(frozen=True)
class Posted:
    """A posted non-blocking collective: its MPI request (`NO_REQUEST` for one enqueued on a CUDA stream, which
    completes in the stream's order), when it was posted, and what completes it afterwards (a staged buffer's copy
    back to the device), if anything."""

    request: MPI.Request
    posted_at: float
    finish: object = None


def _empty_like(message, size: int):
    return array_module(message).empty(size, dtype=message.dtype)


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of `counts` consecutive parts starts."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def _spec(buf) -> list:
    return [buf, _mpi_type(buf)]


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
