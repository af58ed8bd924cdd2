"""A batch's rows from stored features to model input in one pass: gather by index, scale and shift.

    gather_scaled(stored_x, stored_y, index, scale, shift, out_x, out_y)  # rows `index` of the split
    scaled(stored_x, scale, shift, out_x)                                 # rows as they are (evaluation)

out_x = stored * scale + shift in out_x's dtype (uint8 or float32 features to float32 or
float64 input), computed as the numpy steps `astype`, `*=`, `+=` compute it, so the values
are the same; labels are copied beside. Host arrays only (the batch pipeline prepares
batches on the host); the kernels write into the pipeline's fixed buffers and allocate nothing,
and release the GIL (the pipeline's worker thread gathers while the step's Python runs).
"""
from __future__ import annotations

import math

from numba import njit, prange


@njit(parallel=True, cache=True, nogil=True)
def _gather_scaled(stored_x, stored_y, index, scale, shift, out_x, out_y):
    for r in prange(index.size):
        row = index[r]
        out_y[r] = stored_y[row]
        for k in range(out_x.shape[1]):
            out_x[r, k] = out_x.dtype.type(stored_x[row, k]) * scale + shift


@njit(parallel=True, cache=True, nogil=True)
def _scaled(stored_x, scale, shift, out_x):
    for r in prange(out_x.shape[0]):
        for k in range(out_x.shape[1]):
            out_x[r, k] = out_x.dtype.type(stored_x[r, k]) * scale + shift


def gather_scaled(stored_x, stored_y, index, scale: float, shift: float, out_x, out_y) -> None:
    """out_x[r] = stored_x[index[r]] * scale + shift and out_y[r] = stored_y[index[r]] (rows of any shape)."""
    dtype = out_x.dtype.type
    _gather_scaled(flat_rows(stored_x), stored_y, index, dtype(scale), dtype(shift), flat_rows(out_x), out_y)


def scaled(stored_x, scale: float, shift: float, out_x) -> None:
    """out_x = stored_x * scale + shift, row for row."""
    dtype = out_x.dtype.type
    _scaled(flat_rows(stored_x), dtype(scale), dtype(shift), flat_rows(out_x))


def flat_rows(array):
    """`array` as (rows, values per row), a view of a contiguous array; also when it has no rows
    (`reshape(len(x), -1)` fails on size 0: an ETL batch whose every record was bad)."""
    return array.reshape(len(array), math.prod(array.shape[1:]))
