"""What a step's communication costs on a network: the latency-bandwidth (alpha-beta) model of the collectives
mpitrain uses, fitted to measurements and used to choose `sharing`'s exchange and to extrapolate.

    network = Network.of(latency_us=1.0, gbps=100)         # stated figures (e.g. InfiniBand EDR)
    network = Network.fit(sizes, seconds)                   # from a ping-pong's one-way times
    network.allreduce(4 * n_params, ranks)                  # seconds of one Allreduce of the flat gradient
    allgather_exchange(network, sizes)                      # sharing's exchanges: (seconds, wire bytes per rank)
    split_exchange(network, sizes, n_params, 4)             #   for messages of `sizes` bytes, one per rank
    recursive_exchange(network, sizes, n_params)
    sharded_table_step(network, distinct, dim, ranks)     # a row-sharded table's step (issue 49): Alltoallvs
    replicated_table_step(network, distinct, dim, ranks)  # a replicated table's sparse exchange: an Allgatherv

A message of m bytes between two ranks takes `latency_s + m * byte_s`. Each collective is
costed as the algorithm MPICH picks for it (Thakur, Rabenseifner and Gropp 2005): a step
of the algorithm is one message per rank, all ranks' messages of a step in parallel, each
on its own link; `steps` x latency + the bytes one rank sends in all steps / bandwidth.

| collective (P ranks, n bytes) | algorithm                            | steps        | bytes per rank        |
| ----------------------------- | ------------------------------------ | ------------ | --------------------- |
| Allreduce, n <= 2 KiB         | recursive doubling                   | log2 P       | n log2 P              |
| Allreduce, larger             | reduce-scatter + allgather           | 2 log2 P     | 2 (P-1)/P n           |
| Allgather(v), total T         | recursive doubling (small), ring     | log2 P, P-1  | T - own share         |
| Alltoall, n <= 256 B per rank | Bruck                                | log2 P       | n P/2 log2 P          |
| Alltoallv                     | pairwise exchange                    | P-1          | what this rank sends  |
| Bcast, n                      | binomial tree (small), scatter+ring  | log2 P       | n (large: 2 (P-1)/P n)|
| Sendrecv rounds (mpitrain's)  | pairwise, one message per round      | rounds       | the largest pair's    |

The model has no contention term: the simulated cluster's links are point-to-point into one
bridge, and a cluster's fat tree gives each node its full link rate. Computation inside a
collective (the reduction's adds) is not modelled either; at the sizes that matter it is a
few percent of the wire time on a 1-10 Gb/s link (docs/cluster.md compares model and measurement).

A table's step is costed for `distinct` distinct ids in each rank's batch, spread evenly over the rows' owners: a
row-sharded table sends (P-1)/P of them to their owners and gets their rows back, then sends their gradients (three
Alltoallv, the first after an Alltoall of part sizes), so its bytes per rank do not grow with P and its latency terms do
(pairwise steps); a replicated table's sparse exchange Allgathervs every rank's ids and rows, so each rank takes in
the other P-1 ranks' rows.

`sharing`'s three exchanges are costed from the ranks' message sizes alone, as `sync.exchange:
auto` must choose before it exchanges (docs/architecture.md, "sharing"): `allgather` is exact,
`split` and `recursive` assume each message's elements spread evenly over the blocks and bound
each block they send by the smaller of its sparse size (every element sent into it distinct)
and dense size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpitrain.kernels.threshold.counts import COUNT_HEADER_SIZE, count_dtype
from mpitrain.kernels.threshold.message import HEADER_SIZE, bitmap_words

SMALL_ALLREDUCE = 2048  # bytes: MPICH's MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE
SMALL_GATHER = 512 * 1024  # bytes in all: below, MPICH's allgather(v) uses recursive doubling / Bruck
SMALL_ALLTOALL = 256  # bytes to each rank: up to this, MPICH's alltoall is Bruck's (MPIR_CVAR_ALLTOALL_SHORT_MSG_SIZE)
SIZE_BYTES = 8  # one rank's message size (int64), allgathered, or sent to each rank by an Alltoall
HEADER_BYTES = 4 * HEADER_SIZE  # a threshold message's header, or a reduced block's: 4 int32
INDEX_BYTES = 4  # an int32 index of a sparse threshold message or a sparse reduced block
COUNT_HEADER_BYTES = 4 * COUNT_HEADER_SIZE  # a count block's header (the recursive exchange)


@dataclass(frozen=True)
class Network:
    """The alpha-beta model: `latency_s` per message, `byte_s` per byte on one link."""

    latency_s: float
    byte_s: float

    @classmethod
    def of(cls, latency_us: float, gbps: float) -> Network:
        """A network of stated figures: latency per message in microseconds, link rate in Gb/s."""
        return cls(latency_us * 1e-6, 8.0 / (gbps * 1e9))

    @classmethod
    def fit(cls, allreduce, ranks: int) -> Network:
        """The network as measured by Allreduces: `allreduce` [(bytes, seconds)] on `ranks` ranks over a range
        of sizes (benchmarks/network_probe.py), in two parts of this model's own Allreduce formula: the time
        per byte is the slope over the large ones (256 KiB and more, where bytes dominate), the latency per
        step the small ones' (16 KiB and less) mean time per step.

        A collective's latency per step includes the MPI library's and mpi4py's own work and, where ranks
        share processors, their turns; its time per byte includes the processors' share of the transfer
        (TCP, copies, the reduction) when every rank sends at once. A lone ping-pong sees neither, so it is
        reported beside the fit (`from_pingpong`) but not used for it; where the links are the limit both agree.
        """
        wire = cls(0.0, 1.0)
        large = np.asarray([(wire.allreduce(n, ranks), t) for n, t in allreduce if n >= 262144])
        slope, _ = np.polyfit(large[:, 0], large[:, 1], 1)
        steps = cls(1.0, 0.0)
        small = [(t - slope * wire.allreduce(n, ranks)) / steps.allreduce(n, ranks) for n, t in allreduce
                 if n <= 16384]
        return cls(max(float(np.mean(small)), 0.0), float(slope))

    @classmethod
    def from_pingpong(cls, pingpong) -> Network:
        """A link as a ping-pong measured it: `pingpong` [(bytes, one-way seconds)], least squares."""
        byte_s, latency = np.polyfit(*np.asarray(pingpong, dtype=float).T, 1)
        return cls(max(float(latency), 0.0), float(byte_s))

    @property
    def gbps(self) -> float:
        return 8.0 / self.byte_s / 1e9

    @property
    def latency_us(self) -> float:
        return self.latency_s * 1e6

    def to_dict(self) -> dict:
        return {"latency_us": self.latency_us, "gbps": self.gbps}

    def cost(self, steps: float, nbytes: float) -> float:
        """Seconds of `steps` latencies and `nbytes` sent by one rank."""
        return steps * self.latency_s + nbytes * self.byte_s

    def allreduce(self, nbytes: float, ranks: int) -> float:
        """One Allreduce of `nbytes` on `ranks` ranks."""
        if ranks <= 1:
            return 0.0
        rounds = math.ceil(math.log2(ranks))
        return self.cost(rounds if nbytes <= SMALL_ALLREDUCE else 2 * rounds, allreduce_bytes(nbytes, ranks))

    def allgatherv(self, sizes) -> float:
        """One Allgatherv of the ranks' `sizes` (bytes each); the slowest rank receives all but the smallest."""
        ranks, total = len(sizes), float(sum(sizes))
        if ranks <= 1:
            return 0.0
        rounds = math.ceil(math.log2(ranks)) if total < SMALL_GATHER else ranks - 1
        return self.cost(rounds, allgatherv_bytes(sizes))

    def alltoall(self, nbytes: float, ranks: int) -> float:
        """One Alltoall of `nbytes` from every rank to each other rank (a small one: Bruck's log2 P steps)."""
        if ranks <= 1:
            return 0.0
        if nbytes <= SMALL_ALLTOALL:
            return self.cost(math.ceil(math.log2(ranks)), alltoall_bytes(nbytes, ranks))
        return self.alltoallv(alltoall_bytes(nbytes, ranks), ranks)

    def alltoallv(self, sent_bytes: float, ranks: int) -> float:
        """One Alltoallv in which the busiest rank sends `sent_bytes` to the others (P-1 pairwise steps)."""
        return self.cost(ranks - 1, sent_bytes) if ranks > 1 else 0.0

    def bcast(self, nbytes: float, ranks: int) -> float:
        """One Bcast of `nbytes` from one rank."""
        if ranks <= 1:
            return 0.0
        rounds = math.ceil(math.log2(ranks))
        if nbytes < 12288:  # MPICH: binomial tree below 12 KiB, scatter + ring allgather above
            return self.cost(rounds, nbytes)
        return self.cost(rounds + ranks - 1, 2 * (ranks - 1) / ranks * nbytes)


def allreduce_bytes(nbytes: float, ranks: int) -> float:
    """Bytes one rank sends in an Allreduce of `nbytes` (recursive doubling when small, else a ring's 2 (P-1)/P n)."""
    if ranks <= 1:
        return 0.0
    if nbytes <= SMALL_ALLREDUCE:
        return nbytes * math.ceil(math.log2(ranks))
    return 2 * (ranks - 1) / ranks * nbytes


def alltoall_bytes(nbytes: float, ranks: int) -> float:
    """Bytes one rank sends in an Alltoall of `nbytes` to each rank: Bruck's forward half the blocks in each of
    log2 P steps; larger ones go straight to each rank."""
    if ranks <= 1:
        return 0.0
    if nbytes <= SMALL_ALLTOALL:
        return nbytes * ranks / 2 * math.ceil(math.log2(ranks))
    return nbytes * (ranks - 1)


def allgatherv_bytes(sizes) -> float:
    """Bytes the busiest rank sends in an Allgatherv of the ranks' `sizes`: all but the smallest."""
    return float(sum(sizes)) - min(sizes) if len(sizes) > 1 else 0.0


def allgather_exchange(network: Network, sizes) -> tuple[float, float]:
    """sharing's `allgather` exchange of the ranks' threshold messages of `sizes` bytes (headers included): an
    Allgather of the sizes, an Allgatherv of the messages. Returns (seconds, wire bytes of the busiest rank)."""
    counts = [SIZE_BYTES] * len(sizes)
    return (network.allgatherv(counts) + network.allgatherv(sizes),
            allgatherv_bytes(counts) + allgatherv_bytes(sizes))


def split_exchange(network: Network, sizes, n: int, itemsize: int) -> tuple[float, float]:
    """sharing's `split` exchange of the ranks' threshold messages of `sizes` bytes (headers included) for `n`
    parameters of `itemsize` bytes. Returns (seconds, wire bytes of the busiest rank).

    An Allgather of the sizes, an Alltoall of the part sizes, an Alltoallv of the parts (each
    rank keeps its own block's), an Allgather of the reduced blocks' sizes, an Allgatherv of the
    reduced blocks. A message's elements are taken as spread evenly over the blocks; the
    reduced blocks, as equal, each the smaller of its sparse bound (index + value for every
    element sent into it, at most one per parameter) and its dense size.
    """
    ranks = len(sizes)
    bodies = np.asarray(sizes, dtype=float) - HEADER_BYTES
    counts = [SIZE_BYTES] * ranks
    parts = float(bodies.max()) * (ranks - 1) / ranks + HEADER_BYTES * (ranks - 1)
    elements = min(float(message_elements(bodies, n).sum()), n)
    # itemsize - 4: a float64 sparse block of an odd count is padded to keep its values 8-byte aligned
    block = HEADER_BYTES + itemsize - 4 + min((INDEX_BYTES + itemsize) * elements, itemsize * n) / ranks
    seconds = (2 * network.allgatherv(counts) + network.alltoall(SIZE_BYTES, ranks)
               + network.alltoallv(parts, ranks) + network.allgatherv([block] * ranks))
    wire = 2 * allgatherv_bytes(counts) + alltoall_bytes(SIZE_BYTES, ranks) + parts + allgatherv_bytes([block] * ranks)
    return seconds, wire


def recursive_exchange(network: Network, sizes, n: int) -> tuple[float, float]:
    """sharing's `recursive` exchange of the ranks' threshold messages of `sizes` bytes (headers included) for `n`
    parameters. Returns (seconds, wire bytes of the busiest rank).

    An Allgather of the sizes, then pairwise rounds, each costing its largest count block: where the ranks
    are not a power of two, the folded ranks' counts (their message's elements) first and the sums back to
    them last; between, over the P' core ranks, log2 P' rounds of recursive halving, where a rank sends half
    its range holding the elements of the ranks summed so far (their message sizes' sum, spread evenly), and
    log2 P' rounds of recursive doubling of the summed blocks (all ranks' elements, spread evenly). Each block
    is the smaller of its sparse size (index + count per element) and its dense size (a count per element).
    """
    ranks = len(sizes)
    if ranks <= 1:
        return 0.0, 0.0
    width = count_dtype(ranks).itemsize
    elements = message_elements(np.asarray(sizes, dtype=float) - HEADER_BYTES, n)
    core = 1 << (ranks.bit_length() - 1)
    extra = ranks - core
    folded = elements[0:2 * extra:2]
    cores = np.concatenate([np.minimum(folded + elements[1:2 * extra:2], n), elements[2 * extra:]])
    total = min(float(cores.sum()), n)
    halving = [count_block_bytes(min(float(cores.reshape(-1, core >> t).sum(axis=0).max()), n) / 2 ** (t + 1),
                                 n / 2 ** (t + 1), width) for t in range(core.bit_length() - 1)]
    doubling = [count_block_bytes(total * 2 ** t / core, n * 2 ** t / core, width)
                for t in range(core.bit_length() - 1)]
    unfold = [count_block_bytes(total, n, width)] if extra else []
    rounds = ([count_block_bytes(float(folded.max()), n, width)] if extra else []) + halving + doubling + unfold
    counts = [SIZE_BYTES] * ranks
    seconds = network.allgatherv(counts) + network.cost(len(rounds), sum(rounds))
    return seconds, allgatherv_bytes(counts) + sum(halving + doubling + unfold)


def sharded_table_step(network: Network, distinct: float, dim: int, ranks: int, itemsize: int = 4) -> tuple[float, float]:
    """One step of a row-sharded table (`mpitrain.parallel.sharded_rows`) with `distinct` distinct ids in every
    rank's batch, spread evenly over the owners: forward's Alltoallv of the ids (int64) to their owners and of their
    rows (`dim` values of `itemsize` bytes) back, backward's of their gradients; the first after an Alltoall of the
    part sizes (the other two know theirs). Returns (seconds, wire bytes of a rank)."""
    away = distinct * (ranks - 1) / ranks  # the ids other ranks hold
    ids, rows = 8 * away, itemsize * dim * away
    seconds = network.alltoall(SIZE_BYTES, ranks) + network.alltoallv(ids, ranks) + 2 * network.alltoallv(rows, ranks)
    return seconds, alltoall_bytes(SIZE_BYTES, ranks) + ids + 2 * rows


def replicated_table_step(network: Network, distinct: float, dim: int, ranks: int,
                          itemsize: int = 4) -> tuple[float, float]:
    """One step of a replicated table's sparse exchange (`mpitrain.parallel.sync.sparse`, `allreduce`) with `distinct`
    touched rows on every rank: an Allgather of the counts, an Allgatherv of each rank's ids and rows. Returns
    (seconds, wire bytes of a rank)."""
    counts, messages = [SIZE_BYTES] * ranks, [distinct * (1 + dim) * itemsize] * ranks
    return (network.allgatherv(counts) + network.allgatherv(messages),
            allgatherv_bytes(counts) + allgatherv_bytes(messages))


def count_block_bytes(elements: float, length: float, width: int) -> float:
    """A count block of `length` counts of `width` bytes of which `elements` are nonzero: sparse or dense, whichever
    is shorter, in whole int32 words."""
    return COUNT_HEADER_BYTES + 4 * math.ceil(min((INDEX_BYTES + width) * elements, width * length) / 4)


def split_header_bytes(ranks: int) -> float:
    """What `split_exchange` moves per rank beyond its payloads: sizes, headers, padding. Its wire bytes never
    exceed a ring Allreduce of the same buffer (2 (P-1)/P x itemsize x n) by more than this."""
    return (2 * SIZE_BYTES + 2 * HEADER_BYTES + 4) * (ranks - 1) + alltoall_bytes(SIZE_BYTES, ranks)


def message_elements(bodies, n: int) -> np.ndarray:
    """At most how many elements threshold messages of `bodies` bytes (headers excluded) send: a bitmap body
    (its size is fixed by n) up to n, a sparse one one per int32 index."""
    bodies = np.asarray(bodies, dtype=float)
    return np.where(bodies == 4 * bitmap_words(n), n, np.minimum(bodies / INDEX_BYTES, n))
