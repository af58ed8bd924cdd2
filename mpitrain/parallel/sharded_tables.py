"""Embedding tables with `shard: rows` in a run: this rank's rows of each, their gradients and updater state, and
the collectives a step makes with them (`mpitrain.parallel.sharded_rows` routes and moves the rows).

    attach_sharded_tables(model, comm)       # each sharded embedding gets its tables' rows on this rank
    table.forward(ids)                       # the rows of a batch column's ids (two Alltoallv)
    table.backward(grads)                    # their gradients to the owners: this rank's rows get the mean (one)
    table.take_updater(optimizer_config)     # the run's optimizer, over this rank's rows
    table.step(updater)                      # after the dense update: the rows the step touched

- **Memory per rank**: a table of V rows x D values over R ranks holds ceil(V / R) x D values three times
  (values, gradients, the updater's delta buffer) plus the updater's slots (Adam: two more), in the model's dtype,
  and never the whole table: a fresh one's values are computed for this rank's rows alone
  (`mpitrain.nn.embedding.initial_rows`), a checkpoint's rows are read as each rank's strided share
  (`mpitrain.rundir.table_rows`).
- **Gradients**: each rank adds its batch's gradients per distinct id in batch order, sends them to the owners,
  which add what each rank sent in rank order and divide by the ranks: exactly the mean gradient the replicated
  table's sparse exchange computes (`mpitrain.parallel.sync.sparse`), so under plain SGD a sharded run trains the
  model of a replicated one bit for bit.
- **Updates are lazy**: a step moves only the rows it touched, and an updater with state (momentum, AdaGrad,
  Adam, ...) updates those rows' state alone, with the run's step count t (TensorFlow's LazyAdam, TorchRec's
  row-wise optimizers). Dense Adam would also decay every other row's moments and keep moving those rows by their
  momentum; the lazy step leaves them as they are. Plain SGD is the same either way.
- Tables live on the host (numpy) in this version; the config refuses `shard: rows` elsewhere.
"""
from __future__ import annotations

import numpy as np

from mpitrain.kernels.embedding import scatter_add_rows
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.sharded_rows import RowSharding, add_row_grads, gather_rows


class ShardedTable:
    """This rank's rows of one table of `rows` x `dim` over the ranks of `comm` (`RowSharding`'s cyclic rule):
    `params` and `grads` (its rows, `held` of the whole table), the rows the last backward wrote (`written`, local
    row numbers) and, once training gives it one, its updater (`take_updater`). Without a `comm`, one process holds
    every row and makes no exchange (`mpitrain export` reads a table whole)."""

    def __init__(self, comm, name: str, rows: int, dim: int, dtype):
        self.comm, self.name = comm, name
        self.rank = comm.rank if comm is not None else 0
        self.sharding = RowSharding(rows, comm.size if comm is not None else 1)
        self.held = self.sharding.ids_of(self.rank)
        shard_rows = self.sharding.shard_rows(self.rank)
        self.params = np.zeros((shard_rows, dim), dtype)
        self.grads = np.zeros((shard_rows, dim), dtype)
        self.written = np.zeros(0, np.int64)
        self.route = None
        self.updater = None

    @property
    def rows(self) -> int:
        return self.sharding.rows

    @property
    def dim(self) -> int:
        return self.params.shape[1]

    def forward(self, ids) -> np.ndarray:
        """The rows of `ids` (a batch column, integers in [0, rows)), (len(ids), dim) in their order; the route is
        kept for `backward`. A collective (two Alltoallv)."""
        self.route = self.sharding.route(ids)
        return gather_rows(self.comm, self.route, self.params)[self.route.inverse]

    def backward(self, grads) -> None:
        """Send the gradients of the last forward's rows (`grads`, (len(ids), dim)) to their owners: this rank's
        `grads` then hold, at the rows any rank's batch touched (`written`), the ranks' summed gradient divided by
        the number of ranks, and zero elsewhere. A collective (one Alltoallv), after `forward`."""
        route = self.route
        distinct = np.zeros((route.unique.size, self.dim), self.grads.dtype)
        scatter_add_rows(distinct, route.inverse, grads)  # per distinct id, in batch order
        self.grads[self.written] = 0
        add_row_grads(self.comm, route, distinct, self.grads)
        self.written = np.unique(self.sharding.local(np.concatenate(route.asked)))
        self.grads[self.written] /= self.comm.size

    def take_updater(self, config) -> None:
        """Train these rows with optimizer `config` (an OptimizerConfig): its state slots over this rank's rows. No
        L2 or weight decay: tables get none (their parameters are not weight matrices)."""
        self.updater = create_updater(config, self.params.reshape(-1), np.zeros((), self.params.dtype))

    def step(self, updater) -> None:
        """Update the rows the last backward wrote, at `updater`'s rate and step count (the run's, after its own
        step): plain SGD as `updater.row_delta`, any other updater lazily (the module docstring). Not a
        collective."""
        rows = self.written
        if not rows.size:
            return
        if updater.steps_rows_alone:
            self.params[rows] += updater.row_delta(self.grads[rows])
            return
        own = self.updater
        own.lr = updater.lr
        slots = [slot.reshape(-1, self.dim)[rows] for slot in own.slots]
        delta = own.rows_step([slot.reshape(-1) for slot in slots], self.grads[rows].reshape(-1),
                              self.params[rows].reshape(-1), updater.iteration)
        for slot, part in zip(own.slots, slots):
            slot.reshape(-1, self.dim)[rows] = part
        self.params[rows] += delta.reshape(-1, self.dim)

    def arrays(self) -> dict:
        """What a checkpoint keeps of this rank's rows: `params` and each updater slot by name, (shard rows, dim)."""
        slots = zip(self.updater.slot_names, self.updater.slots) if self.updater else ()
        return {"params": self.params, **{name: slot.reshape(-1, self.dim) for name, slot in slots}}


def attach_sharded_tables(model, comm) -> list[ShardedTable]:
    """Give each sharded embedding of `model` (`Layer.collective`) its tables' rows on this rank of `comm` (None:
    every row, on one process), zeroed (a fresh model's `init_params` draws them, a checkpoint loads them), and set
    `model.sharded_tables` to them, in layer order. Not a collective; every rank must do it before the model's
    first forward."""
    tables = []
    for layer, name in zip(model.layers, model.names):
        if layer.collective:
            layer.row_tables = [ShardedTable(comm, f"{name}/{shape.name}", shape.rows, shape.dim, model.params.dtype)
                                for shape in layer.shapes]
            tables += layer.row_tables
    model.sharded_tables = tables
    return tables
