"""Batch normalization's passes as kernels over (N, C, S) views: S = 1 for dense features (N, F), H*W for images.

    forward(x, gamma, beta, eps, mean, var, momentum, training, x_hat, inv_std, y, kind)
    backward(dy, y, kind, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx)   # dx may be None (first layer)

In training, the batch's mean and (biased) variance per channel normalize `x` and move the
running `mean` and `var` (unbiased) towards them by `momentum`; in evaluation the running
ones normalize. One thread per channel sums in float64, in one pass (the sums of x and x^2,
shifted by one of the channel's values so that they do not cancel) with four partial sums
(along S, or across rows for dense features), and writes `x_hat`, `inv_std` and
`y` (and in backward `dgamma`, `dbeta`, `dx`) into the arrays it is given: nothing is
allocated. Activation `kind` (`kernels.activations.KINDS`: the layer's fused `activation`) runs on
y in the same pass; backward first writes each channel's dy times its derivative at y into `dz`
(the channel then stays in cache for the sums and dx), so a batch norm and the ReLU after it take
one pass each way, not two. Two passes of one running sum each (a chain of dependent adds) took 1.58 ms for the
residual net's first batch norm (batch 32, 32 channels of 28x28, one thread), this 0.79 ms;
backward 0.88 -> 0.75 ms; dense features (256 x 200) 0.17 -> 0.13 ms forward, 0.13-0.14 ms
backward either way. numpy arrays run the numba kernels; device arrays (cupy) kernels/batchnorm_cuda.py's, a
block of threads per channel, one launch each way; any other array module the references.
"""
from __future__ import annotations

import math

from numba import njit, prange

from mpitrain.base.arrays import array_module

from .activations import KINDS, activate, activation_backward_reference, bias_activation_reference, derivative
from .dispatch import numpy_or_reference


@njit(cache=True, inline="always")
def _sums(u, v, ch, shift_u, shift_v):
    """Over channel `ch` of `u` and `v` (N, C, S): the sum of u - shift_u and of (u - shift_u)(v - shift_v), in
    float64 with four partial sums each along S (one running sum is a chain of dependent adds, 4x slower)."""
    n, _, s = u.shape
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = 0.0
    if s < 4:  # dense features (S = 1): the partial sums take four rows at a time
        return _sums_across_rows(u, v, ch, shift_u, shift_v)
    whole = s - s % 4
    for i in range(n):
        for k in range(0, whole, 4):
            d0, d1 = u[i, ch, k] - shift_u, u[i, ch, k + 1] - shift_u
            d2, d3 = u[i, ch, k + 2] - shift_u, u[i, ch, k + 3] - shift_u
            a0 += d0
            a1 += d1
            a2 += d2
            a3 += d3
            b0 += d0 * (v[i, ch, k] - shift_v)
            b1 += d1 * (v[i, ch, k + 1] - shift_v)
            b2 += d2 * (v[i, ch, k + 2] - shift_v)
            b3 += d3 * (v[i, ch, k + 3] - shift_v)
        for k in range(whole, s):
            d = u[i, ch, k] - shift_u
            a0 += d
            b0 += d * (v[i, ch, k] - shift_v)
    return (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3)


@njit(cache=True, inline="always")
def _sums_across_rows(u, v, ch, shift_u, shift_v):
    """`_sums` with the partial sums over four rows at a time, for a short S."""
    n, _, s = u.shape
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = 0.0
    whole = n - n % 4
    for k in range(s):
        for i in range(0, whole, 4):
            d0, d1 = u[i, ch, k] - shift_u, u[i + 1, ch, k] - shift_u
            d2, d3 = u[i + 2, ch, k] - shift_u, u[i + 3, ch, k] - shift_u
            a0 += d0
            a1 += d1
            a2 += d2
            a3 += d3
            b0 += d0 * (v[i, ch, k] - shift_v)
            b1 += d1 * (v[i + 1, ch, k] - shift_v)
            b2 += d2 * (v[i + 2, ch, k] - shift_v)
            b3 += d3 * (v[i + 3, ch, k] - shift_v)
        for i in range(whole, n):
            d = u[i, ch, k] - shift_u
            a0 += d
            b0 += d * (v[i, ch, k] - shift_v)
    return (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3)


@njit(parallel=True, cache=True)
def _forward_cpu(x, gamma, beta, eps, mean, var, momentum, training, x_hat, inv_std, y, kind):
    n, c, s = x.shape
    m = n * s
    for ch in prange(c):
        if training:  # one pass: sums of x and x^2 shifted by one of the channel's values (no cancellation)
            shift = float(x[0, ch, 0])
            total, squares = _sums(x, x, ch, shift, shift)
            mu = shift + total / m
            sigma2 = max(squares / m - (total / m) ** 2, 0.0)
            mean[ch] = momentum * mean[ch] + (1 - momentum) * mu
            var[ch] = momentum * var[ch] + (1 - momentum) * sigma2 * (m / max(m - 1, 1))
        else:
            mu, sigma2 = mean[ch], var[ch]
        inv = 1 / math.sqrt(sigma2 + eps)
        inv_std[ch] = inv
        g, b = gamma[ch], beta[ch]
        for i in range(n):
            for k in range(s):
                h = (x[i, ch, k] - mu) * inv
                x_hat[i, ch, k] = h
                y[i, ch, k] = activate(h * g + b, kind)


@njit(parallel=True, cache=True)
def _backward_cpu(dy, y, kind, dz, x_hat, inv_std, gamma, dgamma, dbeta, input_grad, dx):
    n, c, s = dy.shape
    m = n * s
    for ch in prange(c):
        if kind != 0:  # dz is dy itself without an activation
            for i in range(n):
                for k in range(s):
                    dz[i, ch, k] = dy[i, ch, k] * derivative(y[i, ch, k], kind)
        sum_dy, sum_dy_x_hat = _sums(dz, x_hat, ch, 0.0, 0.0)
        dgamma[ch] = sum_dy_x_hat
        dbeta[ch] = sum_dy
        if input_grad:
            g, inv = gamma[ch], inv_std[ch]
            mean_dx_hat, mean_dx_hat_x_hat = g * sum_dy / m, g * sum_dy_x_hat / m
            for i in range(n):
                for k in range(s):
                    dx[i, ch, k] = (dz[i, ch, k] * g - mean_dx_hat - x_hat[i, ch, k] * mean_dx_hat_x_hat) * inv


@numpy_or_reference("forward_reference", gpu=".batchnorm_cuda")
def forward(x, gamma, beta, eps: float, mean, var, momentum: float, training: bool, x_hat, inv_std, y,
            kind: str = "none") -> None:
    """Normalize `x` (N, C, S) per channel into `x_hat` and `y` = activation `kind` of gamma x_hat + beta; `inv_std`
    (C,) gets 1/sqrt(var + eps); in `training` the batch statistics normalize and update the running `mean`, `var`."""
    _forward_cpu(x, gamma, beta, eps, mean, var, momentum, training, x_hat, inv_std, y, KINDS[kind])


@numpy_or_reference("backward_reference", gpu=".batchnorm_cuda")
def backward(dy, y, kind: str, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx) -> None:
    """Gradients of gamma and beta (C,) and, unless `dx` is None, of the input (N, C, S), from the gradient `dy` of
    forward's output `y` (activation `kind`; `dz`, (N, C, S), gets dy times its derivative, unless kind is "none")."""
    _backward_cpu(dy, y, KINDS[kind], dy if kind == "none" else dz, x_hat, inv_std, gamma, dgamma, dbeta,
                  dx is not None, dy if dx is None else dx)


def forward_reference(x, gamma, beta, eps, mean, var, momentum, training, x_hat, inv_std, y, kind="none") -> None:
    xp = array_module(x)
    if training:
        batch_mean = x.mean(axis=(0, 2))
        centered = x - batch_mean[None, :, None]
        batch_var = (centered * centered).mean(axis=(0, 2))
        m = x.shape[0] * x.shape[2]
        mean[...] = momentum * mean + (1 - momentum) * batch_mean
        var[...] = momentum * var + (1 - momentum) * batch_var * (m / max(m - 1, 1))
    else:
        batch_var, centered = var, x - mean[None, :, None]
    inv_std[...] = 1 / xp.sqrt(batch_var + eps)
    x_hat[...] = centered * inv_std[None, :, None]
    y[...] = x_hat * gamma[None, :, None] + beta[None, :, None]
    bias_activation_reference(y, y[:0, :0, :0].reshape(-1), kind, y)


def backward_reference(dy, y, kind, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx) -> None:
    if kind != "none":
        activation_backward_reference(dy, y, kind, dz)
        dy = dz
    (dy * x_hat).sum(axis=(0, 2), out=dgamma)
    dy.sum(axis=(0, 2), out=dbeta)
    if dx is not None:
        dx_hat = dy * gamma[None, :, None]
        dx[...] = (dx_hat - dx_hat.mean(axis=(0, 2), keepdims=True)
                   - x_hat * (dx_hat * x_hat).mean(axis=(0, 2), keepdims=True)) * inv_std[None, :, None]
