"""Spatial layers on NCHW batches: convolution as im2col + one GEMM, pooling as a reduction of windows.

The GEMM is `xp.matmul`, so numpy runs BLAS and cupy runs cuBLAS; im2col/col2im are the
`kernels.im2col` kernels, max pooling the `kernels.pool` ones (numba on the CPU). A conv2d
layer adds its bias, runs its fused activation (`fuse_activation`) and transposes the GEMM's
rows to NCHW in one kernel (`kernels.conv_rows`), and back in backward. Every array a layer
returns or keeps is an array of its workspace (`Layer.ws`), written in place.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.parallel.backend import array_module
from mpitrain.kernels.chunks import images_per_chunk
from mpitrain.kernels.conv_rows import activation_backward_rows, bias_activation_nchw, column_sums
from mpitrain.kernels.im2col import PADDINGS, col2im, geometry, im2col
from mpitrain.kernels.pool import max_pool, max_pool_backward
from mpitrain.nn.layers import FusesActivation, Layer, initial_weights


def _check_padding(padding: str) -> None:
    if padding not in PADDINGS:
        raise ValueError(f"padding {padding!r}, expected one of {PADDINGS}")


def _window_geometry(input_shape, kernel, stride, padding, layer: str):
    if len(input_shape) != 3:
        raise ValueError(f"a {layer} layer takes images (channels, height, width), got inputs of shape "
                         f"{list(input_shape)}")
    return geometry(input_shape, kernel, stride, padding)


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

    def _matrix(self, kernels):
        """`W` or its gradient as the GEMM's (F, C*KH*KW) matrix, a view."""
        return kernels.reshape(self.filters, -1)

    def _chunk(self, x):
        """Images per chunk of batch `x`: its windows and GEMM rows in the L2 cache (`kernels.chunks`)."""
        g = self.g
        return images_per_chunk(x, g.out_height * g.out_width * (g.cols_shape[2] * math.prod(g.kernel) + self.filters)
                                * x.dtype.itemsize)

    def _scratch(self, step: int, images: int, dtype):
        """The windows of `images` images (<= `step`) as GEMM operands (rows of C*KH*KW) and their GEMM rows: views of
        the workspace's arrays for `step` images, the same in forward and backward."""
        g, pixels = self.g, self.g.out_height * self.g.out_width
        cols = self.ws("cols", (step, *g.cols_shape), dtype)[:images]
        rows = self.ws("rows", (step * pixels, self.filters), dtype)[:images * pixels]
        return cols, cols.reshape(images * pixels, -1), rows

    def forward(self, x, training):
        xp, n, step = array_module(x), len(x), self._chunk(x)
        self.x = x
        self.y = self.ws("y", (n, self.filters, self.g.out_height, self.g.out_width), x.dtype)
        for start in range(0, n, step):
            stop = min(start + step, n)
            cols, windows, rows = self._scratch(step, stop - start, x.dtype)
            im2col(x[start:stop], self.g, 0.0, cols)
            xp.matmul(windows, self._matrix(self.params["W"]).T, out=rows)
            bias_activation_nchw(rows, self.params["b"], self.kind, self.y[start:stop])
        return self.y

    def backward(self, dy, input_grad=True):
        xp, n, step, x = array_module(dy), len(dy), self._chunk(dy), self.x
        sums = self.ws("bias_sums", (n, self.filters), np.float64)  # each image's part of the bias gradient
        dw, dw_chunk = self._matrix(self.grads["W"]), self.ws("weight_grad_chunk", (self.filters, self.g.cols_shape[2]
                                                                                     * math.prod(self.g.kernel)), dy.dtype)
        dx = self.ws("dx", x.shape, dy.dtype) if input_grad else None
        for start in range(0, n, step):
            stop = min(start + step, n)
            cols, windows, dz = self._scratch(step, stop - start, dy.dtype)
            im2col(x[start:stop], self.g, 0.0, cols)  # forward's windows, rebuilt in cache
            activation_backward_rows(dy[start:stop], self.y[start:stop], self.kind, dz, sums[start:stop])
            xp.matmul(dz.T, windows, out=dw if start == 0 else dw_chunk)
            if start:
                dw += dw_chunk
            if input_grad:
                xp.matmul(dz, self._matrix(self.params["W"]), out=windows)  # the windows' gradient over them
                col2im(cols, self.g, dx[start:stop])
        column_sums(sums, self.grads["b"])
        return dx


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
