"""Sequence columns (`--sequence COL`): a Parquet list of numbers, or of fixed-length lists of numbers, per record.

    seqs = ragged_column(batch.column("readings"), "readings", features=3, max_length=500, where=path, record=name)

Each record's sequence becomes a `Ragged` row (its steps' values one after another, and offsets), stored so in the
shards and never padded (docs/sequences.md). A step is one number (`features` 1) or a list of `features` numbers,
the length of the first record's first step. A column of integers (a Parquet list of an integer type: token ids)
stays integers, stored as int32; one of floats is stored as float32 (which holds integers exactly up to 2**24:
`mpitrain.data.encoding.TOKEN_IDS`). A record whose sequence is missing, empty, longer than `--max-length`, or holds a missing or
non-finite number or a step of another length is not a bad record to drop: the data is not what the job was told,
so the job stops with one line naming the file, the record and the column. `StoredSequences` is what the ETL does
to a column's values before it stores them, which scoring does to a record's again.
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.data.encoding import CategoryIds
from mpitrain.data.sequences import Ragged
from mpitrain.etl.bag_columns import bag_ids

DEFAULT_MAX_LENGTH = 10_000
INT32_RANGE = 1 << 31  # a column of integers is stored as int32 (`mpitrain.data.encoding.ID_DTYPE`)


def step_features(first_value) -> int:
    """The features of a step, from a record's sequence as Python values: 1 for numbers, the length of a list."""
    step = first_value[0] if first_value else None
    return len(step) if isinstance(step, (list, tuple)) else 1


def ragged_column(column, name: str, features: int, max_length: int, where: str, record) -> Ragged:
    """A pyarrow list column of a record batch as `Ragged` float32 sequences of `features`-vectors, checked (see the
    module docstring); `record(i)` names record i of the batch in a message."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_list(column.type) and not pa.types.is_large_list(column.type):
        raise DataError(f"{where}: column {name!r} is {column.type}; expected a list of numbers per record "
                        "(--sequence)")
    lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    _refuse(where, name, record, lengths < 0, "holds no sequence (null)")
    _refuse(where, name, record, lengths == 0, "holds an empty sequence, expected at least one step")
    _refuse(where, name, record, lengths > max_length,
            lambda i: f"holds a sequence of {lengths[i]} steps, more than --max-length {max_length}")
    steps = pc.list_flatten(column)
    parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
    if pa.types.is_list(steps.type) or pa.types.is_large_list(steps.type):
        widths = pc.fill_null(pc.list_value_length(steps), -1).to_numpy(zero_copy_only=False)
        wrong = np.zeros(len(lengths), bool)
        wrong[parents[widths != features]] = True
        _refuse(where, name, record, wrong, f"holds a step that is not a list of {features} numbers (the first "
                                            "record's steps have that many)")
        parents = np.repeat(parents, features)
        steps = pc.list_flatten(steps)
    elif features != 1:
        raise DataError(f"{where}: column {name!r} holds numbers as steps; expected lists of {features} numbers")
    if not (pa.types.is_integer(steps.type) or pa.types.is_floating(steps.type) or pa.types.is_null(steps.type)):
        raise DataError(f"{where}: column {name!r} holds {steps.type} values in its sequences; expected numbers")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if pa.types.is_integer(steps.type):  # integers stay integers (token ids past float32's 2**24 included)
        bad = np.zeros(len(lengths), bool)
        bad[parents[steps.is_null().to_numpy(zero_copy_only=False)]] = True
        _refuse(where, name, record, bad, "holds a missing number in its sequence, expected integers")
        values = steps.cast(pa.int64()).to_numpy(zero_copy_only=False) if len(steps) else np.zeros(0, np.int64)
        bad[parents[(values < -INT32_RANGE) | (values >= INT32_RANGE)]] = True
        _refuse(where, name, record, bad, "holds an integer outside -2**31..2**31-1, expected integers an int32 holds")
        return Ragged(values.reshape(-1, features), offsets)
    values = pc.fill_null(steps.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
    bad = np.zeros(len(lengths), bool)
    bad[parents[~np.isfinite(values)]] = True
    _refuse(where, name, record, bad, "holds a missing or non-finite number in its sequence, expected finite numbers")
    return Ragged(values.astype(np.float32).reshape(-1, features), offsets)


def _refuse(where: str, name: str, record, bad: np.ndarray, problem) -> None:
    """One DataError for the first record where `bad` holds: the file, the record, the column and `problem` (a
    text, or a function of the record's index)."""
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{where}: record {record(i)}: column {name!r} "
                        f"{problem(i) if callable(problem) else problem}")


class StoredSequences:
    """The values a dataset stores of a record's sequence and bag columns, by the columns' manifest entries
    (`sequences`): a bag column's texts become its ids (`etl/bag_columns.py`), a standardized column's values
    (v - mean) / std per channel in float32, the others stay as read. The ETL's shard tasks apply it to the rows
    they write, and scoring to the records it scores, so a model sees the same values from both. `root` is the
    dataset's folder or URL, where a bag column's file vocabulary lies (`mpitrain.data.vocabulary_files`)."""

    def __init__(self, entries: list[dict], root: str | None = None):
        self.ids = {entry["name"]: CategoryIds(entry, "--bag", root) for entry in entries if entry.get("bag")}
        self.scaling = {entry["name"]: (np.asarray(entry["mean"], np.float64), np.asarray(entry["std"], np.float64))
                        for entry in entries if "mean" in entry}

    def __call__(self, sequences: dict) -> dict[str, Ragged]:
        """{name: Ragged, or a bag column's TextBags} as read -> {name: Ragged} as stored."""
        stored = {}
        for name, seqs in sequences.items():
            if name in self.ids:
                seqs = bag_ids(seqs, self.ids[name])
            elif name in self.scaling:
                mean, std = self.scaling[name]
                seqs = Ragged(((seqs.values.astype(np.float64) - mean) / std).astype(np.float32), seqs.offsets)
            stored[name] = seqs
        return stored
