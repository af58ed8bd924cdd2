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
|                | (a recurrent layer's also "/R", "/W_reverse", "/R_reverse": `DECAYED`)           |
| `stats_layout` | the same for `stats`                                                             |
| `decay_mask`   | 1 where L2 weight decay applies (weights), 0 elsewhere (biases, scales)          |
| `n_params`     | `params.size`                                                                    |
| `xp`           | the array module (numpy or cupy) the buffers live in                             |
| `workspace`    | every other array a step writes (`mpitrain.base.workspace`): the model's layers',  |
|                | the loss's, the batch pipeline's, the synchronizer's                             |
| `sparse_tables`| embedding tables in `grads[:dense_start]` whose rows a step writes only in part  |
|                | (`mpitrain.nn.embedding.TableGrad`); empty for most models                       |
| `dense_start`  | where the gradients every step writes in full begin (0 without tables)           |
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.workspace import Workspace

# The weight matrices, which L2 decay applies to: a dense or conv layer's, a recurrent layer's input and recurrent
# weights in both directions.
DECAYED = ("W", "R", "W_reverse", "R_reverse")


class FlatModel:
    """Allocates the flat buffers of `layout` and `stats_layout` (zeroed) and the L2 mask; see the module docstring."""

    sparse_tables: list = []
    dense_start = 0

    def __init__(self, layout: list, stats_layout: list, xp, dtype="float32"):
        self.xp, self.layout, self.stats_layout = xp, list(layout), list(stats_layout)
        self.params = xp.zeros(_size(self.layout), dtype=dtype)
        self.grads = xp.zeros(_size(self.layout), dtype=dtype)
        self.stats = xp.zeros(_size(self.stats_layout), dtype=dtype)
        self.n_params = self.params.size
        decay, offset = np.zeros(self.n_params, dtype=dtype), 0
        for name, shape in self.layout:
            decay[offset:offset + math.prod(shape)] = name.rsplit("/", 1)[-1] in DECAYED
            offset += math.prod(shape)
        self.decay_mask = xp.asarray(decay)
        self.workspace = Workspace(xp)


def flat_views(flat, layout: list) -> list:
    """Views into the 1-D buffer `flat`, one per `(name, shape)` of `layout`, in order."""
    views, offset = [], 0
    for _, shape in layout:
        views.append(flat[offset:offset + math.prod(shape)].reshape(shape))
        offset += math.prod(shape)
    return views


def _size(layout: list) -> int:
    return sum(math.prod(shape) for _, shape in layout)
