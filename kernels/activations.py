"""Fused element-wise kernels of the layers: bias add + activation, its derivative, dropout.

    bias_activation(z, b, "relu", out)           # out = relu(z + b), rows of z (N, F), b (F,) or empty
    activation_backward(dy, y, "relu", out)      # out = dy * relu'(.), from the activation's OUTPUT y
    activation_backward(dy, x, "gelu", out)      # out = dy * gelu'(x), from its INPUT x (INPUT_KINDS)
    dropout(x, seed, threshold, scale, out, mask)  # mask = keep * scale from keyed bits; out = x * mask

Each is one pass over memory, writing into arrays it is given (the model's workspace), so a
step allocates nothing. numpy arrays run the numba kernels (parallel over rows); device
arrays (cupy) the numba-CUDA kernels of kernels/activations_cuda.py, one launch each; any
other array module the `*_reference` versions, written for any array module with `out=`,
which the tests compare the kernels with. The derivative is taken from the output (relu:
y > 0, sigmoid: y (1 - y), tanh: 1 - y^2), so backward needs only what forward wrote.
`activate` and `derivative` are `register_jitable`: the conv layer's fused kernels
(`kernels.conv_rows`) use them too. GELU (exact, with erf, or its tanh form) and SiLU (x sigmoid(x)) are not
monotonic, so their derivative needs the input: `INPUT_KINDS` run as layers of their own (never fused), which keep
their input for backward.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference
from .splitmix import GOLDEN, splitmix64

KINDS = {"none": 0, "relu": 1, "sigmoid": 2, "tanh": 3}
INPUT_KINDS = {"gelu": 1, "gelu_tanh": 2, "silu": 3}  # derivatives from the input: never fused
_SQRT_HALF, _SQRT_2_OVER_PI, _GELU_CUBIC = math.sqrt(0.5), math.sqrt(2 / math.pi), 0.044715

KEYED_BITS = 24  # dropout's draw: integers in [0, 2**KEYED_BITS)
_TOP = np.uint64(64 - KEYED_BITS)
register_jitable(splitmix64)  # kernels.splitmix's plain function, callable in numba kernels too


@register_jitable
def activate(z, kind):
    """The activation `kind` (a KINDS value) of one pre-activation value."""
    if kind == 1:
        return z if z > 0 else z * 0
    if kind == 2:
        return 1 / (1 + math.exp(-z))
    if kind == 3:
        return math.tanh(z)
    return z


@register_jitable
def derivative(y, kind):
    """The activation's derivative, from its output y."""
    if kind == 1:
        return 1 if y > 0 else 0
    if kind == 2:
        return y * (1 - y)
    if kind == 3:
        return 1 - y * y
    return 1


@register_jitable
def activate_input(x, kind):
    """The activation `kind` (an INPUT_KINDS value) of one value: GELU x Phi(x), its tanh form, or SiLU."""
    if kind == 1:
        return 0.5 * x * (1 + math.erf(x * _SQRT_HALF))
    if kind == 2:
        return 0.5 * x * (1 + math.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x)))
    return x / (1 + math.exp(-x))


@register_jitable
def derivative_at_input(x, kind):
    """The activation's derivative at its input x."""
    if kind == 1:  # Phi(x) + x phi(x)
        return 0.5 * (1 + math.erf(x * _SQRT_HALF)) + x * math.exp(-0.5 * x * x) * _SQRT_HALF / math.sqrt(math.pi)
    if kind == 2:
        inner = _SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x)
        t = math.tanh(inner)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * x * x)
    s = 1 / (1 + math.exp(-x))
    return s * (1 + x * (1 - s))


@register_jitable
def keyed_word(seed, index):
    """splitmix64 of (seed, index), all 64 bits: dropout's keyed bits are its top ones (`keyed_bits_at`), a fresh
    embedding table's values come from it (`kernels.embedding.keyed_normals`)."""
    return splitmix64(np.uint64(index) * GOLDEN + seed)


@register_jitable
def keyed_bits_at(seed, index):
    """splitmix64 of (seed, 1-based element index), its top KEYED_BITS bits: `mpitrain.nn.layers.keyed_bits`."""
    return keyed_word(seed, index) >> _TOP


@njit(parallel=True, cache=True)
def _bias_activation_cpu(z, b, kind, at_input, out):
    n, f = z.shape
    use_bias = b.size > 0
    for r in prange(n):
        for j in range(f):
            v = z[r, j]
            if use_bias:
                v += b[j]
            out[r, j] = activate_input(v, kind) if at_input else activate(v, kind)


@njit(parallel=True, cache=True)
def _activation_backward_cpu(dy, v, kind, at_input, out):
    n, f = dy.shape
    for r in prange(n):
        for j in range(f):
            out[r, j] = dy[r, j] * (derivative_at_input(v[r, j], kind) if at_input else derivative(v[r, j], kind))


@njit(parallel=True, cache=True)
def _dropout_cpu(x, seed, threshold, scale, out, mask):
    n, f = x.shape
    zero = scale * 0
    for r in prange(n):
        for j in range(f):
            m = scale if keyed_bits_at(seed, r * f + j + 1) >= threshold else zero
            mask[r, j] = m
            out[r, j] = x[r, j] * m


def _code(kind: str) -> tuple[int, bool]:
    """(the kernels' number of activation `kind`, whether its derivative is taken at its input)."""
    return (INPUT_KINDS[kind], True) if kind in INPUT_KINDS else (KINDS[kind], False)


@numpy_or_reference("bias_activation_reference", gpu=".activations_cuda")
def bias_activation(z, b, kind: str, out) -> None:
    """out = activation(z + b) for 2-D z (rows, features); `b` (features,) or empty for no bias. `out` may be `z`."""
    _bias_activation_cpu(z, b, *_code(kind), out)


@numpy_or_reference("activation_backward_reference", gpu=".activations_cuda")
def activation_backward(dy, v, kind: str, out) -> None:
    """out = dy * activation'(.) for 2-D dy, the derivative from the activation's output `v` (KINDS) or at its
    input `v` (INPUT_KINDS). `out` may be `dy`."""
    _activation_backward_cpu(dy, v, *_code(kind), out)


@numpy_or_reference("dropout_reference", gpu=".activations_cuda")
def dropout(x, seed: np.uint64, threshold: int, scale: float, out, mask) -> None:
    """mask = scale where the element's keyed bits are >= threshold, else 0; out = x * mask (2-D x)."""
    _dropout_cpu(x, np.uint64(seed), np.uint64(threshold), x.dtype.type(scale), out, mask)


def bias_activation_reference(z, b, kind: str, out) -> None:
    xp = array_module(z)
    if b.size:
        xp.add(z, b, out=out)
    elif out is not z:
        out[...] = z
    if kind in INPUT_KINDS:
        out[...] = _input_activation_parts(out, kind)[0]
    elif kind == "relu":
        xp.maximum(out, 0, out=out)
    elif kind == "sigmoid":
        xp.negative(out, out=out)
        xp.exp(out, out=out)
        out += 1
        xp.reciprocal(out, out=out)
    elif kind == "tanh":
        xp.tanh(out, out=out)


def activation_backward_reference(dy, y, kind: str, out) -> None:
    xp = array_module(dy)
    if kind in INPUT_KINDS:  # y is the input
        out[...] = dy * _input_activation_parts(y, kind)[1]
    elif kind == "relu":
        xp.multiply(dy, y > 0, out=out)
    elif kind == "sigmoid":
        xp.multiply(dy, y * (1 - y), out=out)
    elif kind == "tanh":
        xp.multiply(dy, 1 - y * y, out=out)
    elif out is not dy:
        out[...] = dy


def _erf(xp, x):
    """erf of an array of module xp: scipy's on the host, cupyx's on a GPU."""
    if xp is np:
        from scipy.special import erf
    else:
        from cupyx.scipy.special import erf
    return erf(x)


def _input_activation_parts(x, kind: str):
    """(activation(x), activation'(x)) of an INPUT_KINDS `kind` on array x, in x's array module."""
    xp = array_module(x)
    if kind == "gelu":
        phi = 0.5 * (1 + _erf(xp, x * _SQRT_HALF))
        return x * phi, phi + x * xp.exp(-0.5 * x * x) * (_SQRT_HALF / math.sqrt(math.pi))
    if kind == "gelu_tanh":
        t = xp.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * x ** 3))
        return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * x * x)
    s = 1 / (1 + xp.exp(-x))
    return x * s, s * (1 + x * (1 - s))


def keyed_bits_reference(xp, seed: np.uint64, shape):
    """`keyed_bits_at` for every element of `shape` in xp's wrapping uint64 arithmetic (numpy and cupy alike)."""
    z = xp.arange(1, math.prod(shape) + 1, dtype=np.uint64) * GOLDEN + np.uint64(seed)
    return (splitmix64(z) >> _TOP).reshape(shape)


def dropout_reference(x, seed, threshold: int, scale: float, out, mask) -> None:
    xp = array_module(x)
    keep = keyed_bits_reference(xp, seed, x.shape) >= np.uint64(threshold)
    xp.multiply(keep, x.dtype.type(scale), out=mask)
    xp.multiply(x, mask, out=out)
