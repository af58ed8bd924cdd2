"""Numba CPU kernels for numpy arrays, and the per-element steps the CUDA kernels share.

Encode runs two parallel passes over fixed-size chunks: count the sent elements of each
chunk (and look for NaN), prefix-sum the counts into body offsets, then let each chunk write
its indices from its own offset. No two threads share an output slot and the message is in
ascending index order whatever the thread count; the cost is two reads of the residual, near
memory bandwidth.
The shared steps are `register_jitable`, so numba compiles them for either target; they live
in this file because numba's cache only notices edits to the file of the cached function.
Vectorizable loops run over slices indexed from 0: numba then drops its negative-index check,
which otherwise stops the vectorizer.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from .message import BITS_PER_WORD
from .reference import empty, set_header, to_host  # noqa: F401  host arrays: same as the reference

CHUNK = 1 << 16  # elements per encode chunk: a multiple of 16, large enough to amortize scheduling
GROUP = 32  # elements tested at once before the write pass looks at each


@register_jitable
def send(residual, i, tau):
    """Subtract sign*tau from r_i when |r_i| >= tau; return the signed 1-based index sent, or 0."""
    value = residual[i]
    if value >= tau:
        residual[i] = value - tau
        return i + 1
    if value <= -tau:
        residual[i] = value + tau
        return -(i + 1)
    return 0


@register_jitable
def count_sent(values, tau):
    """(elements of `values` sent, whether any is NaN)."""
    sent = 0
    nan = False
    for i in range(values.size):
        sent += abs(values[i]) >= tau
        nan |= values[i] != values[i]
    return sent, nan


@register_jitable
def any_sent(values, tau):
    sent = False
    for i in range(values.size):
        sent |= abs(values[i]) >= tau
    return sent


@register_jitable
def write_range(residual, tau, lo, hi, body, slot):
    """Send residual[lo:hi], writing the indices in ascending order from body[slot].

    Most groups of GROUP elements send nothing: a branch-free test of the whole group, which
    the compiler vectorizes, comes before the per-element branches.
    """
    for start in range(lo, hi, GROUP):
        end = min(start + GROUP, hi)
        if any_sent(residual[start:end], tau):
            for i in range(start, end):
                index = send(residual, i, tau)
                if index != 0:
                    body[slot] = index
                    slot += 1


@register_jitable
def encode_word(residual, w, tau):
    """Send the 16 elements of bitmap word w; bit b: element 16w+b sent, bit b+16: sent negative."""
    word = 0
    first = w * BITS_PER_WORD
    for b in range(min(BITS_PER_WORD, residual.size - first)):
        index = send(residual, first + b, tau)
        if index != 0:
            word |= 1 << b
        if index < 0:
            word |= 1 << (b + BITS_PER_WORD)
    return word


@register_jitable
def decode_word(word, out, w, delta):
    """Add +-delta to the elements bitmap word w sends."""
    first = w * BITS_PER_WORD
    for b in range(min(BITS_PER_WORD, out.size - first)):
        if (word >> b) & 1:
            if (word >> (b + BITS_PER_WORD)) & 1:
                out[first + b] -= delta
            else:
                out[first + b] += delta


@register_jitable
def add_index(index, out, delta):
    """Add +-delta at a signed 1-based index; return 1 (adding nothing) if it is outside 1..n, else 0."""
    i = abs(np.int64(index)) - 1  # int64: -2**31 has no int32 absolute value
    if i < 0 or i >= out.size:
        return 1
    if index > 0:
        out[i] += delta
    else:
        out[i] -= delta
    return 0


@register_jitable
def clipped(value, limit):
    """`value` clipped to [-limit, limit], NaN kept. Callers store the result unconditionally: a
    select, not a branch around a store, so the loop vectorizes."""
    if value > limit:
        return limit
    if value < -limit:
        return -limit
    return value


@njit(parallel=True, cache=True)
def _chunk_offsets(residual, tau, chunk):
    """Body offset of each chunk's first sent element (the last entry is the total), and the
    number of chunks holding a NaN."""
    chunks = -(-residual.size // chunk)
    offsets = np.zeros(chunks + 1, dtype=np.int64)
    nan_chunks = 0
    for c in prange(chunks):
        sent, nan = count_sent(residual[c * chunk:(c + 1) * chunk], tau)
        offsets[c + 1] = sent
        nan_chunks += nan
    return np.cumsum(offsets), nan_chunks


@njit(parallel=True, cache=True)
def _write_chunks(residual, tau, chunk, offsets, body):
    for c in prange(offsets.size - 1):
        write_range(residual, tau, c * chunk, min((c + 1) * chunk, residual.size), body, offsets[c])


def count(residual, tau):
    offsets, nan_chunks = _chunk_offsets(residual, tau, CHUNK)
    return int(offsets[-1]), nan_chunks > 0, offsets


def write_sparse(residual, tau, plan, body) -> None:
    _write_chunks(residual, tau, CHUNK, plan, body)


@njit(parallel=True, cache=True)
def write_bitmap(residual, tau, words):
    for w in prange(words.size):
        words[w] = encode_word(residual, w, tau)


@njit(parallel=True, cache=True)
def decode_sparse(body, out, delta):
    bad = 0
    for j in prange(body.size):
        bad += add_index(body[j], out, delta)
    return bad


@njit(parallel=True, cache=True)
def decode_bitmap(words, out, delta):
    for w in prange(words.size):
        decode_word(words[w], out, w, delta)


@njit(parallel=True, cache=True)
def clip(residual, limit):
    for i in prange(residual.size):
        residual[i] = clipped(residual[i], limit)


@njit(parallel=True, cache=True)
def add_clipped(residual, update, limit):
    for i in prange(residual.size):
        residual[i] = clipped(residual[i] + update[i], limit)
