"""The flat-buffer contract: all that synchronizers, updaters and checkpoints see of a model.

A model (`Sequential`, the `RBM`) keeps every trained parameter in ONE contiguous buffer
and every gradient in ONE more, so averaging parameters or gradients across ranks is a
single collective, and an updater's step is one pass. Its parts (layers, weight matrices)
hold views into them. Running statistics that gradients do not train (batch norm's) get a
third flat buffer of their own.

| attribute      | what it is                                                                       |
| -------------- | -------------------------------------------------------------------------------- |
| `params`       | the parameters, 1-D, contiguous                                                  |
| `grads`        | the gradients, same layout as `params`; backward overwrites them                 |
| `stats`        | running statistics, 1-D (empty when the model has none)                          |
| `layout`       | `[(name, shape)]` of `params` in buffer order; a weight matrix's name ends "/W"  |
|                | (also a recurrent layer's "/R"..., attention's "/W_out"...: `DECAYED`)           |
| `stats_layout` | the same for `stats`                                                             |
| `decay_mask`   | 1 where L2 weight decay applies (weights), 0 elsewhere (biases, scales); built   |
|                | when first read (an updater reads it only under L2 or weight decay)              |
| `n_params`     | `params.size`                                                                    |
| `xp`           | the array module (numpy or cupy) the buffers live in                             |
| `workspace`    | every other array a step writes (`mpitrain.base.workspace`): the model's layers',  |
|                | the loss's, the batch pipeline's, the synchronizer's                             |
| `sparse_tables`| embedding tables in `grads[:dense_start]` whose rows a step writes only in part  |
|                | (`mpitrain.nn.embedding.TableGrad`); empty for most models                       |
| `dense_start`  | where the gradients every step writes in full begin (0 without tables)           |
| `sharded_tables`| embedding tables with `shard: rows`, outside the flat buffers: this rank's rows |
|                | of each (`mpitrain.parallel.sharded_tables.ShardedTable`); empty for most models |
| `trainable`    | what training updates (`TrainablePart`): the model itself, or with frozen layers |
|                | (`freeze: true`, which lie first in the buffers) the flat contract over the rest |

The updater, the synchronizer, gradient clipping and accumulation see a model's `trainable` alone: a frozen
parameter gets no step and travels in no collective. `sparse_tables` and `dense_start` are the trainable part's
(in its coordinates); checkpoints, eval, predict and export read the whole model.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from mpitrain.base.workspace import Workspace

# The weight matrices, which L2 decay applies to: a dense or conv layer's, a recurrent layer's input and recurrent
# weights in both directions, attention's input and output projections; a layer made of layers names its parts'
# arrays PART.NAME (a transformer block's `ff1.W`).
DECAYED = ("W", "R", "W_reverse", "R_reverse", "W_out", "W_q", "W_kv")


class FlatModel:
    """Allocates the flat buffers of `layout` and `stats_layout` (zeroed) and the L2 mask; see the module docstring."""

    sparse_tables: list = []
    sharded_tables: list = []
    dense_start = 0
    trainable_start = 0  # where the parameters training updates begin (the frozen ones lie before)

    @property
    def trainable(self):
        """The flat contract of what training updates: the whole model (a subclass with frozen parameters gives
        a `TrainablePart`)."""
        return self

    def __init__(self, layout: list, stats_layout: list, xp, dtype="float32"):
        self.xp, self.layout, self.stats_layout = xp, list(layout), list(stats_layout)
        self.params = xp.zeros(_size(self.layout), dtype=dtype)
        self.grads = xp.zeros(_size(self.layout), dtype=dtype)
        self.stats = xp.zeros(_size(self.stats_layout), dtype=dtype)
        self.n_params = self.params.size
        self.workspace = Workspace(xp)

    @functools.cached_property
    def decay_mask(self):
        """1 where L2 weight decay applies, else 0, a full copy of the parameters' size in their dtype: built at the
        first read, which an updater makes only under L2 or weight decay."""
        decay, offset = np.zeros(self.n_params, dtype=self.params.dtype), 0
        for name, shape in self.layout:
            decay[offset:offset + math.prod(shape)] = name.rsplit("/", 1)[-1].rsplit(".", 1)[-1] in DECAYED
            offset += math.prod(shape)
        return self.xp.asarray(decay)


class TrainablePart:
    """The flat contract over a model's parameters from `start` on (those before are frozen): views of its
    `params`, `grads`, `decay_mask` and `layout` from there, its running statistics (`stats`, all of them: a frozen
    batch norm keeps its running averages as PyTorch's does) and workspace; `sparse_tables` and `dense_start`, in
    the part's coordinates, are set by the model. Not a collective."""

    sparse_tables: list = []
    dense_start = 0
    trainable_start = 0

    def __init__(self, model: FlatModel, start: int):
        self.xp, self.workspace = model.xp, model.workspace
        self.model = model
        self.start = start
        self.params, self.grads = model.params[start:], model.grads[start:]
        self.stats, self.stats_layout = model.stats, model.stats_layout
        offsets = np.cumsum([0, *(math.prod(shape) for _, shape in model.layout)])
        self.layout = model.layout[int(np.searchsorted(offsets, start)):]
        self.n_params = self.params.size

    @property
    def trainable(self):
        return self

    @property
    def decay_mask(self):
        """The model's from `start` on (built there at the first read)."""
        return self.model.decay_mask[self.start:]

    @property
    def sharded_tables(self) -> list:
        """The model's (a sharded table is never frozen)."""
        return self.model.sharded_tables


def flat_views(flat, layout: list) -> list:
    """Views into the 1-D buffer `flat`, one per `(name, shape)` of `layout`, in order."""
    views, offset = [], 0
    for _, shape in layout:
        views.append(flat[offset:offset + math.prod(shape)].reshape(shape))
        offset += math.prod(shape)
    return views


def _size(layout: list) -> int:
    return sum(math.prod(shape) for _, shape in layout)
