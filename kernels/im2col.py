"""im2col / col2im for NCHW images: convolution and pooling as one GEMM or one reduction.

    im2col(x, geometry, fill, cols)   # cols (N, OH, OW, C, KH, KW): one row per output pixel
    col2im(dcols, geometry, dx)       # the adjoint: dx (N, C, H, W), each window's values added back
    im2col_channels_last(x, geometry, image, cols)   # cols (N, OH, OW, KH, KW, C); image (N, H, W, C) scratch
    col2im_channels_last(dcols, geometry, image, dx)  # its adjoint, through the same scratch

Both write into the array they are given (a workspace array), so a step allocates nothing.
A row (n, oh, ow) holds the C*KH*KW input values its output pixel sees, so a convolution is
`cols.reshape(N*OH*OW, -1) @ W.reshape(F, -1).T`. Pixels outside the image read `fill`
(0 for convolution and average pooling, -inf for max pooling).
numpy arrays run numba kernels, on any strided views. im2col is parallel over (image,
output row); a window row that lies inside the image is a plain copy, tested once, not per
pixel. col2im is parallel over images: each thread zeroes its image, then reads `cols` in
order and adds each window row into its image's pixels (a scatter, but no two threads write
one image, so no race). Reading `cols` once in memory order beat a gather over each pixel's
windows, whose short loops of varying length ran 1.5-3x slower
(docs/benchmarks.md#measurements-behind-the-code). Device arrays (cupy) run kernels/im2col_cuda.py's gathers,
one launch each (col2im there is a gather over each pixel's windows: a GPU has a thread for every pixel). Any
other array module runs the reference, written for any array module: im2col copies one strided view of all windows, col2im adds one strided slice
per kernel offset into a padded buffer it allocates; the tests compare both with the kernels.

The channels-last pair orders a row by kernel offset, then channel: the images are first transposed
to (N, H, W, C) (`image`, a scratch array), so each of a window's pixels is one run of C values
copied or added at once, where the channels-first order copies runs of KW values read C times
from far apart. One thread, the transpose included: with 32 channels (3x3, 28x28, batch 32)
im2col took 2.1 ms against 8.0 and col2im 2.3 against 7.3; with 64 (14x14) 0.7 against 4.3 and
0.8 against 3.6; with 20 (LeNet's second layer, 5x5, batch 64) 0.6 against 1.2 and 0.4 against
1.5. With 1 channel it is 7x slower, so a conv2d layer uses it from `CHANNELS_LAST_FROM` input
channels on (mpitrain/nn/conv.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from numba import njit, prange

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference

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


@numpy_or_reference("im2col_reference", gpu=".im2col_cuda")
def im2col(x, g: Geometry, fill: float, out) -> None:
    """Write the windows of `x` (N, C, H, W) into `out` (N, OH, OW, C, KH, KW); pixels outside read `fill`."""
    _im2col_cpu(x, g.stride, g.pad_top, g.pad_left, x.dtype.type(fill), out)


@numpy_or_reference("col2im_reference", gpu=".im2col_cuda")
def col2im(cols, g: Geometry, out) -> None:
    """The adjoint of `im2col` (fill 0): `out` (N, C, H, W) = the sum of each window's values in `cols`."""
    _col2im_cpu(cols, g.stride, g.pad_top, g.pad_left, out)


@numpy_or_reference("im2col_channels_last_reference", gpu=".im2col_cuda")
def im2col_channels_last(x, g: Geometry, image, out) -> None:
    """Write the windows of `x` (N, C, H, W) into `out` (N, OH, OW, KH, KW, C), pixels outside reading 0, through
    `image` (N, H, W, C), which it overwrites."""
    _channels_last_cpu(x, image)
    _im2col_channels_last_cpu(image, g.stride, g.pad_top, g.pad_left, out)


@numpy_or_reference("col2im_channels_last_reference", gpu=".im2col_cuda")
def col2im_channels_last(cols, g: Geometry, image, out) -> None:
    """The adjoint of `im2col_channels_last`: `out` (N, C, H, W) = the sum of each window's values in `cols`
    (N, OH, OW, KH, KW, C), added up in `image` (N, H, W, C), which it overwrites."""
    _col2im_channels_last_cpu(cols, g.stride, g.pad_top, g.pad_left, image, out)


def _padded(xp, n: int, g: Geometry, dtype, fill: float):
    """A new filled (N, C, Hp, Wp) buffer large enough for every window, and the image's slice in it."""
    kh, kw = g.kernel
    hp = max((g.out_height - 1) * g.stride + kh, g.pad_top + g.height)
    wp = max((g.out_width - 1) * g.stride + kw, g.pad_left + g.width)
    padded = xp.full((n, g.channels, hp, wp), fill, dtype=dtype)
    inside = (slice(None), slice(None), slice(g.pad_top, g.pad_top + g.height),
              slice(g.pad_left, g.pad_left + g.width))
    return padded, inside


def im2col_reference(x, g: Geometry, fill: float, out) -> None:
    """im2col of any array module (numpy or cupy): the padded images seen through one strided view of
    every window, copied once into `out` (on a GPU, one copy kernel instead of one per kernel offset)."""
    xp = array_module(x)
    padded, inside = _padded(xp, len(x), g, x.dtype, fill)
    padded[inside] = x
    s = g.stride
    step_n, step_c, step_h, step_w = padded.strides
    out[...] = xp.lib.stride_tricks.as_strided(padded, (len(x), *g.cols_shape),
                                               (step_n, s * step_h, s * step_w, step_c, step_h, step_w))


def col2im_reference(cols, g: Geometry, out) -> None:
    """col2im with strided slices of any array module (numpy or cupy), through a padded buffer."""
    xp = array_module(cols)
    padded, inside = _padded(xp, len(cols), g, cols.dtype, 0)
    s, (kh, kw) = g.stride, g.kernel
    for i in range(kh):
        for j in range(kw):
            padded[:, :, i:i + s * g.out_height:s, j:j + s * g.out_width:s] += cols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    out[...] = padded[inside]


def im2col_channels_last_reference(x, g: Geometry, image, out) -> None:
    """im2col_channels_last of any array module: one strided view of every window of the padded, transposed
    images, copied once."""
    xp = array_module(x)
    padded, inside = _padded(xp, len(x), g, x.dtype, 0.0)
    padded[inside] = x
    padded = xp.ascontiguousarray(padded.transpose(0, 2, 3, 1))
    s, (kh, kw) = g.stride, g.kernel
    step_n, step_h, step_w, step_c = padded.strides
    out[...] = xp.lib.stride_tricks.as_strided(padded, (len(x), g.out_height, g.out_width, kh, kw, g.channels),
                                               (step_n, s * step_h, s * step_w, step_h, step_w, step_c))


def col2im_channels_last_reference(cols, g: Geometry, image, out) -> None:
    """col2im_channels_last of any array module: `col2im_reference` of the windows in channels-first order."""
    col2im_reference(cols.transpose(0, 1, 2, 5, 3, 4), g, out)


@njit(parallel=True, cache=True)
def _channels_last_cpu(x, out):
    n, c, h, w = x.shape
    for br in prange(n * h):
        b, r = br // h, br % h
        for col in range(w):
            for ch in range(c):
                out[b, r, col, ch] = x[b, ch, r, col]


@njit(parallel=True, cache=True)
def _im2col_channels_last_cpu(image, stride, pad_top, pad_left, out):
    n, h, w, c = image.shape
    oh, ow, kh, kw = out.shape[1], out.shape[2], out.shape[3], out.shape[4]
    for bp in prange(n * oh):
        b, p = bp // oh, bp % oh
        for q in range(ow):
            for i in range(kh):
                r = p * stride - pad_top + i
                for j in range(kw):
                    col = q * stride - pad_left + j
                    if 0 <= r < h and 0 <= col < w:  # loops over the channels: 2x faster than slices at 20
                        for ch in range(c):
                            out[b, p, q, i, j, ch] = image[b, r, col, ch]
                    else:
                        for ch in range(c):
                            out[b, p, q, i, j, ch] = 0


@njit(parallel=True, cache=True)
def _col2im_channels_last_cpu(cols, stride, pad_top, pad_left, image, out):
    n, h, w, c = image.shape
    oh, ow, kh, kw = cols.shape[1], cols.shape[2], cols.shape[3], cols.shape[4]
    for b in prange(n):  # one thread per image: its scatter never races
        image[b] = 0
        for p in range(oh):
            for q in range(ow):
                for i in range(kh):
                    r = p * stride - pad_top + i
                    if 0 <= r < h:
                        for j in range(kw):
                            col = q * stride - pad_left + j
                            if 0 <= col < w:  # a loop, not a slice's +=, which numba computes in a new array
                                for ch in range(c):
                                    image[b, r, col, ch] += cols[b, p, q, i, j, ch]
        for ch in range(c):
            for r in range(h):
                for col in range(w):
                    out[b, ch, r, col] = image[b, r, col, ch]


@njit(parallel=True, cache=True)
def _im2col_cpu(x, stride, pad_top, pad_left, fill, out):
    n, c, h, w = x.shape
    oh, ow, kh, kw = out.shape[1], out.shape[2], out.shape[4], out.shape[5]
    for bp in prange(n * oh):
        b, p = bp // oh, bp % oh
        for q in range(ow):
            left = q * stride - pad_left
            columns_inside = left >= 0 and left + kw <= w
            for ch in range(c):
                for i in range(kh):
                    r = p * stride - pad_top + i
                    if 0 <= r < h and columns_inside:  # a plain copy of kw pixels: no test per pixel
                        for j in range(kw):
                            out[b, p, q, ch, i, j] = x[b, ch, r, left + j]
                    else:
                        for j in range(kw):
                            col = left + j
                            out[b, p, q, ch, i, j] = x[b, ch, r, col] if 0 <= r < h and 0 <= col < w else fill


@njit(parallel=True, cache=True)
def _col2im_cpu(cols, stride, pad_top, pad_left, out):
    n, c, h, w = out.shape
    oh, ow = cols.shape[1], cols.shape[2]
    kh, kw = cols.shape[4], cols.shape[5]
    for b in prange(n):  # one thread per image: its scatter never races
        for ch in range(c):
            for r in range(h):
                for col in range(w):
                    out[b, ch, r, col] = 0
        for p in range(oh):
            for q in range(ow):
                left = q * stride - pad_left
                columns_inside = 0 <= left and left + kw <= w
                for ch in range(c):
                    for i in range(kh):
                        r = p * stride - pad_top + i
                        if 0 <= r < h:
                            for j in range(kw):
                                col = left + j
                                if columns_inside or 0 <= col < w:
                                    out[b, ch, r, col] += cols[b, p, q, ch, i, j]
