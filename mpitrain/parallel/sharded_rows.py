"""Row-sharded embedding tables (issue 49's first part): the rule that gives each id's row to one rank, and a step's
two exchanges of rows with their owners.

    sharding = RowSharding(rows=V, ranks=R)        # id i lives on rank i % R, as row i // R of that rank's shard
    route = sharding.route(ids)                    # the batch's distinct ids, grouped by the rank that owns them
    rows = gather_rows(comm, route, shard)         # (distinct ids, D): the table's rows of route.unique
    add_row_grads(comm, route, grads, shard_grad)  # each owner adds the distinct ids' gradients into its rows

- **The rule is cyclic**: id i is row i div R of rank i mod R. ETL vocabularies number the values from the most
  frequent (or in order of first appearance), so contiguous ranges would put the hot rows on rank 0; cyclic ones
  spread them, shards differ by at most one row, and a rank of another rank count finds its rows as one strided
  slice (r, r + R, ...) of a whole table, so a resume on another rank count reads only its own rows.
- **De-duplicated**: a batch's ids travel once each (`route.unique`, sorted), and its rows are
  `rows[route.inverse]`.
- **Forward, two Alltoallv**: the distinct ids to their owners (after an Alltoall of their counts), their rows back
  (of sizes both sides know by then). **Backward, one** (sizes known too): the distinct ids' gradients to their
  owners, which add what each rank sent in rank order, each rank's ids in its order, so
  the sums are the same on every run (`kernels.embedding.scatter_add_rows`); the ids arrived in the forward
  exchange and are kept in the route.
- Every call is a collective: every rank routes its batch and takes part in each exchange, an empty batch too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpitrain.kernels.embedding import gather_rows as take_rows
from mpitrain.kernels.embedding import scatter_add_rows


@dataclass(frozen=True)
class RowSharding:
    """Which rank holds each of a table's `rows` ids over `ranks` ranks (the module docstring's cyclic rule)."""

    rows: int
    ranks: int

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return ids % self.ranks

    def local(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row in its owner's shard."""
        return ids // self.ranks

    def shard_rows(self, rank: int) -> int:
        """How many rows rank `rank` holds."""
        return len(range(rank, self.rows, self.ranks))

    def ids_of(self, rank: int) -> slice:
        """The ids rank `rank` holds, in its shard's order, as a slice of a whole table's rows."""
        return slice(rank, self.rows, self.ranks)

    def route(self, ids) -> Route:
        """The batch's `ids` (any shape, integers in [0, rows)) de-duplicated and grouped by owner. Not a
        collective."""
        ids = np.asarray(ids, dtype=np.int64)
        unique, inverse = np.unique(ids, return_inverse=True)
        owners = self.owner(unique)
        order = np.argsort(owners, kind="stable")  # by owner, each owner's ids ascending
        return Route(self, unique, inverse.reshape(ids.shape), order,
                     np.bincount(owners, minlength=self.ranks).astype(np.int64))


@dataclass
class Route:
    """A batch's distinct ids (`unique`, sorted), where each of its ids is among them (`inverse`, the batch's shape),
    the order that groups them by owner (`order`), how many go to each rank (`counts`), and, once `gather_rows`
    ran, the ids each rank asked this one for (`asked`, in rank order)."""

    sharding: RowSharding
    unique: np.ndarray
    inverse: np.ndarray
    order: np.ndarray
    counts: np.ndarray
    asked: list | None = None


def gather_rows(comm, route: Route, shard) -> np.ndarray:
    """The rows of `route.unique`, (len(unique), D) in its order, from their owners' `shard`s ((shard_rows, D): this
    rank's rows). Two Alltoallv: the ids to their owners, the rows back. A collective; keeps the ids this rank was
    asked for in `route.asked`, for `add_row_grads`."""
    dim = shard.shape[1]
    route.asked = comm.alltoallv(route.unique[route.order], route.counts)
    asked = np.concatenate(route.asked)
    rows = np.empty((asked.size, dim), shard.dtype)
    take_rows(shard, route.sharding.local(asked), rows)
    by_owner = np.concatenate(comm.alltoallv(rows.reshape(-1), [part.size * dim for part in route.asked],
                                             route.counts * dim))  # the rows of what this rank asked for
    by_owner = by_owner.reshape(-1, dim)
    out = np.empty_like(by_owner)
    out[route.order] = by_owner
    return out


def add_row_grads(comm, route: Route, grads, shard_grad) -> None:
    """Add `grads` ((len(unique), D), the distinct ids' gradients in `route.unique`'s order) into their owners'
    `shard_grad` ((shard_rows, D): this rank's rows), each owner adding what rank 0 sent, then rank 1's, ... One
    Alltoallv. A collective, after `gather_rows` on the same route."""
    dim = shard_grad.shape[1]
    sent = np.ascontiguousarray(grads[route.order]).reshape(-1)
    received = comm.alltoallv(sent, route.counts * dim, [part.size * dim for part in route.asked])
    for ids, part in zip(route.asked, received):
        scatter_add_rows(shard_grad, route.sharding.local(ids), part.reshape(-1, dim))
