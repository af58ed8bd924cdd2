"""Every updater's step as one fused pass over the flat buffers, L2 included.

    sgd_step(g, p, decay, lr, out)                                  # out = -lr G
    momentum_step(v, g, p, decay, lr, mu, nesterov, out)            # v = mu v - lr G; out = v or mu v - lr G
    adagrad_step(h, g, p, decay, lr, eps, out)                      # h += G^2; out = -lr G / (sqrt(h) + eps)
    rmsprop_step(h, g, p, decay, lr, rho, eps, out)                 # h = rho h + (1 - rho) G^2; out as AdaGrad
    adam_step(m, v, g, p, decay, lr, beta1, beta2, eps, t, out)     # bias-corrected Adam at step t (from 1)
    adam_variant_step(m, v, vmax, g, p, decay, wd, lr, beta1, beta2, eps, t, out)  # AMSGrad (vmax), AdamW (wd)
    nadam_step(m, v, g, p, decay, lr, beta1, beta2, eps, mu, mu_next, product, product_next, t, out)  # NAdam

G = g + decay p is the gradient with L2 (`decay`: l2 on weights, 0 on biases), or g itself
when `decay` is None (no L2: p and decay are not read). The state slots (v, h, m) are updated in
place and the step to ADD to p (learning rate included) is written into `out`; for momentum
`out` may be `v` itself. numpy arrays run numba kernels: one pass, parallel over elements,
allocating nothing, strided views accepted; scalars are cast to the array's dtype, so float32
computes in float32. Other arrays (cupy) run the `*_reference` versions, written for any array
module with `out=` and in-place ops, which the tests compare the kernels with; they allocate
only where the step needs a second array beside `out` (G with L2; momentum's -lr G when `out`
is `v`, and mu v with Nesterov). Both keep the unfused numpy steps' formulas and order of
operations, so they agree with them to float rounding (bit for bit on the CPU tested). cupy arrays
run kernels/updaters_cuda.py's one kernel per step instead; the references stay the tests' oracle.
"""
from __future__ import annotations

import math

from numba import njit, prange
from numba.extending import register_jitable

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference


@numpy_or_reference("sgd_step_reference", on="out", gpu=".updaters_cuda")
def sgd_step(g, p, decay, lr: float, out) -> None:
    """Plain SGD: out = -lr (g + decay p)."""
    _sgd_cpu(g, p, decay, out.dtype.type(lr), out)


@numpy_or_reference("momentum_step_reference", gpu=".updaters_cuda")
def momentum_step(v, g, p, decay, lr: float, mu: float, nesterov: bool, out) -> None:
    """Momentum: v = mu v - lr (g + decay p) in place; out = v, or mu v - lr (g + decay p) with Nesterov."""
    dtype = v.dtype.type
    _momentum_cpu(v, g, p, decay, dtype(lr), dtype(mu), nesterov, out)


@numpy_or_reference("adagrad_step_reference", gpu=".updaters_cuda")
def adagrad_step(h, g, p, decay, lr: float, eps: float, out) -> None:
    """AdaGrad: h += G^2 in place; out = -lr G / (sqrt(h) + eps), G = g + decay p."""
    dtype = h.dtype.type
    _adagrad_cpu(h, g, p, decay, dtype(lr), dtype(eps), out)


@numpy_or_reference("rmsprop_step_reference", gpu=".updaters_cuda")
def rmsprop_step(h, g, p, decay, lr: float, rho: float, eps: float, out) -> None:
    """RMSProp: h = rho h + (1 - rho) G^2 in place; out = -lr G / (sqrt(h) + eps), G = g + decay p."""
    dtype = h.dtype.type
    _rmsprop_cpu(h, g, p, decay, dtype(lr), dtype(rho), dtype(1 - rho), dtype(eps), out)


@numpy_or_reference("adam_step_reference", gpu=".updaters_cuda")
def adam_step(m, v, g, p, decay, lr: float, beta1: float, beta2: float, eps: float, t: int, out) -> None:
    """Adam's step `t` (from 1): m, v moving averages of G and G^2 in place; out the bias-corrected step (the
    variants' kernel without AMSGrad and decoupled decay: the same operations in the same order)."""
    adam_variant_step(m, v, None, g, p, decay, None, lr, beta1, beta2, eps, t, out)


@numpy_or_reference("adam_variant_step_reference", gpu=".updaters_cuda")
def adam_variant_step(m, v, vmax, g, p, decay, wd, lr: float, beta1: float, beta2: float, eps: float, t: int,
                      out) -> None:
    """Adam's step `t` with AMSGrad and/or AdamW's decoupled weight decay: `vmax` (None: plain Adam's denominator)
    keeps the largest second moment so far and divides by it; `wd` (None: none) is the decay per parameter (the
    weight decay on weights, 0 on biases), out -= lr wd p beside the gradient's step, which `decay` (L2) may still
    enter as in `adam_step`."""
    dtype = m.dtype.type
    step, eps_hat = adam_correction(lr, beta1, beta2, eps, t)
    _adam_variant_cpu(m, v, m[:0] if vmax is None else vmax, vmax is not None, g, p, decay, wd, dtype(lr),
                      dtype(beta1), dtype(1 - beta1), dtype(beta2), dtype(1 - beta2), dtype(step), dtype(eps_hat), out)


@numpy_or_reference("nadam_step_reference", gpu=".updaters_cuda")
def nadam_step(m, v, g, p, decay, lr: float, beta1: float, beta2: float, eps: float, mu: float, mu_next: float,
               product: float, product_next: float, t: int, out) -> None:
    """NAdam's step `t` (Dozat 2016, as PyTorch's NAdam): m, v as Adam's; out = -(lr (1 - mu) / (1 - product) G
    + lr mu_next / (1 - product_next) m) / (sqrt(v / (1 - beta2^t)) + eps), where mu is the momentum of step t,
    mu_next of step t + 1 and product, product_next their running products (`nadam_momenta`)."""
    dtype = m.dtype.type
    _nadam_cpu(m, v, g, p, decay, dtype(beta1), dtype(1 - beta1), dtype(beta2), dtype(1 - beta2),
               dtype(1 - beta2 ** t), dtype(eps), dtype(lr * (1 - mu) / (1 - product)),
               dtype(lr * mu_next / (1 - product_next)), out)


def nadam_momentum(beta1: float, momentum_decay: float, t: int) -> float:
    """NAdam's momentum of step t: beta1 (1 - 0.96^(t momentum_decay) / 2)."""
    return beta1 * (1.0 - 0.5 * 0.96 ** (t * momentum_decay))


def adam_correction(lr: float, beta1: float, beta2: float, eps: float, t: int) -> tuple:
    """(step, eps_hat) of Adam's step t: out = -step m / (sqrt(v) + eps_hat), the bias correction folded in.

    step = lr sqrt(1 - beta2^t) / (1 - beta1^t), eps_hat = eps sqrt(1 - beta2^t): the same as
    -lr m_hat / (sqrt(v_hat) + eps) with m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t).
    """
    root = (1 - beta2 ** t) ** 0.5
    return lr * root / (1 - beta1 ** t), eps * root


@register_jitable
def _gradient(g, p, decay, i):
    """Element i of the gradient with L2, g + decay p; g alone when `decay` is None."""
    if decay is None:
        return g[i]
    return g[i] + decay[i] * p[i]


@register_jitable
def _decayed_square(h, gi, rho, gain):
    """rho h + gain gi^2, multiplied in the unfused step's order ((gain gi) gi)."""
    return rho * h + gain * gi * gi


@register_jitable
def _moments(m, v, g, p, decay, i, beta1, gain1, beta2, gain2):
    """(G, m, v) of element i: the gradient with L2, and Adam's moving averages of G and G^2, stored in place."""
    gi = _gradient(g, p, decay, i)
    mi = beta1 * m[i] + gain1 * gi
    vi = _decayed_square(v[i], gi, beta2, gain2)
    m[i] = mi
    v[i] = vi
    return gi, mi, vi


@register_jitable
def _normalized_step(numerator, h, eps, lr):
    """-lr numerator / (sqrt(h) + eps), divided first as the unfused step did."""
    return numerator / (math.sqrt(h) + eps) * -lr


@njit(parallel=True, cache=True)
def _sgd_cpu(g, p, decay, lr, out):
    """`sgd_step` on numpy arrays."""
    for i in prange(out.size):
        out[i] = _gradient(g, p, decay, i) * -lr


@njit(parallel=True, cache=True)
def _momentum_cpu(v, g, p, decay, lr, mu, nesterov, out):
    """`momentum_step` on numpy arrays."""
    for i in prange(v.size):
        step = _gradient(g, p, decay, i) * -lr
        vi = mu * v[i] + step
        v[i] = vi
        out[i] = mu * vi + step if nesterov else vi


@njit(parallel=True, cache=True)
def _adagrad_cpu(h, g, p, decay, lr, eps, out):
    """`adagrad_step` on numpy arrays."""
    for i in prange(h.size):
        gi = _gradient(g, p, decay, i)
        hi = h[i] + gi * gi
        h[i] = hi
        out[i] = _normalized_step(gi, hi, eps, lr)


@njit(parallel=True, cache=True)
def _rmsprop_cpu(h, g, p, decay, lr, rho, gain, eps, out):
    """`rmsprop_step` on numpy arrays; gain = 1 - rho, rounded as the unfused step rounds it."""
    for i in prange(h.size):
        gi = _gradient(g, p, decay, i)
        hi = _decayed_square(h[i], gi, rho, gain)
        h[i] = hi
        out[i] = _normalized_step(gi, hi, eps, lr)


@njit(parallel=True, cache=True)
def _adam_variant_cpu(m, v, vmax, amsgrad, g, p, decay, wd, lr, beta1, gain1, beta2, gain2, step, eps_hat, out):
    """`adam_variant_step` (and `adam_step`) on numpy arrays, the bias correction folded into step and eps_hat
    (`adam_correction`); `vmax` empty without `amsgrad`, `wd` None without decoupled decay."""
    for i in prange(m.size):
        _, mi, vi = _moments(m, v, g, p, decay, i, beta1, gain1, beta2, gain2)
        if amsgrad:
            vi = max(vmax[i], vi)
            vmax[i] = vi
        di = _normalized_step(mi, vi, eps_hat, step)
        if wd is not None:
            di -= lr * wd[i] * p[i]
        out[i] = di


@njit(parallel=True, cache=True)
def _nadam_cpu(m, v, g, p, decay, beta1, gain1, beta2, gain2, correction2, eps, grad_step, moment_step, out):
    """`nadam_step` on numpy arrays."""
    for i in prange(m.size):
        gi, mi, vi = _moments(m, v, g, p, decay, i, beta1, gain1, beta2, gain2)
        out[i] = -(grad_step * gi + moment_step * mi) / (math.sqrt(vi / correction2) + eps)


def sgd_step_reference(g, p, decay, lr: float, out) -> None:
    """`sgd_step` for any array module: G into `out`, scaled there."""
    array_module(out).multiply(_gradient_reference(g, p, decay, out), -lr, out=out)


def momentum_step_reference(v, g, p, decay, lr: float, mu: float, nesterov: bool, out) -> None:
    """`momentum_step` for any array module; the step -lr G goes into `out` unless `out` is `v`."""
    xp = array_module(v)
    scratch = None if out is v else out
    step = xp.multiply(_gradient_reference(g, p, decay, scratch), -lr, out=scratch)
    v *= mu
    v += step
    if nesterov:
        xp.add(mu * v, step, out=out)
    elif out is not v:
        out[...] = v


def adagrad_step_reference(h, g, p, decay, lr: float, eps: float, out) -> None:
    """`adagrad_step` for any array module, with `out` as scratch for G^2."""
    g = _gradient_reference(g, p, decay, None)
    array_module(h).multiply(g, g, out=out)
    h += out
    _normalized_step_reference(g, h, eps, lr, out)


def rmsprop_step_reference(h, g, p, decay, lr: float, rho: float, eps: float, out) -> None:
    """`rmsprop_step` for any array module, with `out` as scratch for (1 - rho) G^2."""
    g = _gradient_reference(g, p, decay, None)
    _decayed_square_reference(h, g, rho, out)
    _normalized_step_reference(g, h, eps, lr, out)


def adam_step_reference(m, v, g, p, decay, lr: float, beta1: float, beta2: float, eps: float, t: int,
                        out) -> None:
    """`adam_step` for any array module, with `out` as scratch for the moments' increments."""
    adam_variant_step_reference(m, v, None, g, p, decay, None, lr, beta1, beta2, eps, t, out)


def adam_variant_step_reference(m, v, vmax, g, p, decay, wd, lr: float, beta1: float, beta2: float, eps: float,
                                t: int, out) -> None:
    """`adam_variant_step` for any array module, with `out` as scratch; AdamW's decay allocates one array."""
    xp = array_module(m)
    g = _gradient_reference(g, p, decay, None)
    m *= beta1
    m += xp.multiply(g, 1 - beta1, out=out)
    _decayed_square_reference(v, g, beta2, out)
    if vmax is not None:
        xp.maximum(vmax, v, out=vmax)
    step, eps_hat = adam_correction(lr, beta1, beta2, eps, t)
    _normalized_step_reference(m, v if vmax is None else vmax, eps_hat, step, out)
    if wd is not None:
        out -= lr * wd * p


def nadam_step_reference(m, v, g, p, decay, lr: float, beta1: float, beta2: float, eps: float, mu: float,
                         mu_next: float, product: float, product_next: float, t: int, out) -> None:
    """`nadam_step` for any array module, with `out` as scratch; its sum allocates one array."""
    xp = array_module(m)
    g = _gradient_reference(g, p, decay, None)
    m *= beta1
    m += xp.multiply(g, 1 - beta1, out=out)
    _decayed_square_reference(v, g, beta2, out)
    xp.divide(v, 1 - beta2 ** t, out=out)
    xp.sqrt(out, out=out)
    out += eps
    numerator = g * (lr * (1 - mu) / (1 - product)) + m * (lr * mu_next / (1 - product_next))
    xp.divide(numerator, out, out=out)
    out *= -1


def _gradient_reference(g, p, decay, out):
    """g + decay p into `out` (a new array when `out` is None); `g` itself when `decay` is None."""
    if decay is None:
        return g
    out = array_module(p).multiply(p, decay, out=out)
    out += g
    return out


def _decayed_square_reference(h, g, rho: float, scratch) -> None:
    """h = rho h + (1 - rho) g^2 in place, through `scratch`."""
    h *= rho
    array_module(h).multiply(g, 1 - rho, out=scratch)
    scratch *= g
    h += scratch


def _normalized_step_reference(numerator, h, eps: float, lr: float, out) -> None:
    """out = -lr numerator / (sqrt(h) + eps); `out` may not be `numerator`."""
    xp = array_module(h)
    xp.sqrt(h, out=out)
    out += eps
    xp.divide(numerator, out, out=out)
    out *= -lr
