"""The log's levels and format for a command or a script, set once per process (`mpitrain.api` re-exports it).

Here, on the ground floor, so a command that trains nothing (`etl`, `score`, `info`, `report`) sets its log without
importing the training's modules, numba and mpi4py (whose import starts MPI)."""
from __future__ import annotations

import logging
import sys


def setup_logging(rank: int) -> None:
    """mpitrain's messages at INFO on rank 0 and WARNING elsewhere; other libraries' at WARNING, so
    their INFO chatter (numba-cuda's deallocations at exit, say) stays out of a run's log."""
    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s", stream=sys.stderr)
    logging.getLogger("mpitrain").setLevel(logging.INFO if rank == 0 else logging.WARNING)
