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

from .cuda_launch import launch
from .im2col import Geometry

BLOCK = 256


@cuda.jit(device=True)
def _window_pixel(x, b, ch, p, q, i, j, stride, pad_top, pad_left, fill):
    """Pixel (i, j) of window (p, q) of image b, channel ch, or `fill` outside the image."""
    r, col = p * stride - pad_top + i, q * stride - pad_left + j
    return x[b, ch, r, col] if 0 <= r < x.shape[2] and 0 <= col < x.shape[3] else fill


@cuda.jit
def _im2col(x, stride, pad_top, pad_left, fill, out):
    k = cuda.grid(1)
    if k < out.size:
        oh, ow, c, kh, kw = out.shape[1], out.shape[2], out.shape[3], out.shape[4], out.shape[5]
        k, j = k // kw, k % kw
        k, i = k // kh, k % kh
        k, ch = k // c, k % c
        k, q = k // ow, k % ow
        b, p = k // oh, k % oh
        out[b, p, q, ch, i, j] = _window_pixel(x, b, ch, p, q, i, j, stride, pad_top, pad_left, fill)


@cuda.jit
def _im2col_channels_last(x, stride, pad_top, pad_left, fill, out):
    k = cuda.grid(1)
    if k < out.size:
        oh, ow, kh, kw, c = out.shape[1], out.shape[2], out.shape[3], out.shape[4], out.shape[5]
        k, ch = k // c, k % c
        k, j = k // kw, k % kw
        k, i = k // kh, k % kh
        k, q = k // ow, k % ow
        b, p = k // oh, k % oh
        out[b, p, q, i, j, ch] = _window_pixel(x, b, ch, p, q, i, j, stride, pad_top, pad_left, fill)


@cuda.jit
def _col2im(cols, stride, pad_top, pad_left, channels_last, out):
    k = cuda.grid(1)
    if k < out.size:
        c, h, w = out.shape[1], out.shape[2], out.shape[3]
        oh, ow = cols.shape[1], cols.shape[2]
        kh, kw = (cols.shape[3], cols.shape[4]) if channels_last else (cols.shape[4], cols.shape[5])
        k, col = k // w, k % w
        k, r = k // h, k % h
        b, ch = k // c, k % c
        out[b, ch, r, col] = 0
        for i in range(kh - 1, -1, -1):  # the windows' rows from the first: p grows as i falls
            top = r + pad_top - i
            if top >= 0 and top % stride == 0 and top // stride < oh:
                for j in range(kw - 1, -1, -1):
                    left = col + pad_left - j
                    if left >= 0 and left % stride == 0 and left // stride < ow:
                        p, q = top // stride, left // stride
                        out[b, ch, r, col] += cols[b, p, q, i, j, ch] if channels_last else cols[b, p, q, ch, i, j]


def _blocks(count: int) -> int:
    return (count + BLOCK - 1) // BLOCK


def im2col(x, g: Geometry, fill: float, out) -> None:
    """kernels.im2col.im2col on device arrays."""
    if out.size:
        launch(_im2col, _blocks(out.size), BLOCK, x, g.stride, g.pad_top, g.pad_left, x.dtype.type(fill), out)


def col2im(cols, g: Geometry, out) -> None:
    """kernels.im2col.col2im on device arrays."""
    if out.size:
        launch(_col2im, _blocks(out.size), BLOCK, cols, g.stride, g.pad_top, g.pad_left, False, out)


def im2col_channels_last(x, g: Geometry, image, out) -> None:
    """kernels.im2col.im2col_channels_last on device arrays (`image` is not used)."""
    if out.size:
        launch(_im2col_channels_last, _blocks(out.size), BLOCK, x, g.stride, g.pad_top, g.pad_left,
               x.dtype.type(0), out)


def col2im_channels_last(cols, g: Geometry, image, out) -> None:
    """kernels.im2col.col2im_channels_last on device arrays (`image` is not used)."""
    if out.size:
        launch(_col2im, _blocks(out.size), BLOCK, cols, g.stride, g.pad_top, g.pad_left, True, out)
