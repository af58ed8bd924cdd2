"""Position embeddings: where a step lies in its sequence, added to its features, so that an order-blind layer
(attention, a pool) can tell the steps apart.

    {type: positional}                           # learned: a table of max_steps x F, trained (BERT's, ViT's)
    {type: positional, encoding: sinusoidal}     # fixed sines and cosines of the step (Vaswani et al. 2017)

Step t of every sequence gets row t of the table added: y[b, t] = x[b, t] + P[t]. `max_steps` is the longest
sequence the table serves, by default (`auto`) the dataset's longest (the manifest's `longest` of the sequence
column); a longer sequence is a DataError naming the layer's limit, while a batch padded past it (to a multiple of
8 steps) adds nothing to those padded steps. Padded steps get their row too; their values
reach nobody, and their gradient rows are zero, so they add nothing to the table's gradient.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import DataError
from mpitrain.kernels.activations import bias_activation
from mpitrain.kernels.rows import flat_rows
from mpitrain.nn.layers import Layer, is_sequence, layer_type, varying

ENCODINGS = ("learned", "sinusoidal")


def sinusoidal_table(steps: int, features: int) -> np.ndarray:
    """(steps, features) float64: feature 2i of step t is sin(t / 10000^(2i/F)), feature 2i + 1 its cosine (PyTorch's
    tutorial's and the original transformer's)."""
    positions = np.arange(steps)[:, None]
    frequencies = np.exp(-math.log(10000.0) * np.arange(0, features, 2) / features)
    table = np.zeros((steps, features))
    table[:, 0::2] = np.sin(positions * frequencies)
    table[:, 1::2] = np.cos(positions * frequencies[:features // 2])
    return table


@layer_type("positional")
class Positional(Layer):
    """x + P[:T] for a sequence (None, F); P learned (a parameter `table`, max_steps x F, Normal(0, 0.02) at
    start as BERT's) or sinusoidal (fixed, no parameter). See the module docstring."""

    per_step = False  # step t's output depends on t, which a segment of truncated BPTT would restart
    not_cut = "a segment's steps would be numbered from 0 again"
    _fixed = None  # the sinusoids on the model's device, made at the first forward

    def __init__(self, encoding: str = "learned", max_steps="auto"):
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding {encoding!r}, expected one of {ENCODINGS}")
        self.encoding, self.max_steps = encoding, max_steps

    def param_shapes(self, input_shape):
        if not is_sequence(input_shape):
            raise ValueError(f"a positional layer numbers a sequence's steps (None, F), not inputs of shape "
                             f"{list(input_shape)}")
        if self.max_steps == "auto":
            raise ValueError("max_steps is 'auto', but the input is no sequence column of the dataset (whose "
                             "longest sequence sets it); expected max_steps: N")
        self.fixed = sinusoidal_table(self.max_steps, input_shape[1]) if self.encoding == "sinusoidal" else None
        return {"table": (self.max_steps, input_shape[1])} if self.encoding == "learned" else {}

    def init_params(self, rng, scheme):
        return {"table": rng.normal(0.0, 0.02, size=self.params["table"].shape)} if self.params else {}

    def table(self, xp, dtype):
        """The (max_steps, F) table added: the parameter, or the fixed sinusoids on the model's device and dtype."""
        if self.encoding == "learned":
            return self.params["table"]
        if self._fixed is None:
            self._fixed = xp.asarray(self.fixed, dtype=dtype)
        return self._fixed

    def forward(self, x, training):
        steps = x.shape[1]
        self.rows = min(steps, self.max_steps)  # a batch padded past the table (to a multiple of 8) adds nothing there
        if steps > self.max_steps and (self.lengths is None or int(self.lengths.max()) > self.max_steps):
            longest = steps if self.lengths is None else int(self.lengths.max())
            raise DataError(f"a sequence of {longest} steps, but the positional layer's table holds {self.max_steps} "
                            f"(max_steps); expected sequences of at most {self.max_steps} steps")
        xp = array_module(x)
        rows = varying(self.ws, "rows", x.shape[1:], x.dtype)  # the table's rows for the batch's steps, 0 past it
        xp.copyto(rows[:self.rows], self.table(xp, x.dtype)[:self.rows])
        rows[self.rows:] = 0
        y = varying(self.ws, "y", x.shape, x.dtype)  # each row of (B, T F) plus the rows: a bias add, no buffer
        bias_activation(flat_rows(x), rows.reshape(-1), "none", flat_rows(y))
        return y

    def backward(self, dy, input_grad=True):
        if self.encoding == "learned":
            grad = self.grads["table"]
            dy[:, :self.rows].sum(axis=0, out=grad[:self.rows])
            grad[self.rows:] = 0
        return dy if input_grad else None
