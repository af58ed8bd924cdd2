"""Batch normalization on a GPU: forward and backward one launch each, a block of THREADS threads per channel, where
the references made about 15 launches each way and as many temporaries.

The threads of a channel's block take its N x S values in turn (value e: row e // S, position e % S). Forward sums
them shifted by the channel's first value, in float64 (no cancellation, as the CPU kernel), the block adds the
threads' sums in shared memory in a fixed tree order (`kernels.cuda_reduce.block_sum`), thread 0 turns them into
the mean, the variance and the running statistics, and every thread then writes its values' x_hat and y (the
fused activation too). Backward writes dz (dy times the activation's derivative) and sums dz and dz x_hat the same
way, then dgamma, dbeta and dx. The sums differ from the CPU kernel's in rounding only (another order). The
arguments are those of kernels/batchnorm.py's functions. Under the CUDA simulator the same kernels run on numpy
arrays (tests/harness/cuda_kernels_check.py).
"""
from __future__ import annotations

import math

from numba import cuda, float64

from .activations import KINDS, activate, derivative
from .cuda_launch import launch
from .cuda_reduce import block_sum

THREADS = 256  # per channel; a power of two


@cuda.jit
def _forward(x, gamma, beta, eps, mean, var, momentum, training, x_hat, inv_std, y, kind):
    ch, t = cuda.blockIdx.x, cuda.threadIdx.x
    s = x.shape[2]
    m = x.shape[0] * s
    totals = cuda.shared.array(THREADS, float64)
    squares = cuda.shared.array(THREADS, float64)
    stats = cuda.shared.array(2, float64)  # the mean and 1 / sqrt(variance + eps) that normalize
    if training:  # uniform over the block: every thread reaches the block's syncs
        shift = float(x[0, ch, 0])
        total = square = 0.0
        for e in range(t, m, THREADS):
            d = x[e // s, ch, e % s] - shift
            total += d
            square += d * d
        totals[t], squares[t] = total, square
        cuda.syncthreads()
        block_sum(totals, t)
        block_sum(squares, t)
        if t == 0:
            mu = shift + totals[0] / m
            sigma2 = max(squares[0] / m - (totals[0] / m) ** 2, 0.0)
            mean[ch] = momentum * mean[ch] + (1 - momentum) * mu
            var[ch] = momentum * var[ch] + (1 - momentum) * sigma2 * (m / max(m - 1, 1))
            stats[0], stats[1] = mu, 1 / math.sqrt(sigma2 + eps)
    elif t == 0:
        stats[0], stats[1] = mean[ch], 1 / math.sqrt(var[ch] + eps)
    cuda.syncthreads()
    mu, inv, g, b = stats[0], stats[1], gamma[ch], beta[ch]
    if t == 0:
        inv_std[ch] = inv
    for e in range(t, m, THREADS):
        i, k = e // s, e % s
        h = (x[i, ch, k] - mu) * inv
        x_hat[i, ch, k] = h
        y[i, ch, k] = activate(h * g + b, kind)


@cuda.jit
def _backward(dy, y, kind, dz, x_hat, inv_std, gamma, dgamma, dbeta, input_grad, dx):
    ch, t = cuda.blockIdx.x, cuda.threadIdx.x
    s = dy.shape[2]
    m = dy.shape[0] * s
    sums = cuda.shared.array(THREADS, float64)
    products = cuda.shared.array(THREADS, float64)
    total = product = 0.0
    for e in range(t, m, THREADS):
        i, k = e // s, e % s
        if kind != 0:  # dz is dy itself without an activation
            dz[i, ch, k] = dy[i, ch, k] * derivative(y[i, ch, k], kind)
        d = dz[i, ch, k]
        total += d
        product += d * x_hat[i, ch, k]
    sums[t], products[t] = total, product
    cuda.syncthreads()
    block_sum(sums, t)
    block_sum(products, t)
    sum_dy, sum_dy_x_hat = sums[0], products[0]
    if t == 0:
        dgamma[ch], dbeta[ch] = sum_dy_x_hat, sum_dy
    if input_grad:
        g, inv = gamma[ch], inv_std[ch]
        mean_dx_hat, mean_dx_hat_x_hat = g * sum_dy / m, g * sum_dy_x_hat / m
        for e in range(t, m, THREADS):  # the values this thread wrote dz of: no other thread's
            i, k = e // s, e % s
            dx[i, ch, k] = (dz[i, ch, k] * g - mean_dx_hat - x_hat[i, ch, k] * mean_dx_hat_x_hat) * inv


def forward(x, gamma, beta, eps: float, mean, var, momentum: float, training: bool, x_hat, inv_std, y,
            kind: str = "none") -> None:
    """kernels.batchnorm.forward on device arrays."""
    launch(_forward, x.shape[1], THREADS, x, gamma, beta, float(eps), mean, var, float(momentum), bool(training),
           x_hat, inv_std, y, KINDS[kind])


def backward(dy, y, kind: str, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx) -> None:
    """kernels.batchnorm.backward on device arrays."""
    launch(_backward, dy.shape[1], THREADS, dy, y, KINDS[kind], dy if kind == "none" else dz, x_hat, inv_std, gamma,
           dgamma, dbeta, dx is not None, dy if dx is None else dx)
