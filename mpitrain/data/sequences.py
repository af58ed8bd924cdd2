"""Variable-length sequences: stored ragged, carried ragged through the ETL and the reader, padded per batch.

    seqs = Ragged(values, offsets)             # sequence i: values[offsets[i]:offsets[i+1]], (steps, F)
    seqs[index]                                # the sequences at `index`, ragged again
    values, lengths = buffer.padded(index, ws, name, dtype)   # a step's sequences as (B, T, F) plus their lengths

On disk and in memory a sequence column is ragged: its steps' values one after another and the offsets
where each row's begin, never padded to the longest sequence (docs/sequences.md). Only a batch is padded, to its
own longest sequence rounded up to `PAD_MULTIPLE` steps, so the model's arrays take a handful of shapes instead
of one per length; its `lengths` say which steps are real. The layers keep the masking contract
(docs/sequences.md), so what a sequence gives does not depend on its batch's padding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mpitrain.data.encoding import MAX_IDS, TOKEN_IDS
from mpitrain.kernels.rows import copy_ragged, longest, padded_rows

PAD_MULTIPLE = 8  # a batch's padded length is its longest sequence rounded up to a multiple of this
MAX_LENGTH = 1 << 20  # the most steps a stored sequence may have (the ETL's --max-length is at most this)


class RaggedRows:
    """What rows of values held one after another with their `offsets` (rows + 1,) int64 share, whatever the values
    are (`Ragged`'s numbers, a bag column's texts in the ETL): lengths, row count, and the offsets and value
    positions of some rows taken or of parts joined."""

    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def taken(self, index) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, value positions) of the rows at `index` (integer positions or a boolean mask), in that order."""
        index = np.asarray(index)
        index = np.flatnonzero(index) if index.dtype == bool else index.astype(np.int64, copy=False)
        return gathered_steps(self.offsets[:-1][index], self.lengths[index])

    @staticmethod
    def joined_offsets(parts: list[RaggedRows]) -> np.ndarray:
        """The offsets of `parts`' rows one part after another."""
        shifts = np.cumsum([0] + [p.offsets[-1] for p in parts])
        return np.concatenate([[0]] + [p.offsets[1:] + shift for p, shift in zip(parts, shifts)]).astype(np.int64)


@dataclass
class Ragged(RaggedRows):
    """Sequences of F-vectors: `values` (total steps, F) and `offsets` (rows + 1,) int64, offsets[0] == 0."""

    values: np.ndarray
    offsets: np.ndarray

    @property
    def features(self) -> int:
        return self.values.shape[1]

    def __getitem__(self, index) -> Ragged:
        """The sequences at `index` (integer positions or a boolean mask), in that order."""
        offsets, steps = self.taken(index)
        return Ragged(self.values[steps], offsets)

    def padded(self) -> tuple[np.ndarray, np.ndarray]:
        """The sequences as one array (rows, T, F), zeros after each one's end, T the longest (at least 1), and their
        lengths (rows,) int64: a model's input outside training (scoring's ONNX feeds)."""
        lengths = self.lengths
        out = np.zeros((len(self), max(int(lengths.max(initial=0)), 1), self.features), self.values.dtype)
        rows = np.repeat(np.arange(len(self)), lengths)
        out[rows, np.arange(len(self.values)) - np.repeat(self.offsets[:-1], lengths)] = self.values
        return out, lengths.astype(np.int64)

    @staticmethod
    def concat(parts: list[Ragged]) -> Ragged:
        return Ragged(np.concatenate([p.values for p in parts]), RaggedRows.joined_offsets(parts))

    @staticmethod
    def empty(features: int, dtype="float32") -> Ragged:
        return Ragged(np.empty((0, features), dtype), np.zeros(1, np.int64))

    def content(self) -> np.ndarray:
        """Each sequence as two uint64 words (for the ETL's shuffle keys): its length and a hash of its values' bits
        and their places (a different order of the same values hashes differently)."""
        words = np.ascontiguousarray(self.values, np.float32).view(np.uint32).astype(np.uint64)
        words = words.reshape(len(self.values), -1)
        places = np.arange(words.size, dtype=np.uint64).reshape(words.shape)
        with np.errstate(over="ignore"):
            mixed = (words * np.uint64(0x9E3779B97F4A7C15) + places * np.uint64(0xBF58476D1CE4E5B9)).sum(
                axis=1, dtype=np.uint64) if words.size else np.zeros(len(self.values), np.uint64)
            positions = np.arange(len(self.values), dtype=np.uint64) - np.repeat(
                self.offsets[:-1].astype(np.uint64), self.lengths)
            mixed ^= positions * np.uint64(0x94D049BB133111EB)
            # a trailing 0 so that an empty last sequence's offset is an index; an empty range gives the value at
            # its index, so each empty sequence's hash is set to 0 after
            hashes = np.add.reduceat(np.append(mixed, np.uint64(0)), self.offsets[:-1], dtype=np.uint64) \
                if len(self) else np.zeros(0, np.uint64)
        hashes[self.lengths == 0] = 0
        return np.stack([self.lengths.astype(np.uint64), hashes], axis=1)


@dataclass
class SequenceRows:
    """The ETL's rows of a sequence dataset: the fixed features `x` (rows, width; width 0 without `--features`) and
    each `--sequence` column, ragged (a `--bag` column's texts: `etl/bag_columns.py`'s TextBags, alike). Indexes, concatenates and pickles like a table's `TableRows`."""

    x: np.ndarray
    sequences: dict[str, Ragged] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index) -> SequenceRows:
        return SequenceRows(self.x[index], {name: seqs[index] for name, seqs in self.sequences.items()})

    @staticmethod
    def concat(parts: list[SequenceRows]) -> SequenceRows:
        return SequenceRows(np.concatenate([p.x for p in parts]),  # a column's type concatenates it (a bag's too)
                            {name: type(seqs).concat([p.sequences[name] for p in parts])
                             for name, seqs in parts[0].sequences.items()})

    def content(self) -> np.ndarray:
        """The rows' content as bytes per row (for the shuffle keys): the fixed features, then each sequence's."""
        fixed = np.ascontiguousarray(self.x).view(np.uint8).reshape(len(self.x), -1)
        return np.concatenate([fixed, *(s.content().view(np.uint8).reshape(len(self), -1)
                                        for s in self.sequences.values())], axis=1)


@dataclass
class SequenceBatch:
    """A batch of sequences as a model takes it: `values` (B, T, F) padded after each sequence's end, `lengths` (B,)
    int64, on the model's device (numpy or cupy arrays)."""

    values: object
    lengths: object

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    def copy(self) -> SequenceBatch:
        return SequenceBatch(self.values.copy(), self.lengths.copy())


@dataclass
class Inputs:
    """A batch of a dataset whose model reads several inputs: the fixed features `x` (B, k), k = 0 without any, and
    its columns by name, in the manifest's order: a table's categorical ids (`categorical`, (B, columns) integers)
    and each sequence column padded to its own longest with its own lengths (a `SequenceBatch`; docs/sequences.md).
    A graph model (`mpitrain.nn.graph`) reads `x` as the input `numeric` and each column as the input of its name."""

    x: object
    columns: dict[str, object]

    def __len__(self) -> int:
        return len(self.x)

    def copy(self) -> Inputs:
        return Inputs(self.x.copy(), {name: batch.copy() for name, batch in self.columns.items()})


class RaggedBuffer:
    """A window's (or an evaluation block's) sequences of one column, read piece by piece: each row's start in
    `values` and its length. `values` grows (to twice its size at least) when the rows read outgrow it, so a run
    reallocates it a few times at most."""

    def __init__(self, rows: int, features: int, dtype):
        self.starts = np.zeros(rows, np.int64)
        self.lengths = np.zeros(rows, np.int64)
        self.values = np.empty((0, features), dtype)
        self.used = 0

    def clear(self) -> None:
        self.used = 0

    def space(self, row: int, offsets: np.ndarray) -> np.ndarray:
        """Room for the sequences of rows `row`.. with `offsets` (their stored offsets, rows + 1): records their
        starts and lengths and returns the (steps, F) array to read their values into."""
        steps = int(offsets[-1] - offsets[0])
        if self.used + steps > len(self.values):
            grown = np.empty((max(self.used + steps, 2 * len(self.values)), self.values.shape[1]), self.values.dtype)
            grown[:self.used] = self.values[:self.used]
            self.values = grown
        n = len(offsets) - 1
        self.starts[row:row + n] = self.used + offsets[:-1] - offsets[0]
        self.lengths[row:row + n] = np.diff(offsets)
        begin, self.used = self.used, self.used + steps
        return self.values[begin:self.used]

    def copy_rows(self, source: RaggedBuffer, first: int, count: int, row: int) -> None:
        """Rows `first`.. `first + count - 1` of `source` as this buffer's rows `row`.. on."""
        lengths = source.lengths[first:first + count]
        offsets = np.zeros(count + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        copy_ragged(source.values, source.starts[first:first + count], lengths, offsets, self.space(row, offsets))

    def padded(self, index: np.ndarray, ws, name: str, dtype) -> tuple[np.ndarray, np.ndarray]:
        """The sequences of rows `index` as (B, T, F) in `dtype`, zeros after each one's end (T: the longest,
        rounded up to PAD_MULTIPLE), and their lengths (B,): host arrays of the workspace part `ws` (grow-only
        buffers `name`, valid until the next call with that name)."""
        shape = (len(index), padded_length(longest(self.lengths, index)), self.values.shape[1])
        out = ws.at_least(f"{name}.values", int(np.prod(shape)), dtype, host=True).reshape(shape)
        lengths_out = ws.at_least(f"{name}.lengths", len(index), np.int64, host=True)
        padded_rows(self.values, self.starts, self.lengths, index, 0, out, lengths_out)
        return out, lengths_out

    def padded_classes(self, index: np.ndarray, ws, name: str) -> np.ndarray:
        """A step target's classes of rows `index` as (B, T) int32, -1 after each sequence's end (T as `padded`
        gives it for the same lengths): a host array of `ws` (grow-only buffer `name`)."""
        shape = (len(index), padded_length(longest(self.lengths, index)))
        out = ws.at_least(name, shape[0] * shape[1], np.int32, host=True).reshape(shape)
        lengths_out = ws.at_least(f"{name}.lengths", len(index), np.int64, host=True)
        padded_rows(self.values, self.starts, self.lengths, index, -1, out.reshape(*shape, 1), lengths_out)
        return out


def gathered_steps(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, steps) of sequences gathered one after another: each of `lengths[i]` steps from `starts[i]` on in
    some values array; `values[steps]` holds them in that order, and `offsets` (int64, len + 1) where each begins."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return offsets, np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])


def token_ids(values: np.ndarray) -> int:
    """A sequence column's `ids` (the manifest's, docs/sequences.md): the largest value + 1 when every value is a
    non-negative integer of one feature per step (token ids), floats below TOKEN_IDS, else 0 (no ids: numbers)."""
    limit = MAX_IDS if values.dtype.kind in "iu" else TOKEN_IDS
    if values.shape[1] != 1 or not len(values) or (values < 0).any() or (values != np.floor(values)).any() or \
            values.max() >= limit:
        return 0
    return int(values.max()) + 1


def padded_length(longest: int) -> int:
    """A batch's padded length: its `longest` sequence rounded up to a multiple of PAD_MULTIPLE, at least one
    multiple (a batch of empty sequences still has steps, all padding)."""
    return max(1, -(-int(longest) // PAD_MULTIPLE)) * PAD_MULTIPLE
