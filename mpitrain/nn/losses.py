"""Losses: the mean loss over the batch and its gradient with respect to the logits."""
from __future__ import annotations

from mpitrain.backend import array_module


def per_row_cross_entropy(logits, labels):
    """Cross-entropy of softmax(logits) against integer labels, one value per row (log-sum-exp)."""
    xp = array_module(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    return xp.log(xp.exp(shifted).sum(axis=1)) - shifted[xp.arange(len(logits)), labels]


def softmax(logits):
    xp = array_module(logits)
    exp = xp.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy and its gradient softmax(logits) - onehot(labels), over the batch."""
    xp = array_module(logits)
    n = len(logits)
    loss = float(per_row_cross_entropy(logits, labels).sum()) / n
    grad = softmax(logits)
    grad[xp.arange(n), labels] -= 1
    grad /= n
    return loss, grad


LOSSES = {"softmax_cross_entropy": softmax_cross_entropy}
