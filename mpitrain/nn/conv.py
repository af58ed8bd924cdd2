"""Spatial layers on NCHW batches: convolution as im2col + one GEMM (or Winograd's), pooling as a reduction of windows.

The GEMM is `kernels.gemm.matmul`, so numpy runs BLAS and cupy runs cuBLAS; im2col/col2im are the
`kernels.im2col` kernels, max pooling the `kernels.pool` ones (numba on the CPU). From
`CHANNELS_LAST_FROM` input channels on, a conv2d layer's windows run channels last (kernel
offset, then channel: a pixel's channels are one run to copy) and its weights are copied into
that order for the GEMM each forward; below it, channels first (a single channel's runs are the
kernel's rows). A conv2d
layer adds its bias, runs its fused activation (`fuse_activation`) and transposes the GEMM's
rows to NCHW in one kernel (`kernels.conv_rows`), and back in backward. Every array a layer
returns or keeps is an array of its workspace (`Layer.ws`), written in place.

On the CPU a conv2d layer whose windows for the whole batch would pass `WHOLE_WINDOWS_UP_TO`
bytes works in chunks of whole images, each chunk's windows about `CHUNK_WINDOWS` bytes: im2col,
GEMM and (backward) the weights' GEMM, the windows' gradient and col2im run on one chunk while
its windows are in cache, and backward builds each chunk's windows again from the layer's input
(kept, not copied: the input is the layer below's workspace array, untouched until the next
step). Whole, the residual net's 28 x 28 x 32 windows are 29 MB a rank, more than the L3 two
ranks share, and OpenBLAS reads them from memory at 58 GFLOP/s where a chunk in cache runs at
87; in chunks of about 2 MB its 3x3 layers ran 20-25% faster (forward and backward, two
processes at once), the rebuilt windows included. LeNet's windows (at most 8 MB at batch 64)
stay whole: chunks made its step 3-6% slower, the rebuilt windows costing more than the cache
saves. A GPU always takes the whole batch. What made conv nets faster besides
(docs/benchmarks.md#measurements-behind-the-code): the channels-last windows, the kernels.

On the CPU a 3x3 layer of stride 1 over WINOGRAD_FROM input channels or more builds no windows: it
runs Winograd's F(2x2, 3x3) (mpitrain/nn/conv_winograd.py), always in chunks of about CHUNK_TILES
bytes of transformed inputs: 4 values per input value where the windows hold 9, and 4/9 of the
multiplications. The residual net's step (one thread, batch 32) went from 102 to 72 ms with it,
PyTorch's (oneDNN) taking 85. Below 8 channels the GEMMs' inner dimension, the channel count, is too
short for OpenBLAS; the stem (1 channel), LeNet (5x5) and strided layers keep im2col.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.kernels.conv_rows import activation_backward_rows, bias_activation_nchw, column_sums
from mpitrain.kernels.gemm import matmul
from mpitrain.kernels.im2col import PADDINGS, col2im, col2im_channels_last, geometry, im2col, im2col_channels_last
from mpitrain.kernels.pool import max_pool, max_pool_backward
from mpitrain.nn.conv_winograd import tile_bytes_per_image, winograd_backward, winograd_forward
from mpitrain.nn.layers import FusesActivation, Layer, initial_weights, layer_type

# From this many input channels a conv2d layer's windows run channels last (`Conv2D.channels_last`).
CHANNELS_LAST_FROM = 8
# On the CPU, windows of a batch beyond this many bytes are built and used in chunks of images (`Conv2D.chunks`),
# each chunk's windows about CHUNK_WINDOWS bytes (one at least: an image's).
WHOLE_WINDOWS_UP_TO = 8 << 20
CHUNK_WINDOWS = 2 << 20
# On the CPU, 3x3 conv2d layers of stride 1 from this many input channels on run Winograd's F(2x2, 3x3)
# (mpitrain/nn/conv_winograd.py) instead of im2col, in chunks of images of about CHUNK_TILES bytes of transformed
# inputs (one image at least).
WINOGRAD_FROM = 8
CHUNK_TILES = 1 << 20


def _check_padding(padding: str) -> None:
    if padding not in PADDINGS:
        raise ValueError(f"padding {padding!r}, expected one of {PADDINGS}")


def _window_geometry(input_shape, kernel, stride, padding, layer: str):
    if len(input_shape) != 3:
        raise ValueError(f"a {layer} layer takes images (channels, height, width), got inputs of shape "
                         f"{list(input_shape)}")
    return geometry(input_shape, kernel, stride, padding)


@layer_type("conv2d")
class Conv2D(FusesActivation):
    """`filters` kernels of `kernel` x `kernel` (or [kh, kw]) over all input channels, plus a bias each;
    with `fuse_activation`, the activation layer after it runs here, fused with the bias add.

    Backward writes the output gradient's rows over forward's GEMM rows, and the windows' gradient
    over forward's windows once the weight gradient has read them: both are dead by then, so a
    batch shape holds one array of each (for LeNet's second conv layer, 8 MB of windows saved).
    """

    def __init__(self, filters: int, kernel, stride: int = 1, padding: str = "valid", activation: str = "none",
                 init: str | None = None):
        _check_padding(padding)
        self.filters, self.kernel, self.stride, self.padding = filters, kernel, stride, padding
        self.activation, self.init = activation, init
        self.chunk_lists: dict[tuple, list[slice]] = {}  # `chunks` of each batch shape

    def param_shapes(self, input_shape):
        self.g = _window_geometry(input_shape, self.kernel, self.stride, self.padding, "conv2d")
        return {"W": (self.filters, self.g.channels, *self.g.kernel), "b": (self.filters,)}

    def output_shape(self, input_shape):
        return (self.filters, self.g.out_height, self.g.out_width)

    def init_params(self, rng, scheme):
        area = math.prod(self.g.kernel)
        fan_in, fan_out = self.g.channels * area, self.filters * area
        return {"W": initial_weights(rng, self.init or scheme, fan_in, fan_out, self.params["W"].shape),
                "b": np.zeros(self.filters)}

    @property
    def channels_last(self) -> bool:
        """Whether the windows' rows run kernel offset, then channel (`kernels.im2col.im2col_channels_last`),
        as they do from CHANNELS_LAST_FROM input channels on; else channel, then kernel offset."""
        return self.g.channels >= CHANNELS_LAST_FROM

    def _windows_shape(self, n: int) -> tuple[int, ...]:
        g = self.g
        return (n, g.out_height, g.out_width, *g.kernel, g.channels) if self.channels_last else (n, *g.cols_shape)

    def _weights(self, xp, dtype):
        """`W` as the GEMM's (F, C*KH*KW) matrix in the windows' order: a view, or (channels last) a copy in the
        workspace, whose order is (F, KH, KW, C)."""
        if not self.channels_last:
            return self.params["W"].reshape(self.filters, -1)
        weights = self.ws("weights", (self.filters, *self.g.kernel, self.g.channels), dtype)
        xp.copyto(weights, self.params["W"].transpose(0, 2, 3, 1))
        return weights.reshape(self.filters, -1)

    def winograd_for(self, x) -> bool:
        """Whether batch `x` goes through Winograd's F(2x2, 3x3) (mpitrain/nn/conv_winograd.py): on the CPU, for a
        3x3 kernel of stride 1 over WINOGRAD_FROM input channels or more."""
        return array_module(x) is np and self.g.kernel == (3, 3) and self.stride == 1 and \
            self.g.channels >= WINOGRAD_FROM

    def chunks(self, x) -> list[slice]:
        """The runs of images of batch `x` whose windows are built and used at once: the whole batch on a GPU or
        when its windows fit WHOLE_WINDOWS_UP_TO bytes, else runs of about CHUNK_WINDOWS bytes of windows; on the
        Winograd path always runs of about CHUNK_TILES bytes of transformed inputs. Made once per batch shape (a
        step allocates nothing)."""
        n, on_cpu = len(x), array_module(x) is np
        key = (n, x.dtype, on_cpu)
        if key not in self.chunk_lists:
            if self.winograd_for(x):
                per_chunk = max(1, CHUNK_TILES // tile_bytes_per_image(self.g, x.dtype.itemsize))
            else:
                image_bytes = math.prod(self._windows_shape(1)) * x.dtype.itemsize
                per_chunk = n if not on_cpu or n * image_bytes <= WHOLE_WINDOWS_UP_TO else \
                    max(1, CHUNK_WINDOWS // image_bytes)
            self.chunk_lists[key] = [slice(start, min(start + per_chunk, n)) for start in range(0, n, per_chunk)]
        return self.chunk_lists[key]

    def _windows(self, x, images: slice):
        """The windows of `x[images]` as the GEMM's (pixels, C*KH*KW) matrix, in the layer's windows array (as many
        images as a chunk holds)."""
        g, n = self.g, images.stop - images.start
        cols = self.ws("cols", self._windows_shape(self.chunk_size), x.dtype)[:n]
        if self.channels_last:
            im2col_channels_last(x[images], g, self._image(n, x.dtype), cols)
        else:
            im2col(x[images], g, 0.0, cols)
        return cols.reshape(n * g.out_height * g.out_width, -1)

    def _image(self, n: int, dtype):
        """The channels-last windows' (N, H, W, C) scratch for `n` images of a chunk."""
        g = self.g
        return self.ws("image", (self.chunk_size, g.height, g.width, g.channels), dtype)[:n]

    def forward(self, x, training):
        xp, n, g = array_module(x), len(x), self.g
        self.x, self.batch = x, self.chunks(x)
        self.chunk_size = self.batch[0].stop
        self.winograd = self.winograd_for(x)
        if self.winograd:
            return winograd_forward(self, x)
        pixels = g.out_height * g.out_width
        rows = self.ws("rows", (n * pixels, self.filters), x.dtype)
        self.weights = self._weights(xp, x.dtype)
        self.y = self.ws("y", (n, self.filters, g.out_height, g.out_width), x.dtype)
        for images in self.batch:
            self.cols = self._windows(x, images)  # the whole batch's are kept for backward
            chunk_rows = rows[images.start * pixels:images.stop * pixels]
            matmul(self.cols, self.weights.T, chunk_rows)
            bias_activation_nchw(chunk_rows, self.params["b"], self.kind, self.y[images])
        return self.y

    def backward(self, dy, input_grad=True):
        """The gradients, a chunk of images at a time (`chunks`); one chunk (the whole batch) reuses forward's
        windows, more build each chunk's again. Each later chunk's weight gradient is added to the first's."""
        if self.winograd:
            return winograd_backward(self, dy, input_grad)
        xp, g, n = array_module(dy), self.g, len(dy)
        pixels = g.out_height * g.out_width
        dz = self.ws("rows", (n * pixels, self.filters), dy.dtype)  # forward's rows, no longer needed
        sums = self.ws("bias_sums", (n, self.filters), np.float64)  # each image's part of the bias gradient
        dw = self.ws("weights_grad", self.weights.shape, dy.dtype) if self.channels_last else \
            self.grads["W"].reshape(self.filters, -1)
        dx = self.ws("dx", self.x.shape, dy.dtype) if input_grad else None
        for k, images in enumerate(self.batch):
            cols = self._windows(self.x, images) if len(self.batch) > 1 else self.cols
            dz_chunk = dz[images.start * pixels:images.stop * pixels]
            activation_backward_rows(dy[images], self.y[images], self.kind, dz_chunk, sums[images])
            self.add_chunk_product(dz_chunk.T, cols, dw, first=k == 0)
            if input_grad:
                self._input_grad(dz_chunk, cols, dx[images])  # over the chunk's windows, read for the last time
        column_sums(sums, self.grads["b"])
        if self.channels_last:
            xp.copyto(self.grads["W"], dw.reshape(self.filters, *g.kernel, g.channels).transpose(0, 3, 1, 2))
        return dx

    def add_chunk_product(self, a, b, out, first: bool) -> None:
        """out = a @ b for a batch's first chunk, out += a @ b (through a workspace array) for each later one: a
        weight gradient summed over the chunks (both paths, im2col's and Winograd's)."""
        if first:
            matmul(a, b, out)
        else:
            part = self.ws("weights_grad_part", out.shape, out.dtype)
            matmul(a, b, part)
            out += part

    def _input_grad(self, dz, cols, dx) -> None:
        """`dx` (a chunk's images) = the adjoint of the windows of the gradient `dz` of their rows, through `cols`
        (their windows, overwritten)."""
        matmul(dz, self.weights, cols)
        dcols = cols.reshape(self._windows_shape(len(dx)))
        if self.channels_last:
            col2im_channels_last(dcols, self.g, self._image(len(dx), dz.dtype), dx)
        else:
            col2im(dcols, self.g, dx)


class _Pool2D(Layer):
    """Pooling over `pool` x `pool` windows (stride defaults to `pool`), each channel alone:
    `g` is the window geometry of the input."""

    def __init__(self, pool=2, stride: int | None = None, padding: str = "valid"):
        _check_padding(padding)
        self.pool, self.stride, self.padding = pool, stride or (pool if isinstance(pool, int) else pool[0]), padding

    def output_shape(self, input_shape):
        self.g = _window_geometry(input_shape, self.pool, self.stride, self.padding, type(self).__name__.lower())
        return (self.g.channels, self.g.out_height, self.g.out_width)

    def _output(self, x):
        """The workspace array of the output of `x`."""
        g = self.g
        return self.ws("y", (len(x), g.channels, g.out_height, g.out_width), x.dtype)

    def _input_grad(self, dy):
        """The workspace array of the input gradient of `dy`."""
        g = self.g
        return self.ws("dx", (len(dy), g.channels, g.height, g.width), dy.dtype)


@layer_type("maxpool2d")
class MaxPool2D(_Pool2D):
    """The largest value of each window (`kernels.pool`); its gradient goes to the first largest element."""

    def forward(self, x, training):
        y = self._output(x)
        self.where = self.ws("where", y.shape, np.int32)
        max_pool(x, self.g, y, self.where)
        return y

    def backward(self, dy, input_grad=True):
        dx = self._input_grad(dy)
        max_pool_backward(dy, self.where, self.g, dx)
        return dx


@layer_type("avgpool2d")
class AvgPool2D(_Pool2D):
    """The mean of each window, over its im2col row; padding counts as zeros in the mean. A sum, then a
    scaling in place (numpy's `mean` and a broadcasting multiply with `out=` allocate buffers); backward
    writes the windows' gradient over forward's windows."""

    def _cols(self, array):
        """The workspace array of the windows of a batch like `array`."""
        return self.ws("cols", (len(array), *self.g.cols_shape), array.dtype)

    def forward(self, x, training):
        cols = self._cols(x)
        im2col(x, self.g, 0.0, cols)
        y = self._output(x)
        cols.sum(axis=(4, 5), out=y.transpose(0, 2, 3, 1))
        y *= 1 / math.prod(self.g.kernel)
        return y

    def backward(self, dy, input_grad=True):
        dcols = self._cols(dy)
        dcols[...] = dy.transpose(0, 2, 3, 1)[..., None, None]
        dx = self._input_grad(dy)
        col2im(dcols, self.g, dx)
        dx *= 1 / math.prod(self.g.kernel)
        return dx
