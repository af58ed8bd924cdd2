"""Every updater's step on a GPU as one numba-CUDA kernel over the flat buffers (kernels/updaters.py says what each
computes), launched on cupy's current stream, where the `*_reference` ufuncs made 3-12 launches a step.

A thread computes one element with the per-element functions the CPU kernels share (`_decayed_square`, `_moments`'s
parts, `_normalized_step`), in the same order of operations. L2's `decay` and AdamW's `wd` travel as a flag and an
array (an empty one when off), so no kernel takes None. The arrays' numba views are made once per buffer
(`kernels.cuda_launch`). Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) the same kernels run on numpy
arrays: tests/harness/cuda_kernels_check.py holds them to the CPU kernels there and on a GPU.
"""
from __future__ import annotations

import math

from numba import cuda

from .cuda_launch import launch_over
from .updaters import _decayed_square, _normalized_step, adam_correction

BLOCK = 256


@cuda.jit(device=True)
def _g(g, p, decay, l2, i):
    """Element i of the gradient with L2 (g + decay p), or g."""
    return g[i] + decay[i] * p[i] if l2 else g[i]


@cuda.jit
def _sgd(g, p, decay, l2, lr, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = _g(g, p, decay, l2, i) * -lr


@cuda.jit
def _momentum(v, g, p, decay, l2, lr, mu, nesterov, out):
    i = cuda.grid(1)
    if i < v.size:
        step = _g(g, p, decay, l2, i) * -lr
        vi = mu * v[i] + step
        v[i] = vi
        out[i] = mu * vi + step if nesterov else vi


@cuda.jit
def _adagrad(h, g, p, decay, l2, lr, eps, out):
    i = cuda.grid(1)
    if i < h.size:
        gi = _g(g, p, decay, l2, i)
        hi = h[i] + gi * gi
        h[i] = hi
        out[i] = _normalized_step(gi, hi, eps, lr)


@cuda.jit
def _rmsprop(h, g, p, decay, l2, lr, rho, gain, eps, out):
    i = cuda.grid(1)
    if i < h.size:
        gi = _g(g, p, decay, l2, i)
        hi = _decayed_square(h[i], gi, rho, gain)
        h[i] = hi
        out[i] = _normalized_step(gi, hi, eps, lr)


@cuda.jit(device=True)
def _moments(m, v, gi, i, beta1, gain1, beta2, gain2):
    """Adam's moving averages of element i's gradient `gi` and its square, stored in place."""
    mi = beta1 * m[i] + gain1 * gi
    vi = _decayed_square(v[i], gi, beta2, gain2)
    m[i] = mi
    v[i] = vi
    return mi, vi


@cuda.jit
def _adam_variant(m, v, vmax, amsgrad, g, p, decay, l2, wd, decoupled, lr, beta1, gain1, beta2, gain2, step, eps_hat,
                  out):
    i = cuda.grid(1)
    if i < m.size:
        mi, vi = _moments(m, v, _g(g, p, decay, l2, i), i, beta1, gain1, beta2, gain2)
        if amsgrad:
            vi = max(vmax[i], vi)
            vmax[i] = vi
        di = _normalized_step(mi, vi, eps_hat, step)
        if decoupled:
            di -= lr * wd[i] * p[i]
        out[i] = di


@cuda.jit
def _nadam(m, v, g, p, decay, l2, beta1, gain1, beta2, gain2, correction2, eps, grad_step, moment_step, out):
    i = cuda.grid(1)
    if i < m.size:
        gi = _g(g, p, decay, l2, i)
        mi, vi = _moments(m, v, gi, i, beta1, gain1, beta2, gain2)
        out[i] = -(grad_step * gi + moment_step * mi) / (math.sqrt(vi / correction2) + eps)


def sgd_step(g, p, decay, lr: float, out) -> None:
    dtype = out.dtype.type
    launch_over(_sgd, out.size, BLOCK, g, p, *_optional(decay, p), dtype(lr), out)


def momentum_step(v, g, p, decay, lr: float, mu: float, nesterov: bool, out) -> None:
    dtype = v.dtype.type
    launch_over(_momentum, v.size, BLOCK, v, g, p, *_optional(decay, p), dtype(lr), dtype(mu), nesterov, out)


def adagrad_step(h, g, p, decay, lr: float, eps: float, out) -> None:
    dtype = h.dtype.type
    launch_over(_adagrad, h.size, BLOCK, h, g, p, *_optional(decay, p), dtype(lr), dtype(eps), out)


def rmsprop_step(h, g, p, decay, lr: float, rho: float, eps: float, out) -> None:
    dtype = h.dtype.type
    launch_over(_rmsprop, h.size, BLOCK, h, g, p, *_optional(decay, p), dtype(lr), dtype(rho), dtype(1 - rho),
                dtype(eps), out)


def adam_step(m, v, g, p, decay, lr: float, beta1: float, beta2: float, eps: float, t: int, out) -> None:
    adam_variant_step(m, v, None, g, p, decay, None, lr, beta1, beta2, eps, t, out)


def adam_variant_step(m, v, vmax, g, p, decay, wd, lr: float, beta1: float, beta2: float, eps: float, t: int,
                      out) -> None:
    dtype = m.dtype.type
    step, eps_hat = adam_correction(lr, beta1, beta2, eps, t)
    launch_over(_adam_variant, m.size, BLOCK, m, v, *_optional(vmax, m), g, p, *_optional(decay, p),
                *_optional(wd, p), dtype(lr), dtype(beta1), dtype(1 - beta1), dtype(beta2), dtype(1 - beta2),
                dtype(step), dtype(eps_hat), out)


def nadam_step(m, v, g, p, decay, lr: float, beta1: float, beta2: float, eps: float, mu: float, mu_next: float,
               product: float, product_next: float, t: int, out) -> None:
    dtype = m.dtype.type
    launch_over(_nadam, m.size, BLOCK, m, v, g, p, *_optional(decay, p), dtype(beta1), dtype(1 - beta1),
                dtype(beta2), dtype(1 - beta2), dtype(1 - beta2 ** t), dtype(eps),
                dtype(lr * (1 - mu) / (1 - product)), dtype(lr * mu_next / (1 - product_next)), out)


def _optional(array, like) -> tuple:
    """(the array, True), or for None an empty array of `like`'s and False: a kernel's optional operand."""
    return (like[:0], False) if array is None else (array, True)

