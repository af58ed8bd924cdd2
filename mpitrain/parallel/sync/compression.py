"""`sync.compression`: dense values on the wire in 16 bits, summed in float32 (PyTorch DDP's bf16 and fp16 hooks).

    codec = COMPRESSIONS["bf16"]()
    wire = codec.encode(values)                 # float32 (n,) -> uint16 (codec.header + n,)
    codec.decode(wire, out)                     # -> float32 values in `out`
    compressed_mean_(comm, buf, codec)          # buf = the ranks' mean, every rank's the same (a collective)

`bf16` keeps float32's exponent and 8 bits of its mantissa (rounded to nearest, ties to even): nothing overflows,
each value is off by at most 2**-8 of itself. `fp16` keeps 11 bits but float16's range (up to 65504, normal down to
6e-5): each message is scaled by a power of two that takes its largest value to 2**15 before it is cast, and the
scale travels in the message's first two words (`header`), so nothing overflows and small gradients keep their
bits; a message of zeros is scaled by 1. Powers of two scale exactly.

`compressed_mean_` (a `PostedMean` waited for at once; `allreduce` posts one per bucket of gradients as backward
finishes it) cuts the buffer into one contiguous chunk per rank. One Alltoallv sends each chunk, encoded, to
the rank that owns it; the owner decodes the ranks' parts and sums them in float32 in rank order, divides by the
ranks, encodes the mean and one Allgatherv gives every rank every owner's mean, which each rank decodes, its own
chunk included: the replicas stay identical. A rank sends 2 (R - 1)/R x n x 2 bytes, half of what a float32 ring
Allreduce sends, plus the headers and the chunk sizes. The sum is exact in rank order, so the result depends on
the rank count only through the ranks' gradients and the rounding of each 16-bit message.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module

WIRE = np.uint16


class Bf16:
    """float32 -> bfloat16 (the top 16 bits, rounded to nearest even) and back; no header."""

    name, header = "bf16", 0

    def encode(self, values):
        xp = array_module(values)
        bits = xp.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))  # to nearest, ties to even
        return (rounded >> np.uint32(16)).astype(WIRE)

    def decode(self, wire, out) -> None:
        out[...] = (wire.astype(np.uint32) << np.uint32(16)).view(np.float32)


class Fp16:
    """float32 -> float16 of the values times a power of two that takes the largest to 2**15 (the scale, a float32,
    in the first two words), and back."""

    name, header, top = "fp16", 2, 2.0 ** 15

    def encode(self, values):
        xp = array_module(values)
        largest = float(xp.abs(values).max()) if values.size else 0.0
        scale = np.float32(2.0 ** math.floor(math.log2(self.top / largest)) if 0 < largest < math.inf else 1.0)
        wire = xp.empty(self.header + values.size, WIRE)
        wire[:self.header] = xp.asarray(np.array([scale], np.float32).view(WIRE))
        wire[self.header:] = (values * scale).astype(np.float16).view(WIRE)
        return wire

    def decode(self, wire, out) -> None:
        out[...] = wire[self.header:].view(np.float16).astype(np.float32) / wire[:self.header].view(np.float32)


COMPRESSIONS = {"bf16": Bf16, "fp16": Fp16}  # `sync.compression` (beside "none": float32 as it is)


def chunk_bounds(size: int, ranks: int) -> np.ndarray:
    """Where each rank's chunk of a buffer of `size` values begins, and the end: (ranks + 1,) ints."""
    return np.array([size * r // ranks for r in range(ranks + 1)], np.int64)


class PostedMean:
    """A buffer's compressed mean under way: its chunks posted to their owners (one Ialltoallv, `posted`, for the
    communicator's `complete`); then `finish` sums this rank's chunk, and one Allgatherv gives every rank every
    owner's mean, decoded into the buffer (see the module docstring). Both are collectives: every rank posts the
    same sizes in the same order and finishes them in that order."""

    def __init__(self, comm, buf, codec):
        xp = array_module(buf)
        self.comm, self.buf, self.codec = comm, buf, codec
        self.bounds = chunk_bounds(buf.size, comm.size)
        self.sizes = np.diff(self.bounds) + codec.header
        self.parts = xp.concatenate([codec.encode(buf[a:b]) for a, b in zip(self.bounds, self.bounds[1:])])
        self.received = xp.empty(comm.size * int(self.sizes[comm.rank]), WIRE)
        self.posted = comm.ialltoallv_(self.parts, self.sizes, self.received)  # both kept until it completes

    def finish(self) -> None:
        """After `complete`: this rank's chunk summed in float32 in rank order, over the ranks, and every owner's
        mean decoded into the buffer."""
        xp, comm, codec = array_module(self.buf), self.comm, self.codec
        size = int(self.sizes[comm.rank])
        total, part = xp.zeros(size - codec.header, np.float32), xp.empty(size - codec.header, np.float32)
        for r in range(comm.size):  # rank order: every owner sums alike
            codec.decode(self.received[r * size:(r + 1) * size], part)
            total += part
        total /= comm.size
        gathered = comm.allgatherv(codec.encode(total), counts=self.sizes)
        for r, message in enumerate(gathered):
            codec.decode(message, self.buf[int(self.bounds[r]):int(self.bounds[r + 1])])


def compressed_mean_(comm, buf, codec) -> None:
    """Replace the contiguous float32 `buf` by the ranks' mean of it, 16 bits on the wire (see the module docstring);
    every rank ends with the same values. A collective: every rank passes a buffer of the same size."""
    mean = PostedMean(comm, buf, codec)
    comm.complete([mean.posted])
    mean.finish()
