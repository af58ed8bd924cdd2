"""A rank's rows streamed from storage in bounded memory: window by window for training, in order for evaluation.

    rows = TrainRows(shards, plan, rank, ranks)          # training: the epoch order of `mpitrain.data.order`
    x, y, ids, index, seqs = rows.epoch(3).step(k)       # step k's rows: x[index], y[index], ids[index] (seqs: sequence columns)
    for x, y in EvalRows(shards, blocks, span).batches(256): ...   # evaluation: this rank's rows in order

Training holds two windows of this rank's rows at most: the one its steps use, and the next,
read a little at every step (its pieces spread evenly over the steps of the window in use),
so reading overlaps training and memory stays at two windows, whatever the split's size.
The two buffers are allocated once and alternate by window. An epoch's first window (or the
window a resumed run starts in) is read whole before its first step: that wait shows up as
input wait in the step metrics. Evaluation reads one block at a time into one batch buffer.

A table's categorical ids travel beside x as integers (`ids`, (rows, 0) without any). A dataset of sequence columns
(docs/sequences.md) keeps each window's sequences ragged beside its fixed rows, one `RaggedBuffer` per column and
window buffer; evaluation batches come padded (`padded_rows`: a `SequenceBatch`, or `Inputs` for a model of several
inputs; host arrays).
"""
from __future__ import annotations

import numpy as np

from mpitrain.data.chunks import ShardFiles
from mpitrain.data.order import Blocks, EpochOrder, EpochPlan, Piece
from mpitrain.data.sequences import RaggedBuffer, SequenceBatch, Inputs
from mpitrain.base.workspace import Workspace


class TrainRows:
    """This rank's training rows of a split, as `plan` orders them, read through `shards`. Not a collective: every rank
    reads its own rows (a rank's share of each window is a contiguous range no other rank reads, edges aside)."""

    def __init__(self, shards: ShardFiles, plan: EpochPlan, rank: int, ranks: int):
        self.shards, self.plan, self.rank, self.ranks = shards, plan, rank, ranks
        manifest = shards.manifest
        self.row_shape = tuple(manifest.feature_shape)
        capacity = min(plan.window_rows, plan.used_rows) // ranks  # np.empty: pages are taken as rows come in
        self.buffers = [row_buffers(manifest, capacity) for _ in range(2)]
        self.sequence_buffers = [sequence_buffers(manifest, capacity) for _ in range(2)]

    @property
    def rank_batch(self) -> int:
        return self.plan.global_batch // self.ranks

    def epoch(self, epoch: int) -> "EpochRows":
        return EpochRows(self, self.plan.epoch(epoch))


class _Window:
    """This rank's rows of one window being read into one of the two buffers: its pieces and how many are in."""

    def __init__(self, number: int, order: EpochOrder, rows: TrainRows):
        self.number = number
        self.span = order.span(number, rows.rank, rows.ranks)
        self.pieces = order.pieces(self.span.start, self.span.stop)
        self.x, self.y, self.ids = (buffer[:len(self.span)] for buffer in rows.buffers[number % 2])
        self.sequences = rows.sequence_buffers[number % 2]
        for buffer in self.sequences.values():
            buffer.clear()
        self.read, self.filled = 0, 0  # pieces read, rows filled

    def read_until(self, pieces: int, shards: ShardFiles, blocks: Blocks) -> None:
        """Read pieces up to `pieces` (of len(self.pieces)) into the buffer."""
        while self.read < min(pieces, len(self.pieces)):
            piece = self.pieces[self.read]
            n = piece.hi - piece.lo
            rows = slice(self.filled, self.filled + n)
            shards.read(blocks, piece, self.x[rows], self.y[rows], self.ids[rows], self.sequences, self.filled)
            self.read, self.filled = self.read + 1, self.filled + n


class EpochRows:
    """One epoch of a rank's training rows; `step(k)` for k ascending from any start (a resumed run's)."""

    def __init__(self, rows: TrainRows, order: EpochOrder):
        self.rows, self.order = rows, order
        self.current: _Window | None = None
        self.next: _Window | None = None

    def step(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, RaggedBuffer]]:
        """(x, y, ids, index, sequences): step `step`'s rows of this rank are x[index], y[index], ids[index] and the
        rows `index` of each sequence column's buffer (stored values, host arrays valid until the window after next is read). Reads
        the step's window if need be, and the next window's share."""
        rows, plan = self.rows, self.rows.plan
        number, j = plan.window_of(step)
        if self.current is None or self.current.number != number:
            if self.next is not None and self.next.number == number:
                self.current, self.next = self.next, None
            else:
                self.current = _Window(number, self.order, rows)
            self.current.read_until(len(self.current.pieces), rows.shards, plan.blocks)
        if number + 1 < plan.windows:
            if self.next is None:
                self.next = _Window(number + 1, self.order, rows)
            steps = plan.window_size(number) // plan.global_batch
            self.next.read_until(-(-len(self.next.pieces) * (j + 1) // steps), rows.shards, plan.blocks)
        return self.current.x, self.current.y, self.current.ids, self.order.batch_index(step, rows.rank, rows.ranks), \
            self.current.sequences

    def row_ids(self, step: int) -> np.ndarray:
        """The split's row numbers of this rank's batch at `step` (for the debug hook)."""
        return self.order.row_ids(step, self.rows.rank, self.rows.ranks)


class EvalRows:
    """A contiguous range `span` of a split's rows (manifest order), read block by block. Not a collective."""

    def __init__(self, shards: ShardFiles, blocks: Blocks, span: range):
        self.shards, self.blocks, self.span = shards, blocks, span
        self.buffers: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.sequence_buffers: dict[str, dict[str, RaggedBuffer]] = {}
        self.padding = Workspace(np).part("evaluation")
        starts = blocks.first_rows
        self.pieces = []
        for block in range(len(blocks)):
            lo, hi = max(span.start, int(starts[block])), min(span.stop, int(starts[block + 1]))
            if lo < hi:
                self.pieces.append((block, lo - int(starts[block]), hi - int(starts[block])))

    def __len__(self) -> int:
        return len(self.span)

    def batches(self, batch_size: int):
        """Yield (x, y) of up to `batch_size` rows in order (reused buffers: use each before the next). Each block is
        read once, whole, into a block buffer, and cut into batches from there. A dataset of categorical or sequence
        columns yields as x what its model reads (`model_input`: host `Inputs`, or `padded_rows`' `SequenceBatch`)."""
        block_x, block_y, block_ids = self._buffers("block", int(self.blocks.rows.max()))
        x, y, ids = self._buffers("batch", batch_size)
        block_seqs, seqs = self._sequences("block", int(self.blocks.rows.max())), self._sequences("batch", batch_size)
        for buffer in seqs.values():
            buffer.clear()
        filled = 0
        for block, lo, hi in self.pieces:
            n = hi - lo
            for buffer in block_seqs.values():
                buffer.clear()
            self.shards.read(self.blocks, Piece(block, lo, hi), block_x[:n], block_y[:n], block_ids[:n], block_seqs)
            taken = 0
            while taken < n:
                k = min(n - taken, batch_size - filled)
                into, out_of = slice(filled, filled + k), slice(taken, taken + k)
                x[into], y[into], ids[into] = block_x[out_of], block_y[out_of], block_ids[out_of]
                for name, buffer in seqs.items():
                    buffer.copy_rows(block_seqs[name], taken, k, filled)
                taken, filled = taken + k, filled + k
                if filled == batch_size:
                    yield self._model_rows(x, y, ids, seqs, filled)
                    filled = 0
                    for buffer in seqs.values():
                        buffer.clear()
        if filled:
            yield self._model_rows(x[:filled], y[:filled], ids[:filled], seqs, filled)

    def _sequences(self, name: str, rows: int) -> dict[str, RaggedBuffer]:
        """A `RaggedBuffer` per sequence column for `rows` rows, made on the first call and kept."""
        if name not in self.sequence_buffers or any(len(b.starts) != rows for b in self.sequence_buffers[name].values()):
            self.sequence_buffers[name] = sequence_buffers(self.shards.manifest, rows)
        return self.sequence_buffers[name]

    def _model_rows(self, x: np.ndarray, y: np.ndarray, ids: np.ndarray, seqs: dict[str, RaggedBuffer], rows: int):
        """(what a model reads of these rows, their targets): `model_input`'s and y, or of a dataset of sequence
        columns `padded_rows`'."""
        if not seqs:
            return model_input(self.shards.manifest, x, ids, {}), y
        return padded_rows(self.shards.manifest, seqs, x, y, ids, np.arange(rows), self.padding, "", np.float32)

    def _buffers(self, name: str, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, y, ids) buffers of `rows` rows, made on the first call and kept: an evaluation allocates nothing."""
        if self.buffers.get(name, (np.empty(0),))[0].shape[:1] != (rows,):
            self.buffers[name] = row_buffers(self.shards.manifest, rows)
        return self.buffers[name]

    def first(self, n: int) -> tuple:
        """The first `n` rows of the range (new arrays): (what a model reads, y) as `batches` gives them."""
        for x, y in self.batches(max(1, min(n, len(self)))):
            return x.copy(), y.copy()
        x, y, ids = row_buffers(self.shards.manifest, 0)
        return model_input(self.shards.manifest, x, ids, {}), y


def row_buffers(manifest, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty (x, y, ids) arrays for `rows` stored rows of the dataset of `manifest` (ids (rows, 0) without
    categorical columns)."""
    return (np.empty((rows, *manifest.feature_shape), manifest.feature_dtype),
            np.empty((rows, *manifest.target_shape), manifest.target_dtype),
            np.empty((rows, manifest.id_columns), manifest.ids_dtype))


def padded_rows(manifest, buffers: dict[str, RaggedBuffer], x: np.ndarray, y: np.ndarray, ids: np.ndarray,
                index: np.ndarray, ws, suffix: str, dtype):
    """(what a model reads, its targets) of the rows `index` of a dataset of sequence columns, host arrays of the
    workspace part `ws` (grow-only buffers named `COLUMN{suffix}`, `step_target{suffix}`): each column of `buffers`
    padded to its own longest (`RaggedBuffer.padded`; in `model_dtype`), joined with `x`
    and `ids`, the rows' fixed features and categorical ids, by `model_input`; and `y`, the rows' targets, or a step
    target's classes padded alike (`RaggedBuffer.padded_classes`)."""
    columns = {column["name"]: SequenceBatch(*buffers[column["name"]].padded(
        index, ws, f"{column['name']}{suffix}", model_dtype(manifest, column, dtype))) for column in manifest.sequences}
    if manifest.step_target:
        y = buffers[manifest.step_target].padded_classes(index, ws, f"step_target{suffix}")
    return model_input(manifest, x, ids, columns), y


def model_dtype(manifest, column: dict, dtype) -> np.dtype:
    """The dtype a model gets a sequence column's values in: integers as stored (ids; a layer that reads numbers
    converts them, `mpitrain.nn.layers.as_numbers`), floats in the model's `dtype`."""
    stored = manifest.values_dtype(column)
    return stored if stored.kind in "iu" else np.dtype(dtype)


def model_input(manifest, x, ids, columns: dict[str, SequenceBatch]):
    """A batch as its model reads it: the one column's `SequenceBatch` for a dataset of one sequence column alone
    (`Manifest.input_shape` (None, F), which a `layers:` model reads); `Inputs` of the fixed features `x` (B, k),
    the categorical `ids` (B, columns) and every sequence column (a graph model's inputs); or `x` itself, the rows
    of a dataset of neither."""
    if manifest.input_shape[0] is None:
        return next(iter(columns.values()))
    columns = {"categorical": ids, **columns} if manifest.id_columns else columns
    return Inputs(x, columns) if columns else x


def sequence_buffers(manifest, rows: int) -> dict[str, RaggedBuffer]:
    """An empty `RaggedBuffer` of `rows` rows per sequence column of the dataset of `manifest` (none: {})."""
    return {column["name"]: RaggedBuffer(rows, column["features"], manifest.values_dtype(column))
            for column in manifest.stored_sequences}
