"""Row-sharded tables (mpitrain/parallel/sharded_rows.py) on this job's ranks: every rank holds its cyclic share of
one table of 101 rows x 3 and routes a batch of its own (repeated ids, some ranks' batches empty or touching one
owner only); the rows gathered from the owners are the whole table's rows of the batch, and the gradients added
at the owners are the replicated table's sums (integer-valued, so exact in any order), over two steps."""
import numpy as np
from mpi4py import MPI

from mpitrain.kernels.embedding import scatter_add_rows
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sharded_rows import RowSharding, add_row_grads, gather_rows

import common

comm = Communicator(MPI.COMM_WORLD.Dup())
ROWS, DIM = 101, 3
table = np.random.default_rng(0).normal(size=(ROWS, DIM)).astype(np.float32)  # the same on every rank
sharding = RowSharding(ROWS, comm.size)
shard, shard_grad = table[sharding.ids_of(comm.rank)].copy(), np.zeros((sharding.shard_rows(comm.rank), DIM), np.float32)


def batch(rank: int, step: int) -> np.ndarray:
    """Rank `rank`'s ids at `step`: 40 with repeats; rank 1's second batch is empty, rank 2's all on rank 0."""
    rng = np.random.default_rng(100 * step + rank)
    if (rank, step) == (1, 1):
        return np.zeros((0, 2), np.int64)
    ids = rng.integers(0, ROWS, (20, 2))
    return ids - ids % comm.size if rank == 2 else ids


def batch_grads(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng(1000 + 100 * step + rank).integers(-4, 5, (*batch(rank, step).shape, DIM)).astype(
        np.float32)


replicated = np.zeros((ROWS, DIM), np.float32)
for step in range(2):
    ids = batch(comm.rank, step)
    route = sharding.route(ids)
    rows = gather_rows(comm, route, shard)
    common.report(comm, f"step {step}: the owners' rows are the table's rows of the batch",
                  np.array_equal(rows[route.inverse], table[ids]) and np.array_equal(rows, table[route.unique]))
    unique_grads = np.zeros((route.unique.size, DIM), np.float32)
    scatter_add_rows(unique_grads, route.inverse.reshape(-1), batch_grads(comm.rank, step).reshape(-1, DIM))
    add_row_grads(comm, route, unique_grads, shard_grad)
    for rank in range(comm.size):  # every rank's batch, as a replicated table would sum them
        scatter_add_rows(replicated, batch(rank, step).reshape(-1), batch_grads(rank, step).reshape(-1, DIM))
    common.report(comm, f"step {step}: the owners' gradient rows are the replicated table's sums",
                  np.array_equal(shard_grad, replicated[sharding.ids_of(comm.rank)]))
