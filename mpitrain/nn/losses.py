"""Losses: the mean loss over the batch, the correct predictions and the gradient with respect to the logits,
from one fused kernel (`mpitrain.kernels.loss`) writing into the model's workspace."""
from __future__ import annotations

import numpy as np

from mpitrain.parallel.backend import array_module
from mpitrain.kernels import loss as kernels
from mpitrain.nn.workspace import Workspace


def softmax_cross_entropy(logits, labels, ws=None):
    """(mean cross-entropy, correct predictions, gradient softmax(logits) - onehot(labels) over the batch).

    The loss and count are float64 numbers of the logits' device (no host round trip); the
    gradient is the workspace part `ws`'s array (a new one when `ws` is None), so a step
    allocates nothing.
    """
    ws = ws or Workspace(array_module(logits)).part("loss")
    grad = ws("grad", logits.shape, logits.dtype)
    totals = ws("totals", (2,), np.float64)
    kernels.softmax_cross_entropy(logits, labels, grad, totals)
    return totals[0:1].reshape(()).copy(), totals[1:2].reshape(()).copy(), grad


def softmax(logits):
    xp = array_module(logits)
    exp = xp.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


LOSSES = {"softmax_cross_entropy": softmax_cross_entropy}
