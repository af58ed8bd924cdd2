"""An embedding table's two hot loops: gather the rows of a batch's ids, and add a batch's gradients into the rows.

    gather_rows(table, ids, out)            # out[i] = table[ids[i]]
    scatter_add_rows(grad, ids, values)     # grad[ids[i]] += values[i], repeated ids adding up

`ids` are int64 row numbers of `table`/`grad` (the caller made them from the stored float ids);
`out` and `values` may be strided views (one categorical column of a (batch, columns, dim)
array). The numba path works on host arrays; a device array (cupy) the numba-CUDA kernels of
kernels/embedding_cuda.py; any other array module the reference (`take` and `cupyx.scatter_add`).
Neither allocates.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from mpitrain.kernels.activations import keyed_word
from mpitrain.kernels.dispatch import numpy_or_reference


@numpy_or_reference("gather_rows_reference", gpu=".embedding_cuda")
def gather_rows(table, ids, out) -> None:
    """out[i, :] = table[ids[i], :] for every i."""
    _gather(table, ids, out)


@numpy_or_reference("scatter_add_rows_reference", gpu=".embedding_cuda")
def scatter_add_rows(grad, ids, values) -> None:
    """grad[ids[i], :] += values[i, :] for every i, in order (so the sums are the same on every run)."""
    _scatter_add(grad, ids, values)


@njit(cache=True, nogil=True)
def _gather(table, ids, out):
    for i in range(ids.size):
        out[i, :] = table[ids[i], :]


@njit(cache=True, nogil=True)
def _scatter_add(grad, ids, values):
    for i in range(ids.size):
        grad[ids[i], :] += values[i, :]


@njit(parallel=True, cache=True)
def keyed_normals(seed, first, step, out) -> None:
    """out[i, j] = a standard normal of (seed, element e = (first + i step) x columns + j): Box-Muller's of the
    uniforms in (0, 1] of `keyed_word`(seed, 2e) and (seed, 2e + 1), their top 53 bits. No generator state, so the
    rows of any table row numbers are the same values wherever they are computed (`mpitrain.nn.embedding`'s fresh
    tables, a rank's every R-th row). Host arrays (float64); the rows in parallel."""
    dim = out.shape[1]
    for i in prange(out.shape[0]):
        row = np.uint64(first + i * step) * np.uint64(dim)
        for j in range(dim):
            e = (row + np.uint64(j)) * np.uint64(2)
            u1 = np.float64((keyed_word(seed, e) >> np.uint64(11)) + np.uint64(1)) * 2.0**-53
            u2 = np.float64((keyed_word(seed, e + np.uint64(1)) >> np.uint64(11)) + np.uint64(1)) * 2.0**-53
            out[i, j] = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def gather_rows_reference(table, ids, out) -> None:
    out[...] = table[ids]


def scatter_add_rows_reference(grad, ids, values) -> None:
    import cupyx
    cupyx.scatter_add(grad, ids, values)
