"""Max pooling in one pass: each window's largest value and where it is, and the gradient back.

    y, where = max_pool(x, g)          # x (N, C, H, W); g: the window geometry of ONE channel
    dx = max_pool_backward(dy, where, g)

`where` is the window-local index (row-major in the window) of the first largest element,
so ties (ReLU zeros) send the gradient to one element only. numpy arrays run numba kernels
parallel over the batch; other arrays (cupy) run the reference: im2col windows, argmax, col2im.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .im2col import Geometry, col2im, im2col


def max_pool(x, g: Geometry):
    """(the max of each window, (N, C, OH, OW); the window index of the first maximum, int32)."""
    if isinstance(x, np.ndarray):
        n, c = x.shape[:2]
        out = np.empty((n, c, g.out_height, g.out_width), dtype=x.dtype)
        where = np.empty(out.shape, dtype=np.int32)
        _max_pool_cpu(np.ascontiguousarray(x), g.kernel[0], g.kernel[1], g.stride, g.pad_top, g.pad_left, out, where)
        return out, where
    return max_pool_reference(x, g)


def max_pool_backward(dy, where, g: Geometry):
    """The input gradient: each dy added to the element its window's maximum came from."""
    if isinstance(dy, np.ndarray):
        out = np.empty((len(dy), dy.shape[1], g.height, g.width), dtype=dy.dtype)
        _max_pool_backward_cpu(np.ascontiguousarray(dy), where, g.kernel[1], g.stride, g.pad_top, g.pad_left, out)
        return out
    return max_pool_backward_reference(dy, where, g)


def max_pool_reference(x, g: Geometry):
    n, c, h, w = x.shape
    windows = im2col(x.reshape(n * c, 1, h, w), g, -math.inf).reshape(n, c, g.out_height, g.out_width, -1)
    return windows.max(axis=-1), windows.argmax(axis=-1).astype(np.int32)


def max_pool_backward_reference(dy, where, g: Geometry):
    from mpitrain.backend import array_module
    xp = array_module(dy)
    n, c = dy.shape[:2]
    first_largest = xp.arange(math.prod(g.kernel)) == where[..., None]
    dcols = (first_largest * dy[..., None]).reshape(n * c, *g.cols_shape)
    return col2im(dcols, g).reshape(n, c, g.height, g.width)


@njit(parallel=True, cache=True)
def _max_pool_cpu(x, kh, kw, stride, pad_top, pad_left, out, where):
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for b in prange(n):
        for ch in range(c):
            for p in range(oh):
                for q in range(ow):
                    best = -np.inf
                    best_at = 0
                    for i in range(kh):
                        r = p * stride - pad_top + i
                        if 0 <= r < h:
                            for j in range(kw):
                                col = q * stride - pad_left + j
                                if 0 <= col < w and x[b, ch, r, col] > best:
                                    best = x[b, ch, r, col]
                                    best_at = i * kw + j
                    out[b, ch, p, q] = best
                    where[b, ch, p, q] = best_at


@njit(parallel=True, cache=True)
def _max_pool_backward_cpu(dy, where, kw, stride, pad_top, pad_left, out):
    n, c, oh, ow = dy.shape
    for b in prange(n):
        out[b] = 0
        for ch in range(c):
            for p in range(oh):
                for q in range(ow):
                    at = where[b, ch, p, q]
                    out[b, ch, p * stride - pad_top + at // kw, q * stride - pad_left + at % kw] += dy[b, ch, p, q]
