"""Measure a network for the cost model (an MPI program: `mpiexec -n N python benchmarks/network_probe.py`).

Ping-pong between ranks 0 and 1 (one-way time = round trip / 2) over message sizes, then
Allreduce (float32, all ranks) over sizes, then `sharing`'s exchange (an Allgather of sizes
and an Allgatherv) over message sizes per rank, each the median of its repetitions after one
warm-up. Rank 0 prints one JSON object: {"ranks", "pingpong": [[bytes, seconds]...],
"allreduce": [[bytes, seconds]...], "allgatherv": [[bytes per rank, seconds]...]}. `mpitrain.parallel.costmodel.Network.fit` turns the ping-pong
into latency and bandwidth; the Allreduce rows check the model's collective formulas.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np
from mpi4py import MPI

PINGPONG_BYTES = [8, 1024, 16384, 131072, 524288, 1048576, 4194304]
GATHER_BYTES = [1024, 8192, 32768, 131072]  # per rank: sharing's messages
ALLREDUCE_BYTES = [8, 1024, 16384, 262144, 1048576, 2592040, 4194304]


def repetitions(nbytes: int) -> int:
    """More repetitions for small messages, so each size costs about the same time at 1 Gb/s."""
    return max(5, min(200, 20_000_000 // max(nbytes, 1) // 10))


def pingpong(comm, nbytes: int) -> float:
    """Median one-way seconds of `nbytes` between ranks 0 and 1 (the others wait at the barrier)."""
    buf = np.zeros(nbytes, dtype=np.uint8)
    times = []
    for i in range(repetitions(nbytes) + 1):
        comm.Barrier()
        start = time.perf_counter()
        if comm.rank == 0:
            comm.Send(buf, dest=1)
            comm.Recv(buf, source=1)
        elif comm.rank == 1:
            comm.Recv(buf, source=0)
            comm.Send(buf, dest=0)
        if i:  # the first is a warm-up (connection set-up)
            times.append((time.perf_counter() - start) / 2)
    return statistics.median(times)


def allreduce(comm, nbytes: int) -> float:
    """Median seconds of an in-place float32 Allreduce of `nbytes`, timed from a barrier (the slowest rank's)."""
    buf = np.ones(max(nbytes // 4, 1), dtype=np.float32)
    times = []
    for i in range(repetitions(nbytes) // 4 + 3):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        if i:
            times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return statistics.median(times)


def allgatherv(comm, nbytes: int) -> float:
    """Median seconds of the Allgather of sizes and Allgatherv of `nbytes` per rank that `sharing` runs."""
    message = np.ones(nbytes // 4, dtype=np.int32)
    out = np.empty(message.size * comm.size, dtype=np.int32)
    times = []
    for i in range(repetitions(nbytes) // 4 + 3):
        comm.Barrier()
        start = time.perf_counter()
        counts = np.zeros(comm.size, dtype=np.int64)
        comm.Allgather(np.array([message.size], dtype=np.int64), counts)
        comm.Allgatherv(message, [out, counts, np.arange(comm.size) * message.size, MPI.INT32_T])
        if i:
            times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return statistics.median(times)


def main() -> None:
    comm = MPI.COMM_WORLD
    result = {"ranks": comm.size,
              "pingpong": [[n, pingpong(comm, n)] for n in PINGPONG_BYTES],
              "allreduce": [[n, allreduce(comm, n)] for n in ALLREDUCE_BYTES],
              "allgatherv": [[n, allgatherv(comm, n)] for n in GATHER_BYTES]}
    if comm.rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
