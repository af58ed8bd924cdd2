"""Softmax cross-entropy in one pass per row: the training loss with its gradient, and evaluation's scores.

    softmax_cross_entropy(logits, labels, grad, totals)  # totals = [mean loss, correct]; grad filled
    weighted_softmax_cross_entropy(logits, labels, weights, grad, totals)  # the mean weighted by weights[label]
    smoothed_softmax_cross_entropy(logits, labels, weights, eps, grad, totals)  # label smoothing eps (weights or None)
    score(logits, labels, confusion, loss_sum)           # adds each row's loss and (label, prediction) count

A row's maximum, sum of exponentials, loss, prediction (the first largest logit, as
`argmax`) and gradient softmax - onehot, divided by the batch, come from one read of its
logits, in float64 whatever the logits' dtype. Nothing is allocated: the outputs are the
caller's (the model's workspace, the evaluation's sums). numpy arrays run the numba kernels
(one thread: a batch's rows are few and short); device arrays (cupy) each form in one launch of
kernels/loss_cuda.py; any other array module the references, which the tests compare the
kernels with.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit
from numba.extending import register_jitable

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference


@register_jitable
def _row(logits, r):
    """(largest logit, the first index holding it, sum of exp(logit - largest)) of row r."""
    c = logits.shape[1]
    largest, at = logits[r, 0], 0
    for j in range(1, c):
        if logits[r, j] > largest:
            largest, at = logits[r, j], j
    total = 0.0
    for j in range(c):
        total += math.exp(logits[r, j] - largest)
    return largest, at, total


@register_jitable
def _cross_entropy_row(logits, r, label, weight, divisor, grad):
    """(row r's cross-entropy, 1 if its prediction is `label`); weight * (softmax - onehot) / divisor into grad[r].
    A weight of 1.0 changes no bit: the unweighted loss is the weighted one with all weights 1."""
    largest, at, total = _row(logits, r)
    for j in range(logits.shape[1]):
        grad[r, j] = (math.exp(logits[r, j] - largest) / total - (j == label)) * weight / divisor
    return math.log(total) - (logits[r, label] - largest), at == label


@njit(cache=True)
def _softmax_cross_entropy_cpu(logits, labels, grad, totals):
    n = logits.shape[0]
    loss, correct = 0.0, 0
    for r in range(n):
        row_loss, right = _cross_entropy_row(logits, r, labels[r], 1.0, n, grad)
        loss += row_loss
        correct += right
    totals[0] = loss / n
    totals[1] = correct


@njit(cache=True)
def _weighted_softmax_cross_entropy_cpu(logits, labels, weights, grad, totals):
    n = logits.shape[0]
    total_weight = 0.0
    for r in range(n):
        total_weight += weights[labels[r]]
    loss, correct = 0.0, 0
    for r in range(n):
        weight = weights[labels[r]]
        row_loss, right = _cross_entropy_row(logits, r, labels[r], weight, total_weight, grad)
        loss += weight * row_loss
        correct += right
    totals[0] = loss / total_weight
    totals[1] = correct


@register_jitable
def _class_weight_sum(weights, weighted, c):
    """The sum of the classes' weights (c when unweighted), in class order."""
    total = 0.0
    for j in range(c):
        total += weights[j] if weighted else 1.0
    return total


@register_jitable
def _smoothed_row(logits, r, label, weights, weighted, eps, weight_sum, total_weight, grad):
    """(row r's label-smoothed loss, weighted, before the division by `total_weight`; 1 if its prediction is
    `label`), its gradient into grad[r]. The CPU and GPU kernels' one row function: the same bits on both."""
    c = logits.shape[1]
    spread = eps / c
    largest, at, total = _row(logits, r)
    log_total = math.log(total)
    weight = weights[label] if weighted else 1.0
    smooth = 0.0  # sum over classes of w_k (-log p_k)
    for j in range(c):
        w = weights[j] if weighted else 1.0
        smooth += w * (log_total - (logits[r, j] - largest))
        p = math.exp(logits[r, j] - largest) / total
        grad[r, j] = ((1.0 - eps) * weight * (p - (j == label)) + spread * (weight_sum * p - w)) / total_weight
    return (1.0 - eps) * weight * (log_total - (logits[r, label] - largest)) + spread * smooth, at == label


@register_jitable
def _score_row(logits, r, label):
    """(row r's cross-entropy, its prediction): evaluation's, without a gradient."""
    largest, at, total = _row(logits, r)
    return math.log(total) - (logits[r, label] - largest), at


@njit(cache=True)
def _smoothed_softmax_cross_entropy_cpu(logits, labels, weights, weighted, eps, grad, totals):
    n, c = logits.shape
    weight_sum = _class_weight_sum(weights, weighted, c)
    total_weight = 0.0  # the rows' label weights
    for r in range(n):
        total_weight += weights[labels[r]] if weighted else 1.0
    loss, correct = 0.0, 0
    for r in range(n):
        row_loss, right = _smoothed_row(logits, r, labels[r], weights, weighted, eps, weight_sum, total_weight, grad)
        loss += row_loss
        correct += right
    totals[0] = loss / total_weight
    totals[1] = correct


@njit(cache=True)
def _score_cpu(logits, labels, confusion, loss_sum):
    c = logits.shape[1]
    for r in range(logits.shape[0]):
        row_loss, at = _score_row(logits, r, labels[r])
        loss_sum[0] += row_loss
        confusion[labels[r] * c + at] += 1


@numpy_or_reference("softmax_cross_entropy_reference", gpu=".loss_cuda")
def softmax_cross_entropy(logits, labels, grad, totals) -> None:
    """Mean cross-entropy of softmax(logits) against integer labels into totals[0], correct predictions into
    totals[1] (`totals`: 2 float64), and its gradient (softmax - onehot) / batch into `grad`."""
    _softmax_cross_entropy_cpu(logits, labels, grad, totals)


@numpy_or_reference("weighted_softmax_cross_entropy_reference", gpu=".loss_cuda")
def weighted_softmax_cross_entropy(logits, labels, weights, grad, totals) -> None:
    """As `softmax_cross_entropy`, each row weighted by weights[label] (float64, one per class): totals[0] = sum of
    w * loss / sum of w, grad = w * (softmax - onehot) / sum of w (PyTorch's CrossEntropyLoss with `weight`)."""
    _weighted_softmax_cross_entropy_cpu(logits, labels, weights, grad, totals)


@numpy_or_reference("smoothed_softmax_cross_entropy_reference", gpu=".loss_cuda")
def smoothed_softmax_cross_entropy(logits, labels, weights, eps: float, grad, totals) -> None:
    """Cross-entropy against labels smoothed by `eps` (each row's target (1 - eps) onehot + eps / classes), each row
    weighted as `weighted_softmax_cross_entropy` (`weights` None: all 1): PyTorch's CrossEntropyLoss(weight,
    label_smoothing), whose smoothing term weighs each class's log-probability by its own weight, the mean divided
    by the rows' label weights."""
    weighted = weights is not None  # unweighted: `totals` stands in for the weights, never read
    _smoothed_softmax_cross_entropy_cpu(logits, labels, weights if weighted else totals, weighted, eps, grad, totals)


@numpy_or_reference("score_reference", gpu=".loss_cuda")
def score(logits, labels, confusion, loss_sum) -> None:
    """Add each row's cross-entropy to loss_sum[0] (float64) and count (label, prediction) in the flat
    `confusion` (classes x classes, int64 or float64)."""
    _score_cpu(logits, labels, confusion, loss_sum)


def _row_losses_reference(logits, labels):
    """(each row's cross-entropy, exp(logits - row max), row sums of those), in float64."""
    xp = array_module(logits)
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    sums = exp.sum(axis=1, keepdims=True)
    return xp.log(sums[:, 0]) - shifted[xp.arange(len(logits)), labels], exp, sums


def softmax_cross_entropy_reference(logits, labels, grad, totals) -> None:
    xp, n = array_module(logits), len(logits)
    losses, exp, sums = _row_losses_reference(logits, labels)
    probabilities = exp / sums
    probabilities[xp.arange(n), labels] -= 1
    grad[...] = probabilities / n
    totals[0] = losses.sum() / n
    totals[1] = (logits.argmax(axis=1) == labels).sum()


def weighted_softmax_cross_entropy_reference(logits, labels, weights, grad, totals) -> None:
    xp, n = array_module(logits), len(logits)
    losses, exp, sums = _row_losses_reference(logits, labels)
    row_weights = weights[labels]
    probabilities = exp / sums
    probabilities[xp.arange(n), labels] -= 1
    grad[...] = probabilities * row_weights[:, None] / row_weights.sum()
    totals[0] = (row_weights * losses).sum() / row_weights.sum()
    totals[1] = (logits.argmax(axis=1) == labels).sum()


def smoothed_softmax_cross_entropy_reference(logits, labels, weights, eps: float, grad, totals) -> None:
    xp, (n, c) = array_module(logits), logits.shape
    losses, exp, sums = _row_losses_reference(logits, labels)
    log_probabilities = xp.log(exp / sums)
    weights = xp.ones(c) if weights is None else weights
    row_weights, total = weights[labels], weights[labels].sum()
    smooth = -(log_probabilities * weights).sum(axis=1)
    probabilities = exp / sums
    onehot = xp.zeros_like(probabilities)
    onehot[xp.arange(n), labels] = 1
    grad[...] = ((1 - eps) * row_weights[:, None] * (probabilities - onehot)
                 + eps / c * (weights.sum() * probabilities - weights)) / total
    totals[0] = ((1 - eps) * (row_weights * losses).sum() + eps / c * smooth.sum()) / total
    totals[1] = (logits.argmax(axis=1) == labels).sum()


def score_reference(logits, labels, confusion, loss_sum) -> None:
    xp, c = array_module(logits), logits.shape[1]
    loss_sum += _row_losses_reference(logits, labels)[0].sum()
    confusion += xp.bincount(labels * c + logits.argmax(axis=1), minlength=c * c)
