"""The embedding layer: one table per categorical column, a row of it per id.

    Embedding(dim=8)            # every column's rows have 8 values: output (columns, 8)
    Embedding(dim=[4, 16])      # one dimension per column, in the dataset's column order: output (20,)
    Embedding(dim="auto")       # per column min(50, round(1.6 * ids ** 0.56)) (fast.ai's rule of thumb)
    Embedding(dim=32, shard="rows")  # each rank holds every R-th row of each table (docs/tables.md)

Its input is a dataset's `categorical` input (`mpitrain.data.shards.Manifest.input_groups`):
integer ids 0..ids-1 per column (a shard's `ids`). Table j has `ids[j]` rows; the graph model
tells the layer those counts (`take_ids`) before it asks for parameter shapes. The ids get
no gradient.

A step touches few rows of a large table, so backward writes only those: it zeroes the rows
the step before wrote (`TableGrad.written`: this rank's, or the union of every rank's after a
sparse exchange; None: any row, after a dense one) and adds the batch's gradients into its
rows. `TableGrad.touched` (this rank's rows, sorted, unique) is what a synchronizer sends
instead of the whole table when that is smaller (`mpitrain.parallel.sync.sparse`). Tables get
no L2 weight decay (their parameters are not named W), so an update leaves untouched rows alone
under plain SGD.

With `shard: rows` the tables are not in the model's flat buffers at all: each rank holds its share of each
table's rows (`mpitrain.parallel.sharded_tables.ShardedTable`, given to the layer as `row_tables` by the run that
trains or scores it), and forward and backward get and send rows through it. Those two calls are collectives, so
every rank runs the layer's forward (an empty batch too) and backward the same number of times (`collective`).

A fresh table's values are a function of (one key per table, row, column) (`initial_rows`), so a rank holding every
R-th row computes exactly the values the whole table would hold there, in time and memory for its rows alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import DataError
from mpitrain.kernels.embedding import gather_rows, keyed_normals, scatter_add_rows
from mpitrain.nn.layers import Layer, layer_type

# `shard`: every rank holds the whole table, each rank its share of the rows, or rows when the table would take
# much of a rank's memory (`mpitrain.nn.model.auto_shard`, decided when the model is built and recorded so)
SHARDS = ("none", "rows", "auto")


def initial_rows(key: int, rows: int, dim: int, ids: slice = slice(None)) -> np.ndarray:
    """Rows `ids` (a slice of range(rows): all of them, or a rank's every R-th) of a fresh table of `rows` x `dim`
    from `key`: Normal(0, 1/sqrt(dim)), so the layer after sees inputs of about unit size whatever the dimension.
    Element e = row x dim + column is a normal of (key, e) (`kernels.embedding.keyed_normals`: dropout's keyed
    hash, no generator state), so any share of the rows is the values the whole table holds there, computed for
    those rows alone. Float64 on the host."""
    wanted = range(*ids.indices(rows))
    out = np.empty((len(wanted), dim))
    keyed_normals(np.uint64(key), wanted.start, wanted.step, out)
    out /= math.sqrt(dim)
    return out


def auto_dim(ids: int) -> int:
    """The dimension `dim: auto` gives a column of `ids` ids (fast.ai's rule of thumb)."""
    return min(50, round(1.6 * ids ** 0.56))


@dataclass
class TableGrad:
    """One table's gradient in the model's flat buffer: `grads[start:start + rows * dim]`, and which rows it holds."""

    name: str  # the parameter's name in the layout
    rows: int
    dim: int
    start: int = 0  # set by the model once its layout is known
    touched: object = None  # this rank's rows the last backward wrote, sorted and unique (an int64 array)
    written: object = None  # the rows that may be non-zero (an int64 array); None: any

    @property
    def stop(self) -> int:
        return self.start + self.rows * self.dim


class TableLayer(Layer):
    """A layer of embedding tables (`embedding`, `embedding_bag`): each table (`shapes`: name, rows, dim) in the
    model's flat buffers, or with `shard: rows` this rank's rows of it, given by the run (`row_tables`, in the order
    of `shapes`); see the module docstring."""

    reads_ids = True
    capture_blocker = "an embedding table: its backward finds the rows it wrote with unique, whose size the host reads"

    def _take_shard(self, shard: str) -> None:
        if shard not in SHARDS:
            raise ValueError(f"shard {shard!r}, expected one of {SHARDS}")
        self.shard = shard
        self.shapes: list[TableGrad] = []  # every table's name, rows and dim
        self.row_tables: list = []  # sharded: each table's rows on this rank (`ShardedTable`), given by the run

    def table_sizes(self) -> list[tuple[int, int]]:
        """(rows, dim) of each table, once the layer knows its ids."""
        raise NotImplementedError

    @property
    def tables(self) -> list[TableGrad]:
        """The tables in the model's flat buffers: all of them, or none when sharded."""
        return [] if self.collective else self.shapes

    @property
    def collective(self) -> bool:
        """Whether forward and backward are collectives (sharded tables)."""
        return self.shard == "rows"

    def init_params(self, rng, scheme):
        """Each table's `initial_rows`, from one key per table drawn from `rng`; a sharded table's share goes into
        its `row_tables` entry (the rows `held` of its `params`), which the run gave the layer."""
        keys = [int(rng.integers(2**63)) for _ in self.shapes]
        for key, shape, table in zip(keys, self.shapes, self.row_tables):
            table.params[...] = initial_rows(key, shape.rows, shape.dim, table.held)
        return {table.name: initial_rows(key, table.rows, table.dim) for key, table in zip(keys, self.tables)}

    def whole_tables(self) -> list[tuple[str, object]]:
        """(name, values) of each table, whole: the flat buffers' views, or a sharded layer's rows given on one
        process (`mpitrain export`)."""
        if not self.collective:
            return [(table.name, self.params[table.name]) for table in self.tables]
        if len(self.row_tables) != len(self.shapes) or any(t.sharding.ranks != 1 for t in self.row_tables):
            raise ValueError("a table with shard: rows is whole only on one process (each rank of a run holds its "
                             "share of the rows)")
        return [(shape.name, table.params) for shape, table in zip(self.shapes, self.row_tables)]

    def sharded(self) -> list:
        """The `row_tables` forward reads; a ValueError where the run has not given them."""
        if len(self.row_tables) != len(self.shapes):
            raise ValueError("a table with shard: rows runs where its rows live: in mpitrain train, eval and predict "
                             "(its tables are given to it as row_tables); expected a run's model")
        return self.row_tables


@layer_type("embedding", graph_only=True)
class Embedding(TableLayer):
    """Per categorical column j, output row i is table_j[ids[i, j]]; see the module docstring."""

    def __init__(self, dim=8, init: str | None = None, shard: str = "none"):
        if not (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 1 or dim == "auto"
                or isinstance(dim, list) and dim and all(isinstance(d, int) and d >= 1 for d in dim)):
            raise ValueError(f"dim {dim!r}, expected an integer >= 1, a list of them (one per column) or 'auto'")
        self._take_shard(shard)
        self.dim, self.init = dim, init
        self.ids: tuple[int, ...] = ()

    def table_sizes(self) -> list[tuple[int, int]]:
        return [(shape.rows, shape.dim) for shape in self.shapes]

    def take_ids(self, ids: tuple[int, ...]) -> None:
        """The ids of each input column (the dataset's), so the tables can be shaped."""
        dims = [auto_dim(n) for n in ids] if self.dim == "auto" else \
            list(self.dim) if isinstance(self.dim, list) else [self.dim] * len(ids)
        if len(dims) != len(ids):
            raise ValueError(f"dim lists {len(dims)} dimensions, expected one per categorical column ({len(ids)})")
        self.ids, self.dims = tuple(ids), dims
        self.shapes = [TableGrad(f"table{j}", n, d) for j, (n, d) in enumerate(zip(ids, dims))]

    def param_shapes(self, input_shape):
        if not self.ids or input_shape != (len(self.ids),):
            raise ValueError(f"an embedding takes the categorical ids (shape [{len(self.ids)}]), not inputs of shape "
                             f"{list(input_shape)}")
        return {table.name: (table.rows, table.dim) for table in self.tables}

    def output_shape(self, input_shape):
        if len(set(self.dims)) == 1:
            return (len(self.dims), self.dims[0])
        return (sum(self.dims),)

    def _column_views(self, out):
        """Column j's part of an output-shaped array (batch, dim_j)."""
        if out.ndim == 3:
            return [out[:, j, :] for j in range(len(self.dims))]
        starts = np.cumsum([0, *self.dims])
        return [out[:, a:b] for a, b in zip(starts, starts[1:])]

    def forward(self, x, training):
        self.rows = self.ws("ids", x.shape, np.int64)
        self.rows[...] = x  # float ids, exact: to row numbers
        self._check_ids()
        if self.collective:
            y = self.ws("y", (len(x), *self.output_shape(x.shape[1:])), self.sharded()[0].params.dtype)
            for j, (table, out) in enumerate(zip(self.row_tables, self._column_views(y))):
                out[...] = table.forward(self.rows[:, j])
            return y
        y = self.ws("y", (len(x), *self.output_shape(x.shape[1:])), self.params[self.tables[0].name].dtype)
        for j, (table, out) in enumerate(zip(self.tables, self._column_views(y))):
            gather_rows(self.params[table.name], self.rows[:, j], out)
        return y

    def _check_ids(self) -> None:
        """Ids outside a table would read (and, in backward, write) memory beyond it: a DataError naming the column
        instead. The ETL writes ids below each column's count; a dataset edited by hand may not."""
        low, high = self.rows.min(axis=0).tolist(), self.rows.max(axis=0).tolist()  # per column, on the host
        for j, ids in enumerate(self.ids):
            if low[j] < 0 or high[j] >= ids:
                raise DataError(f"categorical column {j} holds id {low[j] if low[j] < 0 else high[j]}, expected "
                                f"0..{ids - 1} (the manifest's ids of that column); the dataset's rows do not match "
                                "its manifest")

    def backward(self, dy, input_grad=True):
        if self.collective:
            for table, values in zip(self.row_tables, self._column_views(dy)):
                table.backward(values)
            return None
        xp = array_module(dy)
        for j, (table, values) in enumerate(zip(self.tables, self._column_views(dy))):
            grad = self.grads[table.name]
            if table.written is None:
                grad[...] = 0
            else:
                grad[table.written] = 0
            scatter_add_rows(grad, self.rows[:, j], values)
            table.touched = table.written = xp.unique(self.rows[:, j])
        return None
