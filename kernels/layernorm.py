"""Layer normalization's passes as kernels over (R, F) rows: a dense layer's rows, or a sequence's steps as rows.

    forward(x, gamma, beta, eps, x_hat, inv_std, y, kind)
    backward(dy, y, kind, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx)   # dx may be None (first layer)

Each row is normalized by its own mean and (biased) variance over its F features, then scaled by `gamma` and shifted
by `beta` (F,), and activation `kind` (`kernels.activations.KINDS`: the layer's fused `activation`) runs on y in the
same pass. Forward runs one thread per row, summing in float64 (the sums of x and x^2 shifted by the row's first
value, so that they do not cancel), and writes `x_hat`, `inv_std` (R,) and `y`. Backward is two kernels: per row,
dz (dy times the activation's derivative at y) and dx; per feature, dgamma and dbeta summed over the rows in float64
(one thread per row would race on them). Nothing is allocated. numpy arrays run the numba kernels; device arrays
(cupy) the same row and feature functions as numba-CUDA kernels (kernels/layernorm_cuda.py), a thread per row or
feature; other array modules the references.
"""
from __future__ import annotations

import math

from numba import njit, prange
from numba.extending import register_jitable

from mpitrain.base.arrays import array_module

from .activations import KINDS, activate, activation_backward_reference, bias_activation_reference, derivative
from .dispatch import numpy_or_reference


@register_jitable
def normalize_row(x, gamma, beta, eps, x_hat, inv_std, y, kind, r):
    """Forward of row r: x_hat, inv_std[r] and y."""
    features = x.shape[1]
    shift = float(x[r, 0])
    total = squares = 0.0
    for f in range(features):
        d = x[r, f] - shift
        total += d
        squares += d * d
    mu = shift + total / features
    inv = 1 / math.sqrt(max(squares / features - (total / features) ** 2, 0.0) + eps)
    inv_std[r] = inv
    for f in range(features):
        h = (x[r, f] - mu) * inv
        x_hat[r, f] = h
        y[r, f] = activate(h * gamma[f] + beta[f], kind)


@register_jitable
def input_grad_row(dy, y, kind, dz, x_hat, inv_std, gamma, input_grad, dx, r):
    """Backward of row r: dz (dy times the activation's derivative, unless kind is 0: dz is dy) and dx."""
    features = dy.shape[1]
    if kind != 0:
        for f in range(features):
            dz[r, f] = dy[r, f] * derivative(y[r, f], kind)
    if input_grad:
        sum_g = sum_g_x_hat = 0.0
        for f in range(features):
            g = dz[r, f] * gamma[f]
            sum_g += g
            sum_g_x_hat += g * x_hat[r, f]
        mean_g, mean_g_x_hat, inv = sum_g / features, sum_g_x_hat / features, inv_std[r]
        for f in range(features):
            dx[r, f] = (dz[r, f] * gamma[f] - mean_g - x_hat[r, f] * mean_g_x_hat) * inv


@register_jitable
def scale_grads_feature(dz, x_hat, dgamma, dbeta, f):
    """dgamma[f] and dbeta[f], summed over the rows in order."""
    sum_dz = sum_dz_x_hat = 0.0
    for r in range(dz.shape[0]):
        sum_dz += dz[r, f]
        sum_dz_x_hat += dz[r, f] * x_hat[r, f]
    dgamma[f] = sum_dz_x_hat
    dbeta[f] = sum_dz


@njit(parallel=True, cache=True)
def _forward_cpu(x, gamma, beta, eps, x_hat, inv_std, y, kind):
    for r in prange(x.shape[0]):
        normalize_row(x, gamma, beta, eps, x_hat, inv_std, y, kind, r)


@njit(parallel=True, cache=True)
def _input_grad_cpu(dy, y, kind, dz, x_hat, inv_std, gamma, input_grad, dx):
    for r in prange(dy.shape[0]):
        input_grad_row(dy, y, kind, dz, x_hat, inv_std, gamma, input_grad, dx, r)


@njit(parallel=True, cache=True)
def _scale_grads_cpu(dz, x_hat, dgamma, dbeta):
    for f in prange(dz.shape[1]):
        scale_grads_feature(dz, x_hat, dgamma, dbeta, f)


@numpy_or_reference("forward_reference", gpu=".layernorm_cuda")
def forward(x, gamma, beta, eps: float, x_hat, inv_std, y, kind: str = "none") -> None:
    """Normalize each row of `x` (R, F) into `x_hat` and `y` = activation `kind` of gamma x_hat + beta; `inv_std`
    (R,) gets each row's 1/sqrt(var + eps)."""
    _forward_cpu(x, gamma, beta, eps, x_hat, inv_std, y, KINDS[kind])


@numpy_or_reference("backward_reference", gpu=".layernorm_cuda")
def backward(dy, y, kind: str, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx) -> None:
    """Gradients of gamma and beta (F,) and, unless `dx` is None, of the input (R, F), from the gradient `dy` of
    forward's output `y` (activation `kind`; `dz`, (R, F), gets dy times its derivative, unless kind is "none")."""
    dz = dy if kind == "none" else dz
    _input_grad_cpu(dy, y, KINDS[kind], dz, x_hat, inv_std, gamma, dx is not None, dy if dx is None else dx)
    _scale_grads_cpu(dz, x_hat, dgamma, dbeta)


def forward_reference(x, gamma, beta, eps, x_hat, inv_std, y, kind="none") -> None:
    xp = array_module(x)
    centered = x - x.mean(axis=1, keepdims=True)
    inv_std[...] = 1 / xp.sqrt((centered * centered).mean(axis=1) + eps)
    x_hat[...] = centered * inv_std[:, None]
    y[...] = x_hat * gamma + beta
    bias_activation_reference(y, y[:0, :0].reshape(-1), kind, y)


def backward_reference(dy, y, kind, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx) -> None:
    if kind != "none":
        activation_backward_reference(dy, y, kind, dz)
        dy = dz
    (dy * x_hat).sum(axis=0, out=dgamma)
    dy.sum(axis=0, out=dbeta)
    if dx is not None:
        dx_hat = dy * gamma
        dx[...] = (dx_hat - dx_hat.mean(axis=1, keepdims=True)
                   - x_hat * (dx_hat * x_hat).mean(axis=1, keepdims=True)) * inv_std[:, None]
