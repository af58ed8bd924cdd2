"""The embedding layer: one table per categorical column, a row of it per id.

    Embedding(dim=8)            # every column's rows have 8 values: output (columns, 8)
    Embedding(dim=[4, 16])      # one dimension per column, in the dataset's column order: output (20,)
    Embedding(dim="auto")       # per column min(50, round(1.6 * ids ** 0.56)) (fast.ai's rule of thumb)

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import DataError
from mpitrain.kernels.embedding import gather_rows, scatter_add_rows
from mpitrain.nn.layers import Layer, layer_type


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


@layer_type("embedding", graph_only=True)
class Embedding(Layer):
    """Per categorical column j, output row i is table_j[ids[i, j]]; see the module docstring."""

    reads_ids = True

    def __init__(self, dim=8, init: str | None = None):
        if not (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 1 or dim == "auto"
                or isinstance(dim, list) and dim and all(isinstance(d, int) and d >= 1 for d in dim)):
            raise ValueError(f"dim {dim!r}, expected an integer >= 1, a list of them (one per column) or 'auto'")
        self.dim, self.init = dim, init
        self.ids: tuple[int, ...] = ()
        self.tables: list[TableGrad] = []

    def take_ids(self, ids: tuple[int, ...]) -> None:
        """The ids of each input column (the dataset's), so the tables can be shaped."""
        dims = [auto_dim(n) for n in ids] if self.dim == "auto" else \
            list(self.dim) if isinstance(self.dim, list) else [self.dim] * len(ids)
        if len(dims) != len(ids):
            raise ValueError(f"dim lists {len(dims)} dimensions, expected one per categorical column ({len(ids)})")
        self.ids, self.dims = tuple(ids), dims
        self.tables = [TableGrad(f"table{j}", n, d) for j, (n, d) in enumerate(zip(ids, dims))]

    def param_shapes(self, input_shape):
        if not self.ids or input_shape != (len(self.ids),):
            raise ValueError(f"an embedding takes the categorical ids (shape [{len(self.ids)}]), not inputs of shape "
                             f"{list(input_shape)}")
        return {table.name: (table.rows, table.dim) for table in self.tables}

    def output_shape(self, input_shape):
        if len(set(self.dims)) == 1:
            return (len(self.dims), self.dims[0])
        return (sum(self.dims),)

    def init_params(self, rng, scheme):
        """Normal(0, 1/sqrt(dim)) rows: the layer after sees inputs of about unit size whatever the dimension."""
        return {table.name: rng.normal(0.0, 1.0 / math.sqrt(table.dim), size=(table.rows, table.dim))
                for table in self.tables}

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
