"""Softmax cross-entropy on a GPU in one launch: the gradient, the mean loss and the correct count of a batch, where
the references made about 15 launches and as many temporaries.

One block of THREADS threads: thread t takes rows t, t + THREADS, ... with the CPU kernel's row function
(`_cross_entropy_row` of kernels/loss.py: the row's maximum, sum of exponentials, loss, prediction and gradient from
one read of its logits, in float64), so each gradient element is the CPU's, bit for bit. The block then sums its
threads' parts in shared memory in a fixed tree order: the loss does not depend on the order threads ran (it
differs from the CPU's sequential sum only in rounding). A batch's rows are few, so one block is enough; the
weighted form sums the rows' label weights first, the same way. Under the CUDA simulator the same kernel runs on
numpy arrays (tests/harness/cuda_kernels_check.py). Label smoothing (`_smoothed`) runs the CPU's row function
`_smoothed_row` the same way; evaluation's `score` sums the rows' losses so and counts (label, prediction) pairs by
atomic adds, exact in any order.
"""
from __future__ import annotations

from numba import cuda, float64

from .cuda_launch import launch
from .cuda_reduce import block_sum
from .loss import _class_weight_sum, _cross_entropy_row, _score_row, _smoothed_row

THREADS = 256  # the block; a power of two (the tree sum halves it)


@cuda.jit(device=True)
def _label_weights(part, t, labels, weights, weighted):
    """The batch's rows' label weights summed (its rows when unweighted), the block's tree sum, on every thread."""
    total = 0.0
    for r in range(t, labels.shape[0], THREADS):
        total += weights[labels[r]] if weighted else 1.0
    part[t] = total
    cuda.syncthreads()
    block_sum(part, t)
    total = part[0]
    cuda.syncthreads()
    return total


@cuda.jit
def _cross_entropy(logits, labels, weights, weighted, grad, totals):
    t, n = cuda.threadIdx.x, logits.shape[0]
    part = cuda.shared.array(THREADS, float64)
    total_weight = _label_weights(part, t, labels, weights, weighted)
    loss, right = 0.0, 0.0
    for r in range(t, n, THREADS):
        weight = weights[labels[r]] if weighted else 1.0
        row_loss, hit = _cross_entropy_row(logits, r, labels[r], weight, total_weight, grad)
        loss += weight * row_loss
        right += hit
    _totals(part, t, loss, right, total_weight, totals)


@cuda.jit
def _smoothed(logits, labels, weights, weighted, eps, grad, totals):
    t, (n, c) = cuda.threadIdx.x, logits.shape
    part = cuda.shared.array(THREADS, float64)
    weight_sum = _class_weight_sum(weights, weighted, c)  # every thread the same, in class order as the CPU
    total_weight = _label_weights(part, t, labels, weights, weighted)
    loss, right = 0.0, 0.0
    for r in range(t, n, THREADS):
        row_loss, hit = _smoothed_row(logits, r, labels[r], weights, weighted, eps, weight_sum, total_weight, grad)
        loss += row_loss
        right += hit
    _totals(part, t, loss, right, total_weight, totals)


@cuda.jit
def _score(logits, labels, confusion, loss_sum):
    t, (n, c) = cuda.threadIdx.x, logits.shape
    part = cuda.shared.array(THREADS, float64)
    loss = 0.0
    for r in range(t, n, THREADS):
        row_loss, at = _score_row(logits, r, labels[r])
        loss += row_loss
        cuda.atomic.add(confusion, labels[r] * c + at, 1)  # counts: exact in any order
    part[t] = loss
    cuda.syncthreads()
    block_sum(part, t)
    if t == 0:
        loss_sum[0] += part[0]


@cuda.jit(device=True)
def _totals(part, t, loss, right, total_weight, totals):
    """The block's tree sums of its threads' `loss` and `right`: totals[0] = loss / total_weight, totals[1] = right."""
    part[t] = loss
    cuda.syncthreads()
    block_sum(part, t)
    if t == 0:
        totals[0] = part[0] / total_weight
    cuda.syncthreads()
    part[t] = right
    cuda.syncthreads()
    block_sum(part, t)
    if t == 0:
        totals[1] = part[0]


def softmax_cross_entropy(logits, labels, grad, totals) -> None:
    """kernels.loss.softmax_cross_entropy on device arrays."""
    if len(logits):
        launch(_cross_entropy, 1, THREADS, logits, labels, totals, False, grad, totals)  # totals: unread weights


def weighted_softmax_cross_entropy(logits, labels, weights, grad, totals) -> None:
    """kernels.loss.weighted_softmax_cross_entropy on device arrays."""
    if len(logits):
        launch(_cross_entropy, 1, THREADS, logits, labels, weights, True, grad, totals)


def smoothed_softmax_cross_entropy(logits, labels, weights, eps: float, grad, totals) -> None:
    """kernels.loss.smoothed_softmax_cross_entropy on device arrays (`weights` None: all 1)."""
    if len(logits):
        weighted = weights is not None  # unweighted: `totals` stands in for the weights, never read
        launch(_smoothed, 1, THREADS, logits, labels, weights if weighted else totals, weighted, eps, grad, totals)


def score(logits, labels, confusion, loss_sum) -> None:
    """kernels.loss.score on device arrays: each row's loss into loss_sum[0], its (label, prediction) counted."""
    if len(logits):
        launch(_score, 1, THREADS, logits, labels, confusion, loss_sum)
