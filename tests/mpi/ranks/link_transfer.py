"""Under mpiexec -n 2: time one MEGABYTES-sized Send from rank 0 to rank 1; rank 0 prints the seconds as JSON.

A 1 MB exchange first sets up the connection; the timed Send ends with a one-byte answer, so
the time covers the whole message's arrival.
"""
import json
import sys
import time

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
answer = np.zeros(1, dtype=np.uint8)


def send(nbytes: int) -> float:
    """Rank 0 sends `nbytes` to rank 1 and waits for its answer; the seconds that took (on rank 0)."""
    data = np.ones(nbytes, dtype=np.uint8)
    world.Barrier()
    started = time.perf_counter()
    if world.rank == 0:
        world.Send(data, dest=1)
        world.Recv(answer, source=1)
    else:
        world.Recv(data, source=0)
        world.Send(answer, dest=0)
    return time.perf_counter() - started


send(1 << 20)
seconds = send(int(float(sys.argv[1]) * 1e6))
if world.rank == 0:
    print(json.dumps({"seconds": seconds}))
