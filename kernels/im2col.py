"""im2col / col2im for NCHW images: convolution and pooling as one GEMM or one reduction.

    cols = im2col(x, geometry)        # (N, OH, OW, C, KH, KW): one row per output pixel
    dx = col2im(dcols, geometry)      # the adjoint: each window's values added back

A row (n, oh, ow) holds the C*KH*KW input values its output pixel sees, so a convolution is
`cols.reshape(N*OH*OW, -1) @ W.reshape(F, -1).T`. Pixels outside the image read `fill`
(0 for convolution and average pooling, -inf for max pooling).
numpy arrays run numba kernels parallel over the batch (each image is one thread's, so
col2im never races); other arrays (cupy) run the reference, written for any array module:
im2col copies one strided view of all windows, col2im adds one strided slice per kernel
offset; the tests compare both element for element.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

PADDINGS = ("valid", "same")


@dataclass(frozen=True)
class Geometry:
    """Where a window of `kernel` with `stride` and padding lands on a C x H x W input."""

    channels: int
    height: int
    width: int
    kernel: tuple[int, int]
    stride: int
    pad_top: int
    pad_left: int
    out_height: int
    out_width: int

    @property
    def cols_shape(self) -> tuple[int, ...]:
        return (self.out_height, self.out_width, self.channels, *self.kernel)


def geometry(input_shape, kernel, stride: int = 1, padding: str = "valid") -> Geometry:
    """The window geometry; `same` pads like TensorFlow (output = ceil(size / stride), extra pad at the end)."""
    channels, height, width = input_shape
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
    if padding == "valid":
        oh, ow = (height - kh) // stride + 1, (width - kw) // stride + 1
        pads = (0, 0)
    elif padding == "same":
        oh, ow = math.ceil(height / stride), math.ceil(width / stride)
        pads = (max((oh - 1) * stride + kh - height, 0) // 2, max((ow - 1) * stride + kw - width, 0) // 2)
    else:
        raise ValueError(f"padding {padding!r}, expected one of {PADDINGS}")
    if oh < 1 or ow < 1:
        raise ValueError(f"a {kh}x{kw} window with stride {stride} and {padding!r} padding does not fit "
                         f"an input of {height}x{width}")
    return Geometry(channels, height, width, (kh, kw), stride, *pads, oh, ow)


def im2col(x, g: Geometry, fill: float = 0.0):
    """The windows of `x` (N, C, H, W) as a new (N, OH, OW, C, KH, KW) array."""
    out = _empty_like(x, (len(x), *g.cols_shape))
    if isinstance(x, np.ndarray):
        _im2col_cpu(np.ascontiguousarray(x), g.stride, g.pad_top, g.pad_left, x.dtype.type(fill), out)
    else:
        im2col_reference(x, g, fill, out)
    return out


def col2im(cols, g: Geometry):
    """The adjoint of `im2col` (fill 0): a new (N, C, H, W) array, each window's values added in."""
    out = _empty_like(cols, (len(cols), g.channels, g.height, g.width))
    if isinstance(cols, np.ndarray):
        _col2im_cpu(np.ascontiguousarray(cols), g.stride, g.pad_top, g.pad_left, out)
    else:
        col2im_reference(cols, g, out)
    return out


def _empty_like(array, shape):
    from mpitrain.backend import array_module
    return array_module(array).empty(shape, dtype=array.dtype)


def _padded(xp, n: int, g: Geometry, dtype, fill: float):
    """A filled (N, C, Hp, Wp) buffer large enough for every window, and the image's slice in it."""
    kh, kw = g.kernel
    hp = max((g.out_height - 1) * g.stride + kh, g.pad_top + g.height)
    wp = max((g.out_width - 1) * g.stride + kw, g.pad_left + g.width)
    padded = xp.full((n, g.channels, hp, wp), fill, dtype=dtype)
    inside = (slice(None), slice(None), slice(g.pad_top, g.pad_top + g.height),
              slice(g.pad_left, g.pad_left + g.width))
    return padded, inside


def im2col_reference(x, g: Geometry, fill: float = 0.0, out=None):
    """im2col of any array module (numpy or cupy): the padded images seen through one strided view of
    every window, copied once (on a GPU, one copy kernel instead of one per kernel offset)."""
    from mpitrain.backend import array_module
    xp = array_module(x)
    padded, inside = _padded(xp, len(x), g, x.dtype, fill)
    padded[inside] = x
    s = g.stride
    step_n, step_c, step_h, step_w = padded.strides
    windows = xp.lib.stride_tricks.as_strided(padded, (len(x), *g.cols_shape),
                                              (step_n, s * step_h, s * step_w, step_c, step_h, step_w))
    if out is None:
        return xp.ascontiguousarray(windows)
    out[...] = windows
    return out


def col2im_reference(cols, g: Geometry, out=None):
    """col2im with strided slices of any array module (numpy or cupy)."""
    from mpitrain.backend import array_module
    xp = array_module(cols)
    padded, inside = _padded(xp, len(cols), g, cols.dtype, 0)
    s, (kh, kw) = g.stride, g.kernel
    for i in range(kh):
        for j in range(kw):
            padded[:, :, i:i + s * g.out_height:s, j:j + s * g.out_width:s] += cols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    if out is None:
        return padded[inside].copy()
    out[...] = padded[inside]
    return out


@njit(parallel=True, cache=True)
def _im2col_cpu(x, stride, pad_top, pad_left, fill, out):
    n, c, h, w = x.shape
    oh, ow, kh, kw = out.shape[1], out.shape[2], out.shape[4], out.shape[5]
    for b in prange(n):
        for p in range(oh):
            for q in range(ow):
                for ch in range(c):
                    for i in range(kh):
                        r = p * stride - pad_top + i
                        for j in range(kw):
                            col = q * stride - pad_left + j
                            if 0 <= r < h and 0 <= col < w:
                                out[b, p, q, ch, i, j] = x[b, ch, r, col]
                            else:
                                out[b, p, q, ch, i, j] = fill


@njit(parallel=True, cache=True)
def _col2im_cpu(cols, stride, pad_top, pad_left, out):
    n, c, h, w = out.shape
    oh, ow, kh, kw = cols.shape[1], cols.shape[2], cols.shape[4], cols.shape[5]
    for b in prange(n):
        out[b] = 0
        for p in range(oh):
            for q in range(ow):
                for ch in range(c):
                    for i in range(kh):
                        r = p * stride - pad_top + i
                        if 0 <= r < h:
                            for j in range(kw):
                                col = q * stride - pad_left + j
                                if 0 <= col < w:
                                    out[b, ch, r, col] += cols[b, p, q, ch, i, j]
