"""Attention's row-wise passes: the masked softmax of a score matrix, and its backward.

    masked_softmax(scores, lengths, causal, out)   # scores (B, H, T, T); out = softmax over the keys a query sees
    softmax_backward(dp, p, out)                   # out = p * (dp - sum(dp * p)) along the keys

A query of sequence b sees the keys j < lengths[b] (its valid steps; `lengths` None: every step), and with `causal`
only j <= its own step; the others get probability exactly 0. Every query of a sequence of at least one step sees
at least key 0, padded queries included (their outputs reach nobody); the queries of a sequence of no steps (an
empty bag read as tokens) see no key, and all their weights are 0. One thread per (b, h) pair runs its rows in float64 sums:
the row's maximum first (for exp's range), then the exponentials and their sum, then the division. The backward's
row sum of dp * p is taken in float64 too. Nothing is allocated. numpy arrays run the numba kernels, other arrays
(cupy) the references.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference


@njit(parallel=True, cache=True)
def _masked_softmax_cpu(scores, lengths, use_lengths, causal, out):
    batch, heads, queries, keys = scores.shape
    for bh in prange(batch * heads):
        b, h = bh // heads, bh % heads
        seen = lengths[b] if use_lengths else keys
        for i in range(queries):
            last = min(seen, i + 1) if causal else seen
            top = -np.inf
            for j in range(last):
                top = max(top, scores[b, h, i, j])
            total = 0.0
            for j in range(last):
                e = math.exp(scores[b, h, i, j] - top)
                out[b, h, i, j] = e
                total += e
            inv = 1.0 / total
            for j in range(last):
                out[b, h, i, j] *= inv
            for j in range(last, keys):
                out[b, h, i, j] = 0


@njit(parallel=True, cache=True)
def _softmax_backward_cpu(dp, p, out):
    batch, heads, queries, keys = dp.shape
    for bh in prange(batch * heads):
        b, h = bh // heads, bh % heads
        for i in range(queries):
            dot = 0.0
            for j in range(keys):
                dot += dp[b, h, i, j] * p[b, h, i, j]
            for j in range(keys):
                out[b, h, i, j] = p[b, h, i, j] * (dp[b, h, i, j] - dot)


@numpy_or_reference("masked_softmax_reference")
def masked_softmax(scores, lengths, causal: bool, out) -> None:
    """out = the softmax of each query's row of `scores` (B, H, T, T) over the keys it sees (the module
    docstring), 0 at the others. `out` may be `scores`."""
    use_lengths = lengths is not None
    _masked_softmax_cpu(scores, lengths if use_lengths else np.zeros(1, np.int64), use_lengths, causal, out)


@numpy_or_reference("softmax_backward_reference")
def softmax_backward(dp, p, out) -> None:
    """out = p * (dp - sum over the keys of dp * p), the gradient of the scores from that of the softmax `p`."""
    _softmax_backward_cpu(dp, p, out)


def seen_keys(xp, lengths, queries: int, keys: int, causal: bool):
    """(B or 1, 1, T, T) bools: key j is seen by query i of sequence b (the module docstring)."""
    j = xp.arange(keys)[None, None, None, :]
    seen = j < (lengths[:, None, None, None] if lengths is not None else keys)
    if causal:
        seen = seen & (j <= xp.arange(queries)[None, None, :, None])
    return seen


def masked_softmax_reference(scores, lengths, causal, out) -> None:
    xp = array_module(scores)
    seen = seen_keys(xp, lengths, scores.shape[2], scores.shape[3], causal)
    masked = xp.where(seen, scores, -xp.inf)
    top = masked.max(axis=-1, keepdims=True)
    e = xp.exp(masked - xp.where(top > -xp.inf, top, 0))  # a row that sees no key: exp(-inf) = 0 throughout ...
    total = e.sum(axis=-1, keepdims=True)
    out[...] = e / xp.where(total > 0, total, 1)  # ... and its weights 0, as the CPU kernel's


def softmax_backward_reference(dp, p, out) -> None:
    out[...] = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
