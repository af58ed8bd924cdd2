"""Max pooling on a GPU, forward and backward one launch each, where the references built every window (im2col),
then a one-hot gradient and col2im.

- `max_pool`: a thread per output, scanning its window's part inside the image in row-major order with the CPU
  kernel's selects, so `where` is the same first largest element (the side-by-side 2 x 2 windows the CPU runs
  through kernels of their own take this path: the same values, the same `where`).
- `max_pool_backward`: a thread per input pixel, adding the gradient of every window whose maximum it was, in the
  windows' order, as the CPU kernels add them: the same sums, and no two threads write one pixel.

The arguments are those of kernels/pool.py's functions. Under the CUDA simulator the same kernels run on numpy
arrays (tests/harness/cuda_kernels_check.py).
"""
from __future__ import annotations

from numba import cuda

from .cuda_launch import launch_over
from .im2col import Geometry
from .im2col_cuda import nchw_index, window_at

BLOCK = 256


@cuda.jit
def _max_pool(x, kh, kw, stride, pad_top, pad_left, out, where):
    k = cuda.grid(1)
    if k < out.size:
        b, ch, p, q = nchw_index(k, out.shape)
        h, w = x.shape[2], x.shape[3]
        top, left = p * stride - pad_top, q * stride - pad_left
        i_start, j_start = max(0, -top), max(0, -left)  # the window's first row and column inside the image
        best, best_at = x[b, ch, top + i_start, left + j_start], i_start * kw + j_start
        for i in range(i_start, min(kh, h - top)):
            for j in range(j_start, min(kw, w - left)):
                v = x[b, ch, top + i, left + j]
                better = v > best
                best = max(v, best)
                best_at += better * (i * kw + j - best_at)
        out[b, ch, p, q] = best
        where[b, ch, p, q] = best_at


@cuda.jit
def _max_pool_backward(dy, where, kh, kw, stride, pad_top, pad_left, out):
    k = cuda.grid(1)
    if k < out.size:
        b, ch, r, col = nchw_index(k, out.shape)
        out[b, ch, r, col] = 0
        for i in range(kh - 1, -1, -1):  # the windows in the CPU's order: p grows as i falls, q as j does
            for j in range(kw - 1, -1, -1):
                p, q = window_at(r, col, i, j, stride, pad_top, pad_left, dy.shape[2], dy.shape[3])
                if p >= 0 and where[b, ch, p, q] == i * kw + j:
                    out[b, ch, r, col] += dy[b, ch, p, q]


def max_pool(x, g: Geometry, out, where) -> None:
    """kernels.pool.max_pool on device arrays."""
    launch_over(_max_pool, out.size, BLOCK, x, *g.kernel, g.stride, g.pad_top, g.pad_left, out, where)


def max_pool_backward(dy, where, g: Geometry, out) -> None:
    """kernels.pool.max_pool_backward on device arrays."""
    launch_over(_max_pool_backward, out.size, BLOCK, dy, where, *g.kernel, g.stride, g.pad_top, g.pad_left, out)
