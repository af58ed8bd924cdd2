"""Token ids to vectors: an embedding table read by a sequence of ids (text, event types, product ids).

    TokenEmbedding(dim=32)              # ids from the dataset: its sequence column's manifest "ids" (ETL-counted)
    TokenEmbedding(dim=32, ids=50000)   # a table of 50000 rows, whatever the dataset says

Its input is a sequence of one number per step, `(None, 1)`: integer ids 0..ids-1 below 2**24, stored exactly in float32 (the
ETL records `ids`, the largest + 1, for a sequence column of non-negative integers: docs/sequences.md). Step t's
output is row `ids[t]` of the table, `(None, dim)`. The ids get no gradient; the table's gradient is dense (written
whole each step, rows of padded steps included: their gradient is zero by the masking contract), so every sync
mode carries it like any weight. An id outside the table is a DataError, before it reads beyond the table.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import DataError
from mpitrain.kernels.embedding import gather_rows, scatter_add_rows
from mpitrain.nn.layers import Layer, is_sequence, layer_type


def table_of_ids(layer: str, input_shape, ids, dim: int) -> dict:
    """{"table": (ids, dim)}: the parameter shapes of `layer` (named with its article), a table read by a sequence
    column of ids (None, 1); a ValueError for any other input, or for `ids` still 'auto' (no column's count).
    Not a collective."""
    if not is_sequence(input_shape) or input_shape[1] != 1:
        raise ValueError(f"{layer} reads a sequence of ids (shape [None, 1]), not inputs of shape {list(input_shape)}")
    if ids == "auto":
        raise ValueError("ids is 'auto', but the dataset's sequence column has no ids (the ETL counts them for a "
                         "column of non-negative integers); expected ids: N")
    return {"table": (ids, dim)}


@layer_type("token_embedding")
class TokenEmbedding(Layer):
    """Row ids[b, t] of a table of `ids` rows of `dim` values, per step of a sequence of ids; see the module."""

    per_step = True

    reads_ids = True
    capture_blocker = "a token embedding: its forward reads the ids' range on the host"

    def __init__(self, dim: int = 16, ids="auto", init: str | None = None):
        if not (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 1):
            raise ValueError(f"dim {dim!r}, expected an integer >= 1 (one table)")
        self.dim, self.ids, self.init = dim, ids, init

    def param_shapes(self, input_shape):
        return table_of_ids("a token_embedding", input_shape, self.ids, self.dim)

    def output_shape(self, input_shape):
        return (None, self.dim)

    def init_params(self, rng, scheme):
        """Normal(0, 1/sqrt(dim)) rows, as the categorical columns' embedding: inputs of about unit size after it."""
        return {"table": rng.normal(0.0, 1.0 / math.sqrt(self.dim), size=(self.ids, self.dim))}

    def forward(self, x, training):
        batch, steps = x.shape[:2]
        self.rows = self.ws.at_least("ids", batch * steps, np.int64)
        self.rows[...] = x.reshape(-1)  # float ids, exact: to row numbers (padding holds anything)
        if self.lengths is not None:
            xp = array_module(x)
            self.rows[(xp.arange(steps)[None, :] >= self.lengths[:, None]).reshape(-1)] = 0
        low, high = int(self.rows.min()), int(self.rows.max())
        if low < 0 or high >= self.ids:
            raise DataError(f"a token id {low if low < 0 else high} is outside the token_embedding's table of "
                            f"{self.ids} ids (0..{self.ids - 1}); expected ids below the layer's `ids`")
        y = self.ws.at_least("y", batch * steps * self.dim, self.params["table"].dtype).reshape(batch * steps,
                                                                                               self.dim)
        gather_rows(self.params["table"], self.rows, y)
        return y.reshape(batch, steps, self.dim)

    def backward(self, dy, input_grad=True):
        grad = self.grads["table"]
        grad[...] = 0
        scatter_add_rows(grad, self.rows, dy.reshape(-1, self.dim))
        return None  # the ids get no gradient (`build_model` keeps a token_embedding first)
