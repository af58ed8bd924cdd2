"""Layers that join several inputs into one: `concat` (along the last axis) and `add` (elementwise).

A merge takes a list of inputs and gives the list of their gradients back
(`backward(dy, input_grads)`: None where an input needs none); the graph model
(`mpitrain.nn.graph`) calls them so. They have no parameters, and write into their part of
the model's workspace like every layer: a grow-only buffer (`mpitrain.nn.layers.varying`), since merged
sequences (docs/sequences.md: of one set of lengths, which the graph checks) change their padded length from
batch to batch.
"""
from __future__ import annotations

from mpitrain.base.arrays import array_module
from mpitrain.nn.layers import Layer, layer_type, varying


class Merge(Layer):
    """Several inputs in, one out: `merged_shape(input_shapes)` instead of `output_shape`. `input_count` is how many
    inputs it reads (None: two or more); with `shares_lengths`, its sequence inputs must have one set of lengths,
    which the output carries (otherwise the output carries the first input's). The graph tells it its inputs'
    lengths (`input_lengths`, None for a value that is no sequence) and its dropout key before forward."""

    input_count: int | None = None
    shares_lengths = True
    input_lengths: tuple = ()

    def merged_shape(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        raise NotImplementedError


@layer_type("concat", graph_only=True)
class Concat(Merge):
    """Inputs side by side along their last axis; every other axis must agree (flatten first to join a table's
    embeddings (columns, dim) with numeric columns (k,))."""

    def merged_shape(self, shapes):
        if len({shape[:-1] for shape in shapes}) > 1 or any(not shape for shape in shapes):
            raise ValueError(f"concat joins inputs along their last axis, but their shapes {[list(s) for s in shapes]} "
                             "differ before it; expected e.g. [k1] and [k2] (flatten first)")
        return (*shapes[0][:-1], sum(shape[-1] for shape in shapes))

    def forward(self, xs, training):
        self.widths = [x.shape[-1] for x in xs]
        y = varying(self.ws, "y", (*xs[0].shape[:-1], sum(self.widths)), xs[0].dtype)
        start = 0
        for x, width in zip(xs, self.widths):
            y[..., start:start + width] = x
            start += width
        return y

    def backward(self, dy, input_grads):
        grads, start = [], 0
        for i, (width, wanted) in enumerate(zip(self.widths, input_grads)):
            grads.append(dy[..., start:start + width] if wanted else None)
            start += width
        return grads


@layer_type("add", graph_only=True)
class Add(Merge):
    """The elementwise sum of inputs of one shape (a residual connection)."""

    def merged_shape(self, shapes):
        if len(set(shapes)) > 1:
            raise ValueError(f"add sums inputs of one shape, but they are {[list(s) for s in shapes]}")
        return shapes[0]

    def forward(self, xs, training):
        y = varying(self.ws, "y", xs[0].shape, xs[0].dtype)
        xp = array_module(y)
        xp.add(xs[0], xs[1], out=y)
        for x in xs[2:]:
            y += x
        return y

    def backward(self, dy, input_grads):
        return [dy if wanted else None for wanted in input_grads]
