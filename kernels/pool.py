"""Max pooling in one pass: each window's largest value and where it is, and the gradient back.

    max_pool(x, g, y, where)             # x (N, C, H, W); g: the window geometry of x (`im2col.geometry`)
    max_pool_backward(dy, where, g, dx)

Both write into the arrays they are given (workspace arrays), so a step allocates nothing.
`where` (int32) is the window-local index (row-major in the window) of the first largest
element, so ties (ReLU zeros) send the gradient to one element only. numpy arrays run numba
kernels parallel over (image, channel). The forward kernel loops over the view of each window's
part inside the image (indices from 0: numba's negative-index check on computed indices ran
2x slower) and keeps the maximum and its index with selects, not branches: which element wins
is data, so a branch mispredicts about once a window (2-3x slower on LeNet's pools). The
backward kernel zeroes its image channel and adds each window's gradient at its maximum (one
thread per image channel, so overlapping windows never race; a gather over each pixel's windows was slower:
docs/benchmarks.md#measurements-behind-the-code).
The common pool, 2 x 2 windows side by side inside the image (`side_by_side_pairs`: pool 2,
stride 2, no padding), has kernels of its own: two row pairs read in step, each window's four
values compared with selects written out, and backward writing every pixel once (no window
overlaps another), with no view or loop per window, which the general kernels pay for: 6-10x
faster on LeNet's and the residual net's pools (docs/benchmarks.md).
Inputs may be any strided views. Device arrays (cupy) run kernels/pool_cuda.py's numba-CUDA kernels, one launch
each; any other array module the reference: im2col windows, max and argmax; one-hot gradients, col2im.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference
from .im2col import Geometry, col2im_reference, im2col_reference


@numpy_or_reference("max_pool_reference", gpu=".pool_cuda")
def max_pool(x, g: Geometry, out, where) -> None:
    """`out` (N, C, OH, OW) = the max of each window; `where` (int32, same shape) = the window index of its first
    maximum. Pixels outside the image never win."""
    if side_by_side_pairs(g):
        _max_pool_pairs_cpu(x, out, where)
    else:
        _max_pool_cpu(x, g.kernel[0], g.kernel[1], g.stride, g.pad_top, g.pad_left, out, where)


@numpy_or_reference("max_pool_backward_reference", gpu=".pool_cuda")
def max_pool_backward(dy, where, g: Geometry, out) -> None:
    """`out` (N, C, H, W) = the input gradient: each dy added to the element its window's maximum came from."""
    if side_by_side_pairs(g):
        _max_pool_pairs_backward_cpu(dy, where, out)
    else:
        _max_pool_backward_cpu(dy, where, g.kernel[0], g.kernel[1], g.stride, g.pad_top, g.pad_left, out)


def side_by_side_pairs(g: Geometry) -> bool:
    """Whether `g`'s windows are 2 x 2 blocks side by side inside the image: pool 2, stride 2, no padding (an odd
    last row or column is in no window)."""
    return (g.kernel == (2, 2) and g.stride == 2 and g.pad_top == g.pad_left == 0 and
            2 * g.out_height <= g.height and 2 * g.out_width <= g.width)


def max_pool_reference(x, g: Geometry, out, where) -> None:
    """max_pool of any array module: the windows (im2col with -inf outside), their max and argmax."""
    n = len(x)
    windows = array_module(x).empty((n, *g.cols_shape), dtype=x.dtype)
    im2col_reference(x, g, -math.inf, windows)
    windows = windows.reshape(n, g.out_height, g.out_width, g.channels, -1).transpose(0, 3, 1, 2, 4)
    windows.max(axis=-1, out=out)
    where[...] = windows.argmax(axis=-1)


def max_pool_backward_reference(dy, where, g: Geometry, out) -> None:
    """max_pool_backward of any array module: one-hot window gradients, added back by col2im."""
    xp = array_module(dy)
    first_largest = xp.arange(math.prod(g.kernel)) == where[..., None]
    dcols = (first_largest * dy[..., None]).transpose(0, 2, 3, 1, 4).reshape(len(dy), *g.cols_shape)
    col2im_reference(dcols, g, out)


@njit(parallel=True, cache=True)
def _max_pool_cpu(x, kh, kw, stride, pad_top, pad_left, out, where):
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for image in prange(n * c):
        b, ch = image // c, image % c
        for p in range(oh):
            top = p * stride - pad_top
            i_start = max(0, -top)  # the window's first row inside the image
            for q in range(ow):
                left = q * stride - pad_left
                j_start = max(0, -left)
                inside = x[b, ch, top + i_start:min(top + kh, h), left + j_start:min(left + kw, w)]
                best, best_at = inside[0, 0], i_start * kw + j_start  # never empty: padding is narrower than a window
                for i in range(inside.shape[0]):
                    for j in range(inside.shape[1]):
                        v = inside[i, j]
                        better = v > best
                        best = max(v, best)
                        best_at += better * ((i_start + i) * kw + j_start + j - best_at)  # a select, no branch
                out[b, ch, p, q] = best
                where[b, ch, p, q] = best_at


@njit(parallel=True, cache=True)
def _max_pool_backward_cpu(dy, where, kh, kw, stride, pad_top, pad_left, out):
    n, c, h, w = out.shape
    oh, ow = dy.shape[2], dy.shape[3]
    for image in prange(n * c):  # each image channel is one thread's: its scatter never races
        b, ch = image // c, image % c
        for r in range(h):
            for col in range(w):
                out[b, ch, r, col] = 0
        for p in range(oh):
            for q in range(ow):
                at = where[b, ch, p, q]
                out[b, ch, p * stride - pad_top + at // kw, q * stride - pad_left + at % kw] += dy[b, ch, p, q]


@njit(parallel=True, cache=True)
def _max_pool_pairs_cpu(x, out, where):
    n, c = x.shape[0], x.shape[1]
    oh, ow = out.shape[2], out.shape[3]
    for image in prange(n * c):
        b, ch = image // c, image % c
        for p in range(oh):
            upper, lower = x[b, ch, 2 * p], x[b, ch, 2 * p + 1]
            for q in range(ow):
                a, a_right, d, d_right = upper[2 * q], upper[2 * q + 1], lower[2 * q], lower[2 * q + 1]
                top, bottom = max(a, a_right), max(d, d_right)
                top_at, bottom_at = np.int32(a_right > a), np.int32(2 + (d_right > d))  # the first largest of a row
                out[b, ch, p, q] = max(top, bottom)
                where[b, ch, p, q] = top_at + (bottom > top) * (bottom_at - top_at)


@njit(parallel=True, cache=True)
def _max_pool_pairs_backward_cpu(dy, where, out):
    n, c, h, w = out.shape
    oh, ow = dy.shape[2], dy.shape[3]
    zero = out.dtype.type(0)
    for image in prange(n * c):
        b, ch = image // c, image % c
        for p in range(oh):
            for i in range(2):
                row = out[b, ch, 2 * p + i]
                for q in range(ow):
                    at, d = where[b, ch, p, q] - 2 * i, dy[b, ch, p, q]
                    row[2 * q] = d if at == 0 else zero
                    row[2 * q + 1] = d if at == 1 else zero
                for col in range(2 * ow, w):  # an odd last column: in no window
                    row[col] = zero
        for r in range(2 * oh, h):  # an odd last row
            for col in range(w):
                out[b, ch, r, col] = zero
