"""Losses that are a mean over every element of the logits, each in one pass: sigmoid cross-entropy (binary and
multilabel targets) and the regression losses.

    sigmoid_cross_entropy(logits, targets, pos_weight, grad, totals)  # totals = [mean loss, rows all right]
    regression(logits, targets, kind, delta, grad, totals)            # kind: MSE, L1 or HUBER; totals[1] = 0

Each element's loss and its gradient, divided by the number of elements, come from one read
of the logit and target, in float64 whatever their dtype; the gradient is written in the
logits' dtype into the caller's `grad` (the model's workspace), so nothing is allocated.
numpy arrays run the numba kernels; other arrays (cupy) run the references, which the tests
compare the kernels with.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference

MSE, L1, HUBER = 0, 1, 2


@njit(cache=True)
def _sigmoid_cross_entropy_cpu(logits, targets, pos_weight, grad, totals):
    n, k = logits.shape
    loss, right_rows = 0.0, 0
    for r in range(n):
        right = True
        for j in range(k):
            x, t = np.float64(logits[r, j]), np.float64(targets[r, j])
            # -log sigmoid(x) = softplus(-x), -log(1 - sigmoid(x)) = softplus(x), both from exp(-|x|) <= 1
            e = math.exp(-abs(x))
            log1p = math.log1p(e)
            if x >= 0:
                p, q = 1.0 / (1.0 + e), e / (1.0 + e)  # sigmoid(x), sigmoid(-x) = 1 - sigmoid(x)
                loss += pos_weight * t * log1p + (1.0 - t) * (x + log1p)
            else:
                p, q = e / (1.0 + e), 1.0 / (1.0 + e)
                loss += pos_weight * t * (log1p - x) + (1.0 - t) * log1p
            grad[r, j] = ((1.0 - t) * p - pos_weight * t * q) / (n * k)
            right = right and (x > 0) == (t > 0.5)
        right_rows += right
    totals[0] = loss / (n * k)
    totals[1] = right_rows


@njit(cache=True)
def _regression_cpu(logits, targets, kind, delta, grad, totals):
    n, k = logits.shape
    loss = 0.0
    for r in range(n):
        for j in range(k):
            d = np.float64(logits[r, j]) - np.float64(targets[r, j])
            sign = (d > 0) - (d < 0)  # l1's and huber's subgradient is 0 at 0
            if kind == MSE:
                loss += d * d
                g = 2.0 * d
            elif kind == L1:
                loss += abs(d)
                g = float(sign)
            elif abs(d) < delta:
                loss += 0.5 * d * d
                g = d
            else:
                loss += delta * (abs(d) - 0.5 * delta)
                g = delta * sign
            grad[r, j] = g / (n * k)
    totals[0] = loss / (n * k)
    totals[1] = 0.0


@numpy_or_reference("sigmoid_cross_entropy_reference")
def sigmoid_cross_entropy(logits, targets, pos_weight, grad, totals) -> None:
    """Mean over all elements of -(pos_weight * t * log sigmoid(x) + (1 - t) * log(1 - sigmoid(x))) into totals[0]
    (PyTorch's BCEWithLogitsLoss), the rows whose every (x > 0) is (t > 0.5) into totals[1], the gradient into grad."""
    _sigmoid_cross_entropy_cpu(logits, targets, float(pos_weight), grad, totals)


@numpy_or_reference("regression_reference")
def regression(logits, targets, kind, delta, grad, totals) -> None:
    """Mean over all elements of (x - t)**2 (kind MSE), |x - t| (L1) or Huber's 0.5 d**2 below `delta`, delta *
    (|d| - delta / 2) above (HUBER) into totals[0], 0 into totals[1], the gradient into grad."""
    _regression_cpu(logits, targets, kind, float(delta), grad, totals)


def _softplus_reference(xp, x):
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


def sigmoid_cross_entropy_reference(logits, targets, pos_weight, grad, totals) -> None:
    xp = array_module(logits)
    x, t = logits.astype(np.float64), targets.astype(np.float64)
    losses = pos_weight * t * _softplus_reference(xp, -x) + (1 - t) * _softplus_reference(xp, x)
    e = xp.exp(-xp.abs(x))
    p, q = xp.where(x >= 0, 1 / (1 + e), e / (1 + e)), xp.where(x >= 0, e / (1 + e), 1 / (1 + e))  # sigmoid(+-x)
    grad[...] = ((1 - t) * p - pos_weight * t * q) / x.size
    totals[0] = losses.sum() / x.size
    totals[1] = ((x > 0) == (t > 0.5)).all(axis=1).sum()


def regression_reference(logits, targets, kind, delta, grad, totals) -> None:
    xp = array_module(logits)
    d = logits.astype(np.float64) - targets.astype(np.float64)
    if kind == MSE:
        losses, g = d * d, 2 * d
    elif kind == L1:
        losses, g = xp.abs(d), xp.sign(d)
    else:
        small = xp.abs(d) < delta
        losses = xp.where(small, 0.5 * d * d, delta * (xp.abs(d) - 0.5 * delta))
        g = xp.where(small, d, delta * xp.sign(d))
    grad[...] = g / d.size
    totals[0] = losses.sum() / d.size
    totals[1] = 0
