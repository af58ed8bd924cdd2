"""Threshold messages as integer counts, and the count blocks of `sharing`'s recursive exchange.

    dtype = count_dtype(ranks)                     # int8 up to 127 ranks, int16 up to 32767, else int32
    counts = xp.zeros(n, dtype)
    sent = add_message(message, counts)            # counts += the message's +-1 per element sent
    block = encode_counts(counts[lo:hi], sent, tau)  # sparse or dense, whichever is shorter
    sent = add_counts(block, counts[lo:hi], tau)   # counts[lo:hi] += the block's counts
    add_scaled(counts, params, tau / ranks)        # params += counts x tau / ranks where counts != 0

Every rank sends the same tau, so a sum of messages is tau times an integer per element: its
count, between -ranks and +ranks. Integers add exactly in any order, so ranks that sum the
same messages in different orders (recursive doubling's pairs) hold the same counts bit for
bit, and every rank adds the same values to its parameters. A count block is an int32 array:

    [kind, entries, n, tau as float32 bits, sent (int64, two int32)] + body
        kind 0 (sparse): entries 0-based int32 indices, ascending, then entries counts
        kind 1 (dense):  n counts (entries = n)

Counts are the block's count dtype, packed into whole int32 words (the last one zero-padded).
`sent` is how many elements the messages summed in the block sent, cancelled ones included.
All of it runs on numpy or cupy arrays alike (`xp`).
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.arrays import array_module

from . import implementation
from .message import BITS_PER_WORD, HEADER_SIZE, SPARSE, read_header

DENSE = 1
COUNT_HEADER_SIZE = 6  # int32 values, the int64 `sent` 8-byte aligned at the end
INDEX_BYTES = np.dtype(np.int32).itemsize


def count_dtype(ranks: int) -> np.dtype:
    """The narrowest signed integer that holds a sum of `ranks` messages' +-1 (and -ranks..ranks)."""
    for dtype in (np.int8, np.int16, np.int32):
        if ranks <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"no count dtype for {ranks} ranks")


def counts_capacity(n: int, dtype) -> int:
    """The longest count block (int32 values) for n elements: a dense one, as a sparse one is only chosen shorter."""
    return COUNT_HEADER_SIZE + _words(n * np.dtype(dtype).itemsize)


def add_message(message, out) -> int:
    """out += +-1 at every element the threshold message sends (`out`: integer counts of the message's n elements);
    returns how many it sends."""
    xp = array_module(out)
    count, n, _, kind = read_header(implementation(message), message)
    if n != out.size:
        raise ValueError(f"threshold message is for {n} elements, but the counts have {out.size}")
    body = message[HEADER_SIZE:]
    if kind == SPARSE:
        if count:
            index = xp.abs(body) - 1  # ascending: the ends bound them all
            if int(index[0]) < 0 or int(index[-1]) >= n:
                raise ValueError(f"threshold message holds indices outside 1..{n}: corrupt message")
            out[index] += xp.sign(body).astype(out.dtype)
        return count
    shifts = xp.arange(BITS_PER_WORD, dtype=np.uint32)
    words = body.view(np.uint32)[:, None]
    sent = ((words >> shifts) & 1).astype(out.dtype)
    negative = ((words >> (shifts + BITS_PER_WORD)) & 1).astype(out.dtype)
    out += (sent - 2 * negative).reshape(-1)[:n]
    return count


def encode_counts(counts, sent: int, tau) -> object:
    """`counts` (a 1-D integer array) as a count block: its nonzero counts with their indices (sparse), or all of
    them (dense) when that is no longer. `sent` and `tau` go into the header."""
    xp = array_module(counts)
    index = xp.flatnonzero(counts)
    width = counts.itemsize
    sparse = int(index.size) + _words(int(index.size) * width) < _words(counts.size * width)
    entries = int(index.size) if sparse else counts.size
    block = xp.zeros(COUNT_HEADER_SIZE + (entries if sparse else 0) + _words(entries * width), dtype=np.int32)
    header = np.zeros(COUNT_HEADER_SIZE, np.int32)
    header[:4] = [SPARSE if sparse else DENSE, entries, counts.size, np.float32(tau).view(np.int32)]
    header[4:].view(np.int64)[0] = sent
    block[:COUNT_HEADER_SIZE] = xp.asarray(header)
    body = block[COUNT_HEADER_SIZE:]
    if sparse:
        body[:entries] = index
        body[entries:].view(counts.dtype)[:entries] = counts[index]
    else:
        body.view(counts.dtype)[:entries] = counts
    return block


def add_counts(block, out, tau) -> int:
    """out += the count block's counts (made by `encode_counts` for out's length and dtype, with the same `tau`);
    returns the block's `sent`."""
    header = _host(block[:COUNT_HEADER_SIZE])
    if header.size != COUNT_HEADER_SIZE:
        raise ValueError(f"a count block has at least {COUNT_HEADER_SIZE} int32 header values, got {header.size}")
    kind, entries, n, tau_bits = (int(v) for v in header[:4])
    sent = int(header[4:].view(np.int64)[0])
    width = out.itemsize
    if (kind not in (SPARSE, DENSE) or n != out.size or not 0 <= entries <= n or (kind == DENSE and entries != n)
            or sent < 0 or block.size != COUNT_HEADER_SIZE + (entries if kind == SPARSE else 0)
            + _words(entries * width)):
        raise ValueError(f"corrupt count block of {block.size} int32 (header {header.tolist()}) "
                         f"for {out.size} {out.dtype} counts")
    if tau_bits != np.float32(tau).view(np.int32):
        raise ValueError(f"a count block summed with tau {np.int32(tau_bits).view(np.float32)}, this rank's with "
                         f"{np.float32(tau)}: every rank's message must have the same tau")
    body = block[COUNT_HEADER_SIZE:]
    if kind == DENSE:
        out += body.view(out.dtype)[:n]
    else:
        out[body[:entries]] += body[entries:].view(out.dtype)[:entries]
    return sent


def add_scaled(counts, out, step: float) -> None:
    """out += counts x step where counts are nonzero, `step` rounded once to out's dtype (as a decode rounds its
    +-tau step), so a count of +-1 adds exactly what a decode of one message would."""
    xp = array_module(counts)
    index = xp.flatnonzero(counts)
    out[index] += counts[index].astype(out.dtype) * out.dtype.type(step)


def _words(nbytes: int) -> int:
    return -(-nbytes // INDEX_BYTES)


def _host(array) -> np.ndarray:
    return implementation(array).to_host(array)
