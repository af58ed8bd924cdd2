"""Losses: the mean loss over the batch and its gradient with respect to the logits."""
from __future__ import annotations

from mpitrain.backend import array_module


def _shifted_exp(logits):
    """(logits - row max, its exp, the row sums of the exp): the stable pieces of softmax and log-sum-exp."""
    xp = array_module(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    return shifted, exp, exp.sum(axis=1, keepdims=True)


def _cross_entropy_rows(shifted, sums, labels):
    xp = array_module(shifted)
    return xp.log(sums[:, 0]) - shifted[xp.arange(len(shifted)), labels]


def per_row_cross_entropy(logits, labels):
    """Cross-entropy of softmax(logits) against integer labels, one value per row (log-sum-exp)."""
    shifted, _, sums = _shifted_exp(logits)
    return _cross_entropy_rows(shifted, sums, labels)


def softmax(logits):
    _, exp, sums = _shifted_exp(logits)
    return exp / sums


def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy (a 0-d array on the logits' device: no host round trip) and its gradient
    softmax(logits) - onehot(labels), over the batch.

    The exponentials are computed once for both (this runs every training step).
    """
    xp = array_module(logits)
    n = len(logits)
    shifted, exp, sums = _shifted_exp(logits)
    loss = _cross_entropy_rows(shifted, sums, labels).sum() / n
    grad = exp / sums
    grad[xp.arange(n), labels] -= 1
    grad /= n
    return loss, grad


LOSSES = {"softmax_cross_entropy": softmax_cross_entropy}
