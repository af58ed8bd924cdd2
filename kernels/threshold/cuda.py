"""Numba-CUDA kernels for device arrays (cupy through `__cuda_array_interface__`, or numba's own).

Encode is count / scan / write: each block counts the sent elements of its tile (per_thread
consecutive elements per thread), one block turns the tile counts into body offsets by an
exclusive scan, then each thread writes its elements from its tile's offset plus a block-wide
scan of the per-thread counts. Messages are therefore in ascending index order, identical to
the CPU ones, whose per-element steps these kernels share. Kernels run on the default
stream; messages of cupy inputs are cupy arrays. They also run under the simulator
(NUMBA_ENABLE_CUDASIM=1), slowly: keep n to thousands there.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, int32, int64

from .cpu import add_index, clipped, count_sent, decode_word, encode_word, write_range


def _device(array):
    """A numba device view of a CUDA array; numpy arrays (host-staged messages) are copied over."""
    if getattr(array, "__cuda_ndarray__", False):
        return array
    if isinstance(array, np.ndarray):
        return cuda.to_device(array)
    return cuda.as_cuda_array(array)


def _launch(kernel, threads: int, block: int, *args) -> None:
    """Run `kernel` on enough blocks to cover `threads` (none for an empty range)."""
    blocks = -(-threads // block)
    if blocks:
        kernel[blocks, block](*args)


@functools.lru_cache(maxsize=None)
def _scan_kernels(block: int):
    """The kernels that scan across a block; compiled per block size, the size of their shared array."""

    @cuda.jit(device=True)
    def block_scan(value, scratch):
        """(exclusive prefix sum of `value` over the block's threads, block total), Hillis-Steele."""
        t = cuda.threadIdx.x
        scratch[t] = value
        cuda.syncthreads()
        step = 1
        while step < block:
            left = scratch[t - step] if t >= step else 0
            cuda.syncthreads()
            scratch[t] += left
            cuda.syncthreads()
            step *= 2
        inclusive = scratch[t]
        total = scratch[block - 1]
        cuda.syncthreads()
        return inclusive - value, total

    @cuda.jit(device=True)
    def thread_range(residual, per_thread):
        """The thread's `per_thread` consecutive elements of its block's tile."""
        lo = (int64(cuda.blockIdx.x) * block + cuda.threadIdx.x) * per_thread
        return min(lo, residual.size), min(lo + per_thread, residual.size)

    @cuda.jit
    def count_tiles(residual, tau, per_thread, counts, totals):
        """counts[block] = elements sent in the block's tile; totals[1] = 1 if it holds a NaN."""
        scratch = cuda.shared.array(block, int32)
        lo, hi = thread_range(residual, per_thread)
        sent, nan = count_sent(residual[lo:hi], tau)
        if nan:
            totals[1] = 1
        sent = block_scan(sent, scratch)[1]
        if cuda.threadIdx.x == 0:
            counts[cuda.blockIdx.x] = sent

    @cuda.jit
    def scan_counts(counts, totals):
        """One block: counts becomes each tile's first body slot; totals[0] = all elements sent."""
        scratch = cuda.shared.array(block, int32)
        carry = 0
        for start in range(0, counts.size, block):
            i = start + cuda.threadIdx.x
            value = counts[i] if i < counts.size else 0
            prefix, total = block_scan(value, scratch)
            if i < counts.size:
                counts[i] = carry + prefix
            carry += total
        if cuda.threadIdx.x == 0:
            totals[0] = carry

    @cuda.jit
    def write_tiles(residual, tau, per_thread, offsets, body):
        """Each thread writes its elements' indices from the slot its block's scan gives it."""
        scratch = cuda.shared.array(block, int32)
        lo, hi = thread_range(residual, per_thread)
        prefix = block_scan(count_sent(residual[lo:hi], tau)[0], scratch)[0]
        write_range(residual, tau, lo, hi, body, offsets[cuda.blockIdx.x] + prefix)

    return count_tiles, scan_counts, write_tiles


@cuda.jit
def _write_words(residual, tau, words):
    w = cuda.grid(1)
    if w < words.size:
        words[w] = encode_word(residual, w, tau)


@cuda.jit
def _decode_indices(body, out, delta, bad):
    j = cuda.grid(1)
    if j < body.size and add_index(body[j], out, delta):
        cuda.atomic.add(bad, 0, 1)


@cuda.jit
def _decode_words(words, out, delta):
    w = cuda.grid(1)
    if w < words.size:
        decode_word(words[w], out, w, delta)


@cuda.jit
def _clip(residual, limit):
    i = cuda.grid(1)
    if i < residual.size:
        residual[i] = clipped(residual[i], limit)


@cuda.jit
def _add_clipped(residual, update, limit):
    i = cuda.grid(1)
    if i < residual.size:
        residual[i] = clipped(residual[i] + update[i], limit)


class CudaKernels:
    """The `message` primitives on a CUDA device; `block` threads per block, each encode thread
    handling `per_thread` elements (small blocks let the simulator test several of them)."""

    def __init__(self, block: int = 256, per_thread: int = 8):
        self.block, self.per_thread = block, per_thread
        self.count_tiles, self.scan_counts, self.write_tiles = _scan_kernels(block)

    def count(self, residual, tau):
        residual = _device(residual)
        offsets = cuda.device_array(-(-residual.size // (self.block * self.per_thread)), dtype=np.int32)
        totals = cuda.to_device(np.zeros(2, dtype=np.int32))
        if offsets.size:
            self.count_tiles[offsets.size, self.block](residual, tau, self.per_thread, offsets, totals)
            self.scan_counts[1, self.block](offsets, totals)
        sent, nan = totals.copy_to_host()
        return int(sent), bool(nan), offsets

    def write_sparse(self, residual, tau, plan, body) -> None:
        self.write_tiles[plan.size, self.block](_device(residual), tau, self.per_thread, plan, _device(body))

    def write_bitmap(self, residual, tau, words) -> None:
        _launch(_write_words, words.size, self.block, _device(residual), tau, _device(words))

    def decode_sparse(self, body, out, delta) -> int:
        bad = cuda.to_device(np.zeros(1, dtype=np.int32))
        _launch(_decode_indices, body.size, self.block, _device(body), _device(out), delta, bad)
        return int(bad.copy_to_host()[0])

    def decode_bitmap(self, words, out, delta) -> None:
        _launch(_decode_words, words.size, self.block, _device(words), _device(out), delta)

    def clip(self, residual, limit) -> None:
        _launch(_clip, residual.size, self.block, _device(residual), limit)

    def add_clipped(self, residual, update, limit) -> None:
        _launch(_add_clipped, residual.size, self.block, _device(residual), _device(update), limit)

    @staticmethod
    def empty(like, size: int):
        if getattr(like, "__cuda_ndarray__", False):
            return cuda.device_array(size, dtype=np.int32)
        import cupy
        return cupy.empty(size, dtype=np.int32)

    @staticmethod
    def to_host(array) -> np.ndarray:
        return array if isinstance(array, np.ndarray) else _device(array).copy_to_host()

    @staticmethod
    def set_header(message, header) -> None:
        _device(message)[:header.size].copy_to_device(header)


DEFAULT = CudaKernels()
