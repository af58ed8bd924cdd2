"""Threshold messages cut into index blocks, and the reduced blocks of `sharing`'s split exchange.

    bounds = block_bounds(n, ranks)            # rank j owns elements bounds[j]:bounds[j+1]
    parts, sizes = cut_message(message, bounds)  # part j: a threshold message of its own for block j
    sent = reduce_parts(received, block, 1 / ranks)  # block += each part's +-tau / ranks, in rank order
    reduced = encode_block(block, sent)        # sparse or dense, whichever is smaller
    sent = add_block(reduced, params[lo:hi])   # params[lo:hi] += the reduced block

Blocks are near-equal and contiguous, with bounds a multiple of 16 elements, so a bitmap
message splits on word boundaries; with fewer 16-element words than ranks, some are empty.
A part is a threshold message (`message`) whose header says the block's length and the
elements of the block it sends; sparse indices are re-based to the block, a bitmap part is
the block's words. A reduced block is an int32 array:

    [kind, entries, n, sent] + entries values (the block's dtype, seen through the int32s)
                             + kind 0 (sparse): entries 0-based int32 indices, ascending
                             + padding to a whole value (float64 only)

kind 1 (dense) has n values and no indices. `sent` is how many elements all ranks' parts
sent into the block. Values come right after the 16-byte header and every reduced block
is a whole number of values long, so values stay aligned in a buffer of several blocks.
All of it runs on numpy or cupy arrays alike (`xp`); decoding the parts is the kernels' own
`threshold_decode`.
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.arrays import array_module

from . import implementation, threshold_decode
from .message import BITS_PER_WORD, HEADER_SIZE, SPARSE, bitmap_words, read_header

DENSE = 1  # a reduced block's kind; SPARSE (0) is shared with threshold messages
INDEX_BYTES = np.dtype(np.int32).itemsize


def block_bounds(n: int, ranks: int) -> np.ndarray:
    """The ranks+1 bounds of `ranks` near-equal contiguous blocks of n elements, each a multiple of 16 but the last."""
    words = bitmap_words(n)
    return np.minimum(np.arange(ranks + 1, dtype=np.int64) * words // ranks * BITS_PER_WORD, n)


def cut_message(message, bounds: np.ndarray):
    """`message`'s parts for the blocks between `bounds` (which end at its n), back to back in one int32 array
    on its device, and their sizes (host int64). Part j is a threshold message for bounds[j]:bounds[j+1]."""
    xp = array_module(message)
    count, n, tau, kind = read_header(implementation(message), message)
    if bounds[-1] != n:
        raise ValueError(f"blocks end at {bounds[-1]}, but the message is for {n} elements")
    body, blocks = message[HEADER_SIZE:], len(bounds) - 1
    if kind == SPARSE:
        position = xp.abs(body.astype(np.int64))  # 1-based, ascending
        counts = np.diff(_host(xp.searchsorted(position, xp.asarray(bounds), side="right")))
        block_of = xp.searchsorted(xp.asarray(bounds[1:]), position - 1, side="right")
        moved = body - xp.sign(body) * xp.asarray(bounds[:-1].astype(np.int32))[block_of]
        body_sizes = counts
    else:
        word_bounds = -(-bounds // BITS_PER_WORD)
        sent = xp.cumsum(_popcount16(body.view(np.uint32)).astype(np.int64))  # elements sent up to each word
        counts = np.diff(_host(xp.concatenate([xp.zeros(1, np.int64), sent])[xp.asarray(word_bounds)]))
        block_of = xp.searchsorted(xp.asarray(word_bounds[1:]), xp.arange(body.size), side="right")
        moved, body_sizes = body, np.diff(word_bounds)
    sizes = HEADER_SIZE + body_sizes
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    parts = xp.empty(int(sizes.sum()), dtype=np.int32)
    parts[xp.arange(body.size) + HEADER_SIZE * (block_of + 1)] = moved
    headers = np.stack([counts, np.diff(bounds), np.full(blocks, np.float32(tau).view(np.int32)),
                        np.full(blocks, kind)], axis=1)
    header_slots = (starts[:, None] + np.arange(HEADER_SIZE)).ravel()
    parts[xp.asarray(header_slots)] = xp.asarray(headers.astype(np.int32).ravel())
    return parts, sizes


def reduce_parts(parts, out, scale: float) -> int:
    """out += scale x each part's +-tau, part after part (rank order: the same sum wherever it runs); returns the
    elements the parts send."""
    sent = 0
    for part in parts:
        threshold_decode(part, out, scale)
        sent += read_header(implementation(part), part)[0]
    return sent


def encode_block(block, sent: int):
    """`block`'s nonzero values as a reduced block (sparse), or all of them (dense) when that is no longer."""
    xp = array_module(block)
    index = xp.flatnonzero(block != 0)  # on booleans, not the floats: faster (docs/benchmarks.md)
    words = block.itemsize // INDEX_BYTES  # int32 slots per value
    sparse = index.size * (words + 1) < block.size * words
    entries = int(index.size) if sparse else block.size
    message = xp.zeros(_block_size(SPARSE if sparse else DENSE, entries, words), dtype=np.int32)
    message[:HEADER_SIZE] = xp.asarray(np.array([SPARSE if sparse else DENSE, entries, block.size, sent], np.int32))
    values = message[HEADER_SIZE:HEADER_SIZE + entries * words].view(block.dtype)
    if sparse:
        values[...] = block[index]
        message[HEADER_SIZE + entries * words:HEADER_SIZE + entries * (words + 1)] = index
    else:
        values[...] = block
    return message


def add_block(message, out) -> int:
    """out += the reduced block `message` (made by `encode_block` from a block of out's length and dtype); returns
    the elements all ranks sent into the block."""
    header = _host(message[:HEADER_SIZE])
    kind, entries, n, sent = (int(v) for v in header) if header.size == HEADER_SIZE else (-1,) * HEADER_SIZE
    words = out.itemsize // INDEX_BYTES
    if (kind not in (SPARSE, DENSE) or n != out.size or not 0 <= entries <= n or (kind == DENSE and entries != n)
            or sent < 0 or message.size != _block_size(kind, entries, words)):
        raise ValueError(f"corrupt reduced block of {message.size} int32 (header {header.tolist()}) "
                         f"for {out.size} {out.dtype} elements")
    values = message[HEADER_SIZE:HEADER_SIZE + entries * words].view(out.dtype)
    if kind == DENSE:
        out += values
    else:
        out[message[HEADER_SIZE + entries * words:HEADER_SIZE + entries * (words + 1)]] += values
    return sent


def _block_size(kind: int, entries: int, words: int) -> int:
    """int32 length of a reduced block: header, values, indices (sparse), padded to a whole value."""
    size = HEADER_SIZE + entries * words + (entries if kind == SPARSE else 0)
    return -(-size // words) * words


def _popcount16(words):
    """The set bits among the low 16 of each uint32 (a bitmap word's sent elements), branch-free for any xp."""
    x = words & 0xFFFF
    x = x - ((x >> 1) & 0x5555)
    x = (x & 0x3333) + ((x >> 2) & 0x3333)
    x = (x + (x >> 4)) & 0x0F0F
    return (x + (x >> 8)) & 0x1F


def _host(array) -> np.ndarray:
    return implementation(array).to_host(array)
