"""Bias + activation, its derivative and dropout on a GPU: one numba-CUDA kernel each, a thread per element of the
2-D arrays, launched on cupy's current stream (`kernels.cuda_launch`), where the `*_reference` versions made 2-6
launches and as many temporaries.

Each thread computes its element with the functions the CPU kernels use (`activate`, `derivative`,
`activate_input`, `derivative_at_input`, `keyed_bits_at` of kernels/activations.py), so the GPU's activations and
dropout masks are the CPU's: a dropout mask is the same bits on either. No kernel takes an empty array: without a
bias the first row of `z` stands in for it, unread. Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) the same
kernels run on numpy arrays: tests/harness/cuda_kernels_check.py holds them to the CPU kernels there and on a GPU.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from .activations import _code, activate, activate_input, derivative, derivative_at_input, keyed_bits_at
from .cuda_launch import launch_over

BLOCK = 256


@cuda.jit
def _bias_activation(z, b, use_bias, kind, at_input, out):
    i = cuda.grid(1)
    f = z.shape[1]
    if i < z.shape[0] * f:
        r, j = i // f, i % f
        v = z[r, j] + b[j] if use_bias else z[r, j]
        out[r, j] = activate_input(v, kind) if at_input else activate(v, kind)


@cuda.jit
def _activation_backward(dy, v, kind, at_input, out):
    i = cuda.grid(1)
    f = dy.shape[1]
    if i < dy.shape[0] * f:
        r, j = i // f, i % f
        out[r, j] = dy[r, j] * (derivative_at_input(v[r, j], kind) if at_input else derivative(v[r, j], kind))


@cuda.jit
def _dropout(x, seed, threshold, scale, zero, out, mask):
    i = cuda.grid(1)
    f = x.shape[1]
    if i < x.shape[0] * f:
        r, j = i // f, i % f
        m = scale if keyed_bits_at(seed, i + 1) >= threshold else zero
        mask[r, j] = m
        out[r, j] = x[r, j] * m


def bias_activation(z, b, kind: str, out) -> None:
    """kernels.activations.bias_activation on device arrays."""
    if z.size:  # z[0] stands in for a missing bias
        launch_over(_bias_activation, z.size, BLOCK, z, b if b.size else z[0], b.size > 0, *_code(kind), out)


def activation_backward(dy, v, kind: str, out) -> None:
    """kernels.activations.activation_backward on device arrays."""
    launch_over(_activation_backward, dy.size, BLOCK, dy, v, *_code(kind), out)


def dropout(x, seed: np.uint64, threshold: int, scale: float, out, mask) -> None:
    """kernels.activations.dropout on device arrays: the CPU kernel's mask, element for element."""
    launch_over(_dropout, x.size, BLOCK, x, np.uint64(seed), np.uint64(threshold), x.dtype.type(scale),
                x.dtype.type(0), out, mask)
