"""An embedding table's gather and scatter-add on a GPU, one launch each, where the references took cupy's fancy
indexing and `cupyx.scatter_add`.

- `gather_rows`: a thread per element of `out`.
- `scatter_add_rows`: a thread per column of the table, adding the batch's rows into it in the batch's order, as
  the CPU kernel does: repeated ids add up in the same order on every run and on either device (atomic adds would
  add them in whatever order the threads ran). A table's columns are few (its dim), so this trades parallelism for
  sums that do not change from run to run; the GPU check measures what it costs.

The arguments are those of kernels/embedding.py's functions (`out` and `values` may be strided views). Under the
CUDA simulator the same kernels run on numpy arrays (tests/harness/cuda_kernels_check.py).
"""
from __future__ import annotations

from numba import cuda

from .cuda_launch import launch_over

BLOCK = 256


@cuda.jit
def _gather(table, ids, out):
    k = cuda.grid(1)
    dim = out.shape[1]
    if k < ids.size * dim:
        i, j = k // dim, k % dim
        out[i, j] = table[ids[i], j]


@cuda.jit
def _scatter_add(grad, ids, values):
    j = cuda.grid(1)
    if j < grad.shape[1]:
        for i in range(ids.size):
            grad[ids[i], j] += values[i, j]


def gather_rows(table, ids, out) -> None:
    """kernels.embedding.gather_rows on device arrays."""
    launch_over(_gather, ids.size * out.shape[1], BLOCK, table, ids, out)


def scatter_add_rows(grad, ids, values) -> None:
    """kernels.embedding.scatter_add_rows on device arrays."""
    if ids.size:
        launch_over(_scatter_add, grad.shape[1], BLOCK, grad, ids, values)
