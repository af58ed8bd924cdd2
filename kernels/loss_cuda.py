"""Softmax cross-entropy on a GPU in one launch: the gradient, the mean loss and the correct count of a batch, where
the references made about 15 launches and as many temporaries.

One block of THREADS threads: thread t takes rows t, t + THREADS, ... with the CPU kernel's row function
(`_cross_entropy_row` of kernels/loss.py: the row's maximum, sum of exponentials, loss, prediction and gradient from
one read of its logits, in float64), so each gradient element is the CPU's, bit for bit. The block then sums its
threads' parts in shared memory in a fixed tree order: the loss does not depend on the order threads ran (it
differs from the CPU's sequential sum only in rounding). A batch's rows are few, so one block is enough; the
weighted form sums the rows' label weights first, the same way. Under the CUDA simulator the same kernel runs on
numpy arrays (tests/harness/cuda_kernels_check.py).
"""
from __future__ import annotations

from numba import cuda, float64

from .cuda_launch import launch
from .cuda_reduce import block_sum
from .loss import _cross_entropy_row

THREADS = 256  # the block; a power of two (the tree sum halves it)


@cuda.jit
def _cross_entropy(logits, labels, weights, weighted, grad, totals):
    t, n = cuda.threadIdx.x, logits.shape[0]
    part = cuda.shared.array(THREADS, float64)
    total = 0.0
    for r in range(t, n, THREADS):
        total += weights[labels[r]] if weighted else 1.0
    part[t] = total
    cuda.syncthreads()
    block_sum(part, t)
    total_weight = part[0]
    cuda.syncthreads()
    loss, right = 0.0, 0.0
    for r in range(t, n, THREADS):
        weight = weights[labels[r]] if weighted else 1.0
        row_loss, hit = _cross_entropy_row(logits, r, labels[r], weight, total_weight, grad)
        loss += weight * row_loss
        right += hit
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
