"""A batch's rows from stored features to model input in one pass: gather by index, scale and shift; and a batch
of sequences padded from their ragged storage.

    gather_scaled(stored_x, stored_y, index, scale, shift, out_x, out_y)  # rows `index` of the split
    scaled(stored_x, scale, shift, out_x)                                 # rows as they are (evaluation)
    longest(lengths, index)                                               # the longest of rows `index`
    padded_rows(values, starts, lengths, index, fill, out, out_lengths)   # rows `index` as (B, T, F), `fill` after
    copy_ragged(values, starts, lengths, offsets, out)                    # those sequences one after another
    all_finite(values)                                                    # no NaN or Inf (stored sequences)

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


@njit(cache=True, nogil=True)
def longest(lengths, index) -> int:
    """The largest of `lengths[index]` (0 for no rows), without the fancy index's array."""
    most = 0
    for r in range(index.size):
        most = max(most, lengths[index[r]])
    return most


@njit(parallel=True, cache=True, nogil=True)
def _padded_rows(values, starts, lengths, index, fill, out, out_lengths):
    for r in prange(index.size):
        row = index[r]
        start, n = starts[row], lengths[row]
        out_lengths[r] = n
        for t in range(out.shape[1]):
            for k in range(out.shape[2]):
                out[r, t, k] = out.dtype.type(values[start + t, k]) if t < n else fill


def padded_rows(values, starts, lengths, index, fill, out, out_lengths) -> None:
    """out[r, t] = values[starts[index[r]] + t] (in out's dtype) for t < lengths[index[r]], `fill` after, and
    out_lengths[r] = lengths[index[r]]: rows `index` of ragged sequences (`values` (steps, F)) as a padded batch
    `out` (B, T, F). The sequence pipeline's padding (`mpitrain.data.sequences.RaggedBuffer`); host arrays."""
    _padded_rows(values, starts, lengths, index, out.dtype.type(fill), out, out_lengths)


@njit(cache=True, nogil=True)
def copy_ragged(values, starts, lengths, offsets, out) -> None:
    """out[offsets[i]:offsets[i] + lengths[i]] = values[starts[i]:starts[i] + lengths[i]] for every i: sequences
    copied one after another into a ragged buffer's space, with no index array of their steps."""
    for i in range(lengths.size):
        source, place = starts[i], offsets[i]
        for t in range(lengths[i]):
            for k in range(values.shape[1]):
                out[place + t, k] = values[source + t, k]


@njit(cache=True, nogil=True)
def all_finite(values) -> bool:
    """Whether every value of the 2-D `values` is finite, without a boolean array of them."""
    for i in range(values.shape[0]):
        for k in range(values.shape[1]):
            if not math.isfinite(values[i, k]):
                return False
    return True
