"""A bag of ids to one vector: the sum, mean or largest of a table's rows (PyTorch's `nn.EmbeddingBag`).

    {name: merchants, type: embedding_bag, input: recent_merchants, dim: 16}              # mean (the default)
    {name: merchants, type: embedding_bag, input: recent_merchants, dim: 16, mode: sum}

Its input is a sequence column of ids, (None, 1): a row's list of values (the merchants of a user's last 30 days),
stored ragged as a sequence is, its order unused. Bag b's output is the `mode` of rows ids[b, t] of a table of
`ids` rows of `dim` values over its valid steps t < lengths[b]: `sum`, `mean`, or `max` (each feature's largest,
whose gradient goes to that step's row). An empty bag (length 0) gives zeros, the sum's identity, as PyTorch's
does in every mode. `ids: auto` takes the column's count from the dataset (the manifest's `ids`).

Its table is sparse as an `embedding`'s (`mpitrain.nn.embedding.TableGrad`): backward writes only the rows of the
batch's ids and reports them (`touched`), so in a graph the sync modes send only those rows. The ids get no
gradient; padded steps read row 0 and add nothing to it. With `shard: rows` (as an `embedding`'s,
`mpitrain.nn.embedding.TableLayer`) the valid steps' ids go to the ranks that hold their rows.
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import DataError
from mpitrain.kernels.broadcast import scale_rows
from mpitrain.kernels.embedding import gather_rows, scatter_add_rows
from mpitrain.nn.embedding import TableGrad, TableLayer
from mpitrain.nn.layers import layer_type, varying
from mpitrain.nn.sequence import mean_scales, padded_steps, step_index
from mpitrain.nn.tokens import table_of_ids

BAG_MODES = ("sum", "mean", "max")


@layer_type("embedding_bag", graph_only=True)
class EmbeddingBag(TableLayer):
    """The `mode` of a table's rows over each bag of ids (None, 1) -> (dim,); see the module docstring."""

    not_cut = "it reduces a whole bag, which no segment holds"

    def __init__(self, dim: int = 16, mode: str = "mean", ids="auto", init: str | None = None, shard: str = "none"):
        if not (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 1):
            raise ValueError(f"dim {dim!r}, expected an integer >= 1 (one table)")
        if mode not in BAG_MODES:
            raise ValueError(f"mode {mode!r}, expected one of {BAG_MODES}")
        self._take_shard(shard)
        self.dim, self.mode, self.ids, self.init = dim, mode, ids, init

    def table_sizes(self) -> list[tuple[int, int]]:
        return [(self.ids, self.dim)]

    def param_shapes(self, input_shape):
        table_of_ids("an embedding_bag", input_shape, self.ids, self.dim)
        self.shapes = [TableGrad("table", self.ids, self.dim)]
        return {table.name: (table.rows, table.dim) for table in self.tables}

    def output_shape(self, input_shape):
        return (self.dim,)

    def forward(self, x, training):
        xp = array_module(x)
        batch, steps = x.shape[:2]
        self.shape = (batch, steps, self.dim)
        self.rows = self.ws.at_least("ids", batch * steps, np.int64)
        self.rows[...] = x.reshape(-1)  # float ids, exact: to row numbers
        self.padded = padded_steps(self.ws, self.lengths, steps)
        if self.padded is not None:
            xp.copyto(self.rows, 0, where=self.padded.reshape(-1))
        if self.rows.size:
            low, high = int(self.rows.min()), int(self.rows.max())
            if low < 0 or high >= self.ids:
                raise DataError(f"a bag holds id {low if low < 0 else high}, outside the embedding_bag's table of "
                                f"{self.ids} ids (0..{self.ids - 1}); expected ids below the layer's `ids`")
        dtype = self.sharded()[0].params.dtype if self.collective else self.params["table"].dtype
        values = varying(self.ws, "values", self.shape, dtype)
        if self.collective:  # the valid steps' rows from their owners (a collective)
            valid = self._valid()
            values.reshape(batch * steps, self.dim)[valid] = self.row_tables[0].forward(self.rows[valid])
        else:
            gather_rows(self.params["table"], self.rows, values.reshape(batch * steps, self.dim))
        y = self.ws("y", (batch, self.dim), dtype)
        if self.mode == "max":
            if self.padded is not None:
                xp.copyto(values, -np.inf, where=self.padded[:, :, None])
            self.where = self.ws("where", (batch, self.dim), np.int64)
            if steps:
                xp.argmax(values, axis=1, out=self.where)
                xp.max(values, axis=1, out=y)
            self._empty_bags_to_zero(y)
            return y
        if self.padded is not None:
            xp.copyto(values, 0, where=self.padded[:, :, None])
        values.sum(axis=1, out=y)
        if self.mode == "mean":
            self.scale = mean_scales(self.ws, self.lengths, batch, steps, dtype)
            scale_rows(y, self.scale, y)
        return y

    def _valid(self):
        """Which of the batch's steps, flattened, hold a bag's value (not padding)."""
        return slice(None) if self.padded is None else ~self.padded.reshape(-1)

    def _empty_bags_to_zero(self, array) -> None:
        """Rows of bags of no value: zero (the largest of nothing would be -inf)."""
        if self.lengths is not None:
            empty = self.ws("empty", (len(array),), bool)
            array_module(array).equal(self.lengths, 0, out=empty)
            array_module(array).copyto(array, 0, where=empty[:, None])
        elif not self.shape[1]:
            array[...] = 0

    def backward(self, dy, input_grad=True):
        xp = array_module(dy)
        batch, steps, dim = self.shape
        step_grads = varying(self.ws, "step_grads", self.shape, dy.dtype)
        if self.mode == "max":
            elsewhere = varying(self.ws, "elsewhere", self.shape, bool)  # not the step of a feature's largest
            xp.not_equal(step_index(self.ws, steps)[None, :, None], self.where[:, None, :], out=elsewhere)
            xp.copyto(step_grads, dy[:, None, :])
            xp.copyto(step_grads, 0, where=elsewhere)
        else:  # a broadcasting copy takes no buffer; a broadcasting multiply would
            xp.copyto(step_grads, dy[:, None, :])
            if self.mode == "mean":
                scale_rows(step_grads.reshape(batch, -1), self.scale, step_grads.reshape(batch, -1))
        if self.collective:  # the valid steps' gradients to their rows' owners (a collective)
            self.row_tables[0].backward(step_grads.reshape(batch * steps, dim)[self._valid()])
            return None
        if self.padded is not None:  # padded steps (an empty bag's included) send nothing to row 0
            xp.copyto(step_grads, 0, where=self.padded[:, :, None])
        table, grad = self.tables[0], self.grads["table"]
        if table.written is None:
            grad[...] = 0
        else:
            grad[table.written] = 0
        scatter_add_rows(grad, self.rows, step_grads.reshape(batch * steps, dim))
        valid = self.rows if self.padded is None else self.rows[~self.padded.reshape(-1)]
        table.touched = table.written = xp.unique(valid)
        return None  # the ids get no gradient
