"""Spatial layers on NCHW batches: convolution as im2col + one GEMM, pooling as a reduction of windows.

The GEMM is `xp.matmul`, so numpy runs BLAS and cupy runs cuBLAS; im2col/col2im are the
`kernels.im2col` kernels (numba on the CPU).
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.backend import array_module
from mpitrain.kernels.im2col import PADDINGS, col2im, geometry, im2col
from mpitrain.kernels.pool import max_pool, max_pool_backward
from mpitrain.nn.layers import Layer, initial_weights


def _check_padding(padding: str) -> None:
    if padding not in PADDINGS:
        raise ValueError(f"padding {padding!r}, expected one of {PADDINGS}")


def _window_geometry(input_shape, kernel, stride, padding, layer: str):
    if len(input_shape) != 3:
        raise ValueError(f"a {layer} layer takes images (channels, height, width), got inputs of shape "
                         f"{list(input_shape)}")
    return geometry(input_shape, kernel, stride, padding)


class Conv2D(Layer):
    """`filters` kernels of `kernel` x `kernel` (or [kh, kw]) over all input channels, plus a bias each."""

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

    def forward(self, x, training):
        n, g = len(x), self.g
        self.cols = im2col(x, g).reshape(n * g.out_height * g.out_width, -1)
        y = self.cols @ self.params["W"].reshape(self.filters, -1).T
        y += self.params["b"]
        return array_module(y).ascontiguousarray(y.reshape(n, g.out_height, g.out_width, -1).transpose(0, 3, 1, 2))

    def backward(self, dy, input_grad=True):
        xp = array_module(dy)
        dy_rows = xp.ascontiguousarray(dy.transpose(0, 2, 3, 1)).reshape(-1, self.filters)
        xp.matmul(dy_rows.T, self.cols, out=self.grads["W"].reshape(self.filters, -1))
        dy.sum(axis=(0, 2, 3), out=self.grads["b"])
        if not input_grad:
            return None
        dcols = dy_rows @ self.params["W"].reshape(self.filters, -1)
        return col2im(dcols.reshape(len(dy), *self.g.cols_shape), self.g)


class _Pool2D(Layer):
    """Pooling over `pool` x `pool` windows (stride defaults to `pool`), each channel alone:
    `g1` is the window geometry of one channel."""

    def __init__(self, pool=2, stride: int | None = None, padding: str = "valid"):
        _check_padding(padding)
        self.pool, self.stride, self.padding = pool, stride or (pool if isinstance(pool, int) else pool[0]), padding

    def output_shape(self, input_shape):
        g = _window_geometry(input_shape, self.pool, self.stride, self.padding, type(self).__name__.lower())
        self.g1 = geometry((1, g.height, g.width), self.pool, self.stride, self.padding)
        return (g.channels, g.out_height, g.out_width)


class MaxPool2D(_Pool2D):
    """The largest value of each window (`kernels.pool`); its gradient goes to the first largest element."""

    def forward(self, x, training):
        y, self.where = max_pool(x, self.g1)
        return y

    def backward(self, dy, input_grad=True):
        return max_pool_backward(dy, self.where, self.g1)


class AvgPool2D(_Pool2D):
    """The mean of each window, as im2col rows of one channel; padding counts as zeros in the mean."""

    def forward(self, x, training):
        n, c, h, w = self.input_shape = x.shape
        return im2col(x.reshape(n * c, 1, h, w), self.g1).reshape(n, c, self.g1.out_height, self.g1.out_width,
                                                                  -1).mean(axis=-1)

    def backward(self, dy, input_grad=True):
        xp = array_module(dy)
        n, c, h, w = self.input_shape
        area = math.prod(self.g1.kernel)
        dcols = xp.broadcast_to((dy / area)[..., None], (*dy.shape, area)).reshape(n * c, *self.g1.cols_shape)
        return col2im(dcols, self.g1).reshape(n, c, h, w)
