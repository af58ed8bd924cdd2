"""The order of an epoch: which rows form each global batch, and which of them each rank trains on.

    plan = EpochPlan(blocks, global_batch=256, window_rows=65536, seed=7, shuffle=True)
    plan.steps                                # global batches per epoch, the same on every rank count
    view = plan.epoch(3)                      # epoch 3's order (a function of seed, epoch and the blocks)
    view.span(window, rank, ranks)            # the rows of the window this rank reads: a contiguous range
    view.batch_index(step, rank, ranks)       # its batch as indices into that range

The order is a pure function of (seed, epoch, the split's blocks, window_rows,
global_batch): never of the rank count, so the global batch of step k holds the same rows on
1, 2, 3 or 4 ranks; nothing but a few numbers (epoch, step, global_batch, window_rows)
describes where a run stands in it. The algorithm, "block shuffle, then a stratified window
shuffle":

1. Blocks: the split's rows in manifest order, cut at every HDF5 chunk of every shard (the
   unit a read fetches and decodes), `Blocks.from_manifest`.
2. Block shuffle: the blocks in a random order drawn by (seed, epoch); their rows one after
   the other make the epoch's sequence. Rows of one block stay together here; step 3 mixes
   them with the rows of the other blocks of their window.
3. Windows: the sequence cut into windows of `window_rows` rows (a multiple of the global
   batch G; the window is what a rank's memory, `data.buffer_mb`, holds twice: the one in use
   and the next one being read). The last window is shorter; the sequence's last N mod G rows
   are not used this epoch (the remainder policy is drop: every rank runs the same N // G
   steps, and which rows are dropped changes every epoch with the block order).
4. Stratified window shuffle: a window of M rows holds M / G global batches. It is cut into
   G strata of S = M / G consecutive rows, and stratum s gets its own random permutation
   pi_s of 0..S-1, drawn by (seed, epoch, window, s). Global batch j of the window takes row
   pi_s(j) of every stratum s. Each row is in exactly one batch; a batch mirrors the window's
   mix of blocks (one row from each G-th of it), which an unlucky uniform draw would not.
5. Ranks: with R ranks (R divides G), rank r trains on the rows of strata
   [r G/R, (r+1) G/R) of each batch: all of them lie in one contiguous range of the window,
   `span`, that rank r alone reads (a block at the edge of two ranges is read by both). So
   the storage is read about once per epoch over all ranks, with no rows moved between
   ranks: each rank knows its future rows and reads just them (clairvoyant prefetching,
   NoPFS, Dryden et al., SC'21), where a uniform shuffle of the window would have every
   rank read every chunk.

MosaicML Streaming's block shuffles and tf.data's shuffle buffer mix a stream the same way
in bounded memory; unlike tf.data's, this order does not depend on how the stream was read,
so a resumed run continues it exactly. `shuffle=False` keeps the blocks in manifest order and
every pi_s the identity: batch j takes row j of every stratum, a fixed order.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

ORDER_STREAM = 0x5EED  # keeps the order's random draws apart from other uses of the same seed


@dataclass(frozen=True)
class Blocks:
    """A split's rows as blocks, one HDF5 chunk of one shard each, in manifest order."""

    shard: np.ndarray  # int64: the shard's index in the manifest's list for the split
    start: np.ndarray  # int64: the block's first row within its shard
    rows: np.ndarray  # int64: rows in the block

    @classmethod
    def from_shards(cls, shard_rows: list[int], chunk_rows: int, max_rows: int = 0) -> "Blocks":
        """The blocks of shards holding `shard_rows` rows each, chunked by `chunk_rows`; only the first `max_rows`
        rows of the split when max_rows > 0."""
        shard, start, rows, left = [], [], [], max_rows or sum(shard_rows)
        for index, n in enumerate(shard_rows):
            for first in range(0, n, chunk_rows):
                take = min(chunk_rows, n - first, left)
                if take <= 0:
                    break
                shard.append(index)
                start.append(first)
                rows.append(take)
                left -= take
        return cls(*(np.asarray(a, dtype=np.int64) for a in (shard, start, rows)))

    @property
    def total_rows(self) -> int:
        return int(self.rows.sum())

    @cached_property
    def first_rows(self) -> np.ndarray:
        """Each block's first row in the split (manifest order), then the split's rows: len(blocks) + 1 numbers."""
        return np.concatenate([[0], np.cumsum(self.rows)])

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class Piece:
    """Rows [lo, hi) of block `block` (indices within the block)."""

    block: int
    lo: int
    hi: int


class EpochPlan:
    """The orders of every epoch of a split for one global batch size and window; see the module docstring."""

    def __init__(self, blocks: Blocks, global_batch: int, window_rows: int, seed: int, shuffle: bool = True):
        if global_batch < 1 or window_rows < global_batch or window_rows % global_batch:
            raise ValueError(f"window_rows {window_rows} must be a positive multiple of global_batch {global_batch}")
        self.blocks, self.global_batch, self.window_rows = blocks, global_batch, window_rows
        self.seed, self.shuffle = seed, shuffle
        self.used_rows = blocks.total_rows // global_batch * global_batch
        self.steps = self.used_rows // global_batch
        self.dropped_rows = blocks.total_rows - self.used_rows
        self.windows = -(-self.used_rows // window_rows)

    def chunk_reads(self, ranks: int) -> float:
        """At most how often a chunk is read per epoch on `ranks` ranks, on average: once, plus one block for each
        edge of a window or of a rank's range that cuts one (`ranks` edges per window)."""
        if not len(self.blocks):
            return 1.0
        return 1.0 + self.windows * ranks * int(self.blocks.rows.max()) / self.blocks.total_rows

    def window_of(self, step: int) -> tuple[int, int]:
        """(window, batch within the window) of global step `step`."""
        per_window = self.window_rows // self.global_batch
        return step // per_window, step % per_window

    def window_size(self, window: int) -> int:
        """Rows of `window` (a multiple of the global batch)."""
        return min(self.window_rows, self.used_rows - window * self.window_rows)

    def epoch(self, epoch: int) -> "EpochOrder":
        return EpochOrder(self, epoch)


class EpochOrder:
    """One epoch's order: its block sequence, the pieces of any range of it, and every rank's batches."""

    def __init__(self, plan: EpochPlan, epoch: int):
        self.plan, self.epoch = plan, epoch
        blocks = plan.blocks
        self.sequence = (np.random.default_rng([ORDER_STREAM, plan.seed, epoch]).permutation(len(blocks))
                         if plan.shuffle else np.arange(len(blocks)))
        self.ends = np.cumsum(blocks.rows[self.sequence])  # where each block of the sequence ends
        self._strata = lru_cache(maxsize=2)(self._strata_of)  # a rank's permutations of this and the next window

    def pieces(self, lo: int, hi: int) -> list[Piece]:
        """The blocks holding sequence positions [lo, hi), in sequence order, each with its rows."""
        first = int(np.searchsorted(self.ends, lo, side="right"))
        pieces, position = [], lo
        for k in range(first, len(self.sequence)):
            if position >= hi:
                break
            begin = int(self.ends[k] - self.plan.blocks.rows[self.sequence[k]])
            end = min(int(self.ends[k]), hi)
            pieces.append(Piece(int(self.sequence[k]), position - begin, end - begin))
            position = end
        return pieces

    def span(self, window: int, rank: int, ranks: int) -> range:
        """The sequence positions rank `rank` of `ranks` trains on in `window`: a contiguous range."""
        size, strata = self.plan.window_size(window), self.plan.global_batch
        per = strata // ranks
        start = window * self.plan.window_rows
        return range(start + rank * per * (size // strata), start + (rank + 1) * per * (size // strata))

    def batch_index(self, step: int, rank: int, ranks: int) -> np.ndarray:
        """Rank `rank`'s rows of global step `step`, as ascending indices into its `span` of the step's window."""
        window, j = self.plan.window_of(step)
        permutations = self._strata(window, rank, ranks)
        per_stratum = permutations.shape[1]
        return np.arange(len(permutations), dtype=np.int64) * per_stratum + permutations[:, j]

    def row_ids(self, step: int, rank: int, ranks: int) -> np.ndarray:
        """The split's row numbers (manifest order) of rank `rank`'s batch at `step`: what a debug hook records."""
        window, _ = self.plan.window_of(step)
        span = self.span(window, rank, ranks)
        first_row = self.plan.blocks.first_rows
        ids = np.concatenate([first_row[p.block] + np.arange(p.lo, p.hi) for p in self.pieces(span.start, span.stop)])
        return ids[self.batch_index(step, rank, ranks)]

    def _strata_of(self, window: int, rank: int, ranks: int) -> np.ndarray:
        """The permutations pi_s of rank `rank`'s strata in `window`, one row each (int32)."""
        strata = self.plan.global_batch
        per_stratum = self.plan.window_size(window) // strata
        mine = range(rank * strata // ranks, (rank + 1) * strata // ranks)
        if not self.plan.shuffle:
            return np.tile(np.arange(per_stratum, dtype=np.int32), (len(mine), 1))
        return np.stack([np.random.default_rng([ORDER_STREAM, self.plan.seed, self.epoch, window, s])
                         .permutation(per_stratum).astype(np.int32) for s in mine])
