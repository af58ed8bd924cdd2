"""The Winograd path of a conv2d layer: 3x3 kernels of stride 1 on the CPU, F(2x2, 3x3) (`kernels.winograd`).

    y = winograd_forward(layer, x)                  # for Conv2D.forward, when `layer.winograd_for(x)`
    dx = winograd_backward(layer, dy, input_grad)   # for Conv2D.backward

A batch goes through in the layer's chunks of images (`Conv2D.chunks`, sized by the transformed
inputs V, 16 x C values a 2x2 tile): for each chunk the inputs' transform V, 16 GEMMs
M[p] = V[p] @ U[p] with the transformed weights U, the outputs' transform into rows of pixels
(N, OH, OW, F), as im2col's GEMM writes them, and `kernels.conv_rows`' bias + fused activation
into NCHW. Backward takes each chunk's dy through `conv_rows`' activation backward (rows of dz and
the bias sums) and the outputs' adjoint into dM, adds dU[p] = V[p]^T dM[p] (V built again from the
padded image that forward kept, unless the batch was one chunk), writes dV[p] = dM[p] U[p]^T over V
and takes it through the inputs' adjoint into dx; then dW is the weights' adjoint of dU. Every
array is one of the layer's workspace.

Why (docs/benchmarks.md#measurements-behind-the-code): a 3x3 layer's im2col windows hold 9 values
per input value and its GEMM reads them once, so the windows' bytes and their copying cost as much
as the multiplications; F(2x2, 3x3) has 4 values per input value and 4/9 of the multiplications.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.kernels.conv_rows import activation_backward_rows, bias_activation_nchw, column_sums
from mpitrain.kernels.winograd import (
    padded_channels_last,
    padded_size,
    tiles,
    winograd_inputs,
    winograd_inputs_adjoint,
    winograd_outputs,
    winograd_outputs_adjoint,
    winograd_weights,
    winograd_weights_adjoint,
)

POSITIONS = 16  # a tile's transformed values: 4 x 4


def tile_bytes_per_image(g, itemsize: int) -> int:
    """The bytes of one image's transformed inputs V (what a chunk of images is sized by)."""
    rows, columns = tiles(g)
    return POSITIONS * rows * columns * g.channels * itemsize


def _inputs(layer, images: slice, dtype):
    """V (16, tiles, C) of the chunk `images`, from the padded image forward made."""
    v = _chunk_of(layer, "tiles", layer.g.channels, images, dtype)
    winograd_inputs(layer.padded[images], layer.g, v)
    return v


def _chunk_of(layer, name: str, width: int, images: slice, dtype):
    """The workspace array `name` (16, tiles, width) of the chunk `images`: one of each chunk length (a short last
    chunk has its own), so every kernel sees C-contiguous arrays and numba compiles one version of each."""
    return layer.ws(name, (POSITIONS, (images.stop - images.start) * math.prod(tiles(layer.g)), width), dtype)


def winograd_forward(layer, x):
    """The layer's output (N, F, OH, OW) for batch `x` (numpy, NCHW), in the chunks `layer.batch`."""
    g, n = layer.g, len(x)
    layer.padded = layer.ws("padded_image", (n, *padded_size(g), g.channels), x.dtype)
    padded_channels_last(x, g, layer.padded)
    layer.u = layer.ws("weights_tiles", (POSITIONS, g.channels, layer.filters), x.dtype)
    winograd_weights(layer.params["W"], layer.u)
    layer.u_t = layer.ws("weights_tiles_t", (POSITIONS, layer.filters, g.channels), x.dtype)  # U[p]^T for dV
    np.copyto(layer.u_t, layer.u.transpose(0, 2, 1))
    rows = layer.ws("rows", (n, g.out_height, g.out_width, layer.filters), x.dtype)
    layer.y = layer.ws("y", (n, layer.filters, g.out_height, g.out_width), x.dtype)
    for images in layer.batch:
        layer.v = _inputs(layer, images, x.dtype)  # one chunk's are kept for backward
        m = _chunk_of(layer, "products", layer.filters, images, x.dtype)
        np.matmul(layer.v, layer.u, out=m)
        winograd_outputs(m, rows[images])
        bias_activation_nchw(rows[images].reshape(-1, layer.filters), layer.params["b"], layer.kind,
                             layer.y[images])
    return layer.y


def winograd_backward(layer, dy, input_grad: bool):
    """The input gradient (None unless `input_grad`); writes the layer's `grads`."""
    g, n = layer.g, len(dy)
    dz = layer.ws("rows", (n, g.out_height, g.out_width, layer.filters), dy.dtype)  # forward's, no longer needed
    sums = layer.ws("bias_sums", (n, layer.filters), np.float64)  # each image's part of the bias gradient
    du = layer.ws("weights_tiles_grad", layer.u.shape, dy.dtype)
    dx = layer.ws("dx", layer.x.shape, dy.dtype) if input_grad else None
    for k, images in enumerate(layer.batch):
        activation_backward_rows(dy[images], layer.y[images], layer.kind, dz[images].reshape(-1, layer.filters),
                                 sums[images])
        dm = _chunk_of(layer, "products", layer.filters, images, dy.dtype)
        winograd_outputs_adjoint(dz[images], dm)
        v = _inputs(layer, images, dy.dtype) if len(layer.batch) > 1 else layer.v
        layer.add_chunk_product(v.transpose(0, 2, 1), dm, du, first=k == 0)
        if input_grad:
            np.matmul(dm, layer.u_t, out=v)  # dV, over V: read for the last time
            scratch = layer.ws("padded_image_grad", (layer.chunk_size, *padded_size(g), g.channels), dy.dtype)
            winograd_inputs_adjoint(v, g, scratch[:images.stop - images.start], dx[images])
    column_sums(sums, layer.grads["b"])
    winograd_weights_adjoint(du, layer.grads["W"])
    return dx
