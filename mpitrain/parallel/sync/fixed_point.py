"""The ranks' mean of many micro-batches' values, the same bits whatever the number of ranks (`sync.deterministic`).

    exact = ExactMean(comm, [(name, shape), ...])   # the flat buffer's parts, one scale each (a layer's W, b, ...)
    exact.add(grads, stats)                         # each micro-batch of this rank, in order (its values copied)
    exact.mean_(grads, stats)                       # a collective: the mean over every rank's micro-batches

Floating-point addition is not associative: the same gradients summed as 1 x 96 rows, 2 x 48 or 3 x 32 (and by
MPI's ring or tree) give sums that differ in their last bits, and a model trained on 1 and on 3 ranks drifts
apart. Here the sum is exact instead. Each part of the layout (a layer's W, its b, ...) gets a power-of-two scale 2^e from the largest
magnitude M of that part over every micro-batch of every rank (one small Allreduce, MAX), so that
M x 2^e x (micro-batches) < 2^62; each value becomes the int64 `rint(value x 2^e)` (exact in float64: a power of
two, and a float32 has 24 bits), the int64s are summed on the rank and then over the ranks (MPI's integer sum:
exact, so in any order), and the sum goes back to float once, `float64(sum) / 2^e / count` rounded to float32.
Every step of it is exact or a rounding of a value that does not depend on how the micro-batches were split
between ranks: a sum of K micro-batches is the same bits on 1, 2, 3 or 4 ranks, and on every rank.

What it costs: the rank keeps every micro-batch's values until the step's end (K x the buffer), and the
Allreduce carries int64, twice float32's bytes. What it rounds: a value is kept to 2^-e, which is M's own float32
precision divided by at least 2^(38 - log2 count); values far below M lose their low bits, which float32's sum
lost anyway. A part holding a NaN or an infinity becomes NaN everywhere (the loss diverged; the run says so).
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.kernels.fixed_point import column_maxima, fixed_point_sum

#: the int64 bits a sum may use: every partial sum stays below 2^62, away from int64's 2^63
SUM_BITS = 62


class ExactMean:
    """A step's micro-batches of the flat buffers of `layout` (`[(name, shape)]` of their concatenation: the
    gradients' layout, then the statistics'), kept until `mean_`. Every rank must `add` the same number of
    micro-batches in a step; `add` is not a collective, `mean_` is."""

    def __init__(self, comm, layout: list, xp):
        self.comm, self.xp = comm, xp
        sizes = [math.prod(shape) for _, shape in layout]
        self.bounds = np.cumsum([0, *sizes])
        self.sizes = np.array(sizes, np.int64)
        self.kept = xp.empty((0, int(self.bounds[-1])), np.float32)
        self.count = 0
        self.magnitudes = xp.empty(int(self.bounds[-1]), np.float32)  # each column's largest over the micro-batches
        self.total = xp.empty(int(self.bounds[-1]), np.int64)

    def add(self, *flats) -> None:
        """Keep one micro-batch's values: the flat float32 arrays `flats`, which together follow the layout."""
        if self.count == len(self.kept):  # grows once, to the step's micro-batches
            grown = self.xp.empty((self.count + 1, self.kept.shape[1]), np.float32)
            grown[:self.count] = self.kept
            self.kept = grown
        row = self.kept[self.count]
        for span, flat in _spans(flats):
            row[span] = flat
        self.count += 1

    def mean_(self, *outs) -> None:
        """Write into the flat float32 arrays `outs` (the layout's order, as `add`'s) the mean of every micro-batch
        every rank added since the last `mean_`, the same bits on every rank and at any number of ranks (the module
        docstring). A collective: one Allreduce (MAX) of a value per part, one Allreduce of int64 sums."""
        xp, kept = self.xp, self.kept[:self.count]
        count = self.count * self.comm.size
        largest = np.empty(len(self.sizes), np.float64)
        self.comm.iallreduce_max(self._largest(kept), largest).Wait()
        finite = np.isfinite(largest)
        exponents = np.zeros(len(largest), np.int64)
        mantissa_bits = np.frexp(largest[finite])[1]  # largest < 2^bits
        exponents[finite] = SUM_BITS - math.ceil(math.log2(count)) - mantissa_bits
        scales = xp.asarray(np.repeat(np.ldexp(1.0, exponents), self.sizes))
        total = self.total
        fixed_point_sum(kept, scales, total)  # exact: the micro-batches' order is free
        self.comm.allreduce_(total)
        mean = (total.astype(np.float64) / scales / count).astype(np.float32)
        for part in np.flatnonzero(~finite):
            mean[int(self.bounds[part]):int(self.bounds[part + 1])] = np.nan
        for span, out in _spans(outs):
            out[...] = mean[span]
        self.count = 0

    def _largest(self, kept) -> np.ndarray:
        """Each part's largest magnitude over the kept micro-batches, on the host (float64; inf where it holds a NaN
        or an infinity: MPI's MAX may drop a NaN, never an inf)."""
        xp, magnitudes = self.xp, self.magnitudes
        column_maxima(kept, magnitudes)
        parts = xp.stack([magnitudes[a:b].max() if b > a else xp.zeros((), np.float32)
                          for a, b in zip(self.bounds[:-1], self.bounds[1:])])
        return (parts.get() if hasattr(parts, "get") else parts).astype(np.float64)  # one read from a device


def _spans(flats):
    """(slice, array) for each of the flat arrays `flats`, the slice where it lies in their concatenation."""
    offset = 0
    for flat in flats:
        yield slice(offset, offset + flat.size), flat
        offset += flat.size
