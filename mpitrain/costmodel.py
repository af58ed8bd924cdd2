"""What a step's communication costs on a network: the latency-bandwidth (alpha-beta) model of the collectives
mpitrain uses, fitted to measurements and used to choose `sharing`'s exchange and to extrapolate.

    network = Network.of(latency_us=1.0, gbps=100)         # stated figures (e.g. InfiniBand EDR)
    network = Network.fit(sizes, seconds)                   # from a ping-pong's one-way times
    network.allreduce(4 * n_params, ranks)                  # seconds of one Allreduce of the flat gradient

A message of m bytes between two ranks takes `latency_s + m * byte_s`. Each collective is
costed as the algorithm MPICH picks for it (Thakur, Rabenseifner and Gropp 2005): a step
of the algorithm is one message per rank, all ranks' messages of a step in parallel, each
on its own link; `steps` x latency + the bytes one rank sends in all steps / bandwidth.

| collective (P ranks, n bytes) | algorithm                            | steps        | bytes per rank        |
| ----------------------------- | ------------------------------------ | ------------ | --------------------- |
| Allreduce, n <= 2 KiB         | recursive doubling                   | log2 P       | n log2 P              |
| Allreduce, larger             | reduce-scatter + allgather           | 2 log2 P     | 2 (P-1)/P n           |
| Allgather(v), total T         | recursive doubling (small), ring     | log2 P, P-1  | T - own share         |
| Alltoallv                     | pairwise exchange                    | P-1          | what this rank sends  |
| Bcast, n                      | binomial tree (small), scatter+ring  | log2 P       | n (large: 2 (P-1)/P n)|

The model has no contention term: the simulated cluster's links are point-to-point into one
bridge, and a cluster's fat tree gives each node its full link rate. Computation inside a
collective (the reduction's adds) is not modelled either; at the sizes that matter it is a
few percent of the wire time on a 1-10 Gb/s link (docs/cluster.md compares model and measurement).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SMALL_ALLREDUCE = 2048  # bytes: MPICH's MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE
SMALL_GATHER = 512 * 1024  # bytes in all: below, MPICH's allgather(v) uses recursive doubling / Bruck


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
        of sizes (benchmarks/network_probe.py), fitted through this model's own Allreduce formula, by least
        squares of the relative error (small and large sizes count alike).

        A collective's latency per step includes the MPI library's own work and, where ranks share
        processors, their turns; its time per byte includes the processors' share of the transfer (TCP,
        copies, the reduction) when every rank sends at once. A lone ping-pong sees neither, so it is
        reported beside the fit but not used for it; on a network whose links are the limit both agree.
        """
        features = np.asarray([cls(1.0, 0.0).allreduce(n, ranks) for n, _ in allreduce]), \
            np.asarray([cls(0.0, 1.0).allreduce(n, ranks) for n, _ in allreduce])
        seconds = np.asarray([t for _, t in allreduce])
        (latency, byte_s), *_ = np.linalg.lstsq(np.stack(features, axis=1) / seconds[:, None], np.ones(len(seconds)),
                                                rcond=None)
        return cls(max(float(latency), 0.0), float(byte_s))

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
        if nbytes <= SMALL_ALLREDUCE:
            return self.cost(rounds, nbytes * rounds)
        return self.cost(2 * rounds, 2 * (ranks - 1) / ranks * nbytes)

    def allgatherv(self, sizes) -> float:
        """One Allgatherv of the ranks' `sizes` (bytes each); the slowest rank receives all but the smallest."""
        ranks, total = len(sizes), float(sum(sizes))
        if ranks <= 1:
            return 0.0
        rounds = math.ceil(math.log2(ranks)) if total < SMALL_GATHER else ranks - 1
        return self.cost(rounds, total - min(sizes))

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
