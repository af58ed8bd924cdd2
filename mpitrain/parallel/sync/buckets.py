"""Gradient buckets for overlapped `allreduce`: the flat gradient buffer cut into contiguous pieces, last layer first.

    buckets = gradient_buckets(model.layout, cap_bytes=1e6, itemsize=4)   # [(start, stop)], the buffer's tail first

Backward fills the gradient buffer from its end (the last layer's gradients are done first),
so a bucket of the last layers can travel while the first layers still compute. A bucket
holds whole layers (the `LL_type` prefix of the layout's names), taken last to first while
the bucket stays within `cap_bytes`; a layer larger than the cap is a bucket of its own (so
a cap of 0 gives one bucket per layer, and a cap beyond the buffer one bucket). The same
layout and cap give every rank the same buckets, posted in the same order.
"""
from __future__ import annotations

import math


def layer_ranges(layout: list) -> list[tuple[int, int]]:
    """[(start, stop)] of each layer's parameters in the flat buffer, in buffer order; a layer is the entries of
    `layout` (`[(name, shape)]`) whose names share the part before "/" (all of a name without one)."""
    ranges, offset = [], 0
    for name, shape in layout:
        size = math.prod(shape)
        layer = name.split("/", 1)[0]
        if ranges and ranges[-1][0] == layer:
            ranges[-1][2] += size
        else:
            ranges.append([layer, offset, offset + size])
        offset += size
    return [(start, stop) for _, start, stop in ranges]


def gradient_buckets(layout: list, cap_bytes: float, itemsize: int) -> list[tuple[int, int]]:
    """The buckets of a flat buffer of `layout`, as [(start, stop)] from the buffer's end to its start."""
    buckets = []
    for start, stop in reversed(layer_ranges(layout)):
        if buckets and (buckets[-1][1] - start) * itemsize <= cap_bytes:
            buckets[-1] = (start, buckets[-1][1])  # the layer joins the bucket below it
        else:
            buckets.append((start, stop))
    return buckets
