"""im2col and col2im on a GPU, each one gather in one launch, where the references made a padded copy and one strided
slice per kernel offset.

- `im2col` and `im2col_channels_last`: a thread per element of `out`, reading its pixel of `x` (or the fill
  outside the image). The channels-last form reads `x` (N, C, H, W) directly: its `image` scratch is not needed.
- `col2im` and `col2im_channels_last`: a thread per pixel of `out`, adding the values of every window that covers
  it, in the order of the windows (rows, then columns) that the CPU kernels add them in, into `out` itself: the
  sums are the CPU's, bit for bit, and no two threads write one pixel.

The arguments are those of kernels/im2col.py's functions. Under the CUDA simulator the same kernels run on numpy
arrays (tests/harness/cuda_kernels_check.py).
"""
from __future__ import annotations

from numba import cuda

from .cuda_launch import launch_over
from .im2col import Geometry

BLOCK = 256


@cuda.jit(device=True)
def nchw_index(k, shape):
    """Element k of a C-ordered (N, C, H, W) array, as (n, c, h, w)."""
    k, w = k // shape[3], k % shape[3]
    k, h = k // shape[2], k % shape[2]
    return k // shape[1], k % shape[1], h, w


@cuda.jit(device=True)
def window_at(r, col, i, j, stride, pad_top, pad_left, oh, ow):
    """The window (p, q) whose pixel (i, j) is image pixel (r, col), or (-1, -1) if no window's is."""
    top, left = r + pad_top - i, col + pad_left - j
    if top >= 0 and left >= 0 and top % stride == 0 and left % stride == 0 and top // stride < oh \
            and left // stride < ow:
        return top // stride, left // stride
    return -1, -1


@cuda.jit
def _im2col(x, stride, pad_top, pad_left, fill, channels_last, out):
    k = cuda.grid(1)
    if k < out.size:
        if channels_last:  # out (N, OH, OW, KH, KW, C)
            kh, kw, c = out.shape[3], out.shape[4], out.shape[5]
            k, ch = k // c, k % c
            k, j = k // kw, k % kw
            k, i = k // kh, k % kh
        else:  # out (N, OH, OW, C, KH, KW)
            c, kh, kw = out.shape[3], out.shape[4], out.shape[5]
            k, j = k // kw, k % kw
            k, i = k // kh, k % kh
            k, ch = k // c, k % c
        k, q = k // out.shape[2], k % out.shape[2]
        b, p = k // out.shape[1], k % out.shape[1]
        r, col = p * stride - pad_top + i, q * stride - pad_left + j
        value = x[b, ch, r, col] if 0 <= r < x.shape[2] and 0 <= col < x.shape[3] else fill
        if channels_last:
            out[b, p, q, i, j, ch] = value
        else:
            out[b, p, q, ch, i, j] = value


@cuda.jit
def _col2im(cols, stride, pad_top, pad_left, channels_last, out):
    k = cuda.grid(1)
    if k < out.size:
        b, ch, r, col = nchw_index(k, out.shape)
        kh, kw = (cols.shape[3], cols.shape[4]) if channels_last else (cols.shape[4], cols.shape[5])
        out[b, ch, r, col] = 0
        for i in range(kh - 1, -1, -1):  # the windows in the CPU's order: p grows as i falls, q as j does
            for j in range(kw - 1, -1, -1):
                p, q = window_at(r, col, i, j, stride, pad_top, pad_left, cols.shape[1], cols.shape[2])
                if p >= 0:
                    out[b, ch, r, col] += cols[b, p, q, i, j, ch] if channels_last else cols[b, p, q, ch, i, j]


def im2col(x, g: Geometry, fill: float, out) -> None:
    """kernels.im2col.im2col on device arrays."""
    launch_over(_im2col, out.size, BLOCK, x, g.stride, g.pad_top, g.pad_left, x.dtype.type(fill), False, out)


def col2im(cols, g: Geometry, out) -> None:
    """kernels.im2col.col2im on device arrays."""
    launch_over(_col2im, out.size, BLOCK, cols, g.stride, g.pad_top, g.pad_left, False, out)


def im2col_channels_last(x, g: Geometry, image, out) -> None:
    """kernels.im2col.im2col_channels_last on device arrays (`image` is not used)."""
    launch_over(_im2col, out.size, BLOCK, x, g.stride, g.pad_top, g.pad_left, x.dtype.type(0), True, out)


def col2im_channels_last(cols, g: Geometry, image, out) -> None:
    """kernels.im2col.col2im_channels_last on device arrays (`image` is not used)."""
    launch_over(_col2im, out.size, BLOCK, cols, g.stride, g.pad_top, g.pad_left, True, out)
