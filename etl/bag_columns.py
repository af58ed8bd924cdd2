"""Bag columns (`--bag COL`): a list of categorical values per record, a user's recent merchants or a session's
pages, which become a ragged sequence of ids through one vocabulary (or hashing) for the column.

    bags = bag_column(batch.column("recent"), "recent", max_length=500, where=path, record=name)   # a Parquet list
    bags = bag_column(texts, "recent", 500, path, name, delimiter="|")   # a CSV cell: "m17|m3|m17"
    fitted = fit_bags(train_rows, ["recent"], options, spec, tmp)   # etl/tables.py: {name: its ids' entry}, on the driver
    ids = bag_ids(bags, CategoryIds(fitted["recent"], "--bag"))          # Ragged int32 ids (steps, 1)

A record's bag is read as its values' text (`mpitrain.data.encoding.category_text`: strings as they are, an
integer's decimal text). An empty list, an empty CSV cell and a missing list are the empty bag (an `embedding_bag`
gives its identity, zeros); a missing value inside a list becomes id 0, as a missing categorical value does.
The ids are those of a `--categorical` column: 2 + the value's index in the vocabulary of the train split's values
seen at least `--min-count` times (most frequent first), 1 for any other value, or 1 + a hash bucket under
`--hash-buckets COL:N`. The tasks carry the texts (`TextBags`) through the shuffle; the vocabulary is fitted on the
rows placed in the train split (`etl/tables.py`'s `vocabularies`, so carved test rows add nothing), and the shard
tasks write the ids as a sequence column whose manifest entry says `bag: true` and holds the vocabulary
(docs/sequences.md#bag-columns).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.data.encoding import ID_DTYPE, CategoryIds, category_text, text_hashes
from mpitrain.data.sequences import Ragged, RaggedRows


@dataclass
class TextBags(RaggedRows):
    """Bags of text values: `values` (a pyarrow string array, null where a value is missing) and `offsets` (rows + 1,)
    int64; bag i is values[offsets[i]:offsets[i+1]]. Indexes, concatenates and pickles as `Ragged` does."""

    values: object
    offsets: np.ndarray

    def __getitem__(self, index) -> TextBags:
        import pyarrow as pa
        offsets, steps = self.taken(index)
        return TextBags(self.values.take(pa.array(steps, pa.int64())), offsets)

    @staticmethod
    def concat(parts: list[TextBags]) -> TextBags:
        import pyarrow as pa
        return TextBags(pa.concat_arrays([p.values for p in parts]), RaggedRows.joined_offsets(parts))

    @staticmethod
    def empty() -> TextBags:
        import pyarrow as pa
        return TextBags(pa.array([], pa.string()), np.zeros(1, np.int64))

    def content(self) -> np.ndarray:
        """Each bag as two uint64 words (the shuffle keys'): `Ragged.content` of its values' text hashes."""
        hashes = text_hashes(self.values).view(np.float32).reshape(-1, 2)
        return Ragged(hashes, self.offsets).content()


def bag_column(column, name: str, max_length: int, where: str, record, delimiter: str | None = None) -> TextBags:
    """A record batch's bag column as `TextBags`: a pyarrow list column of strings or integers, or (`delimiter`) a
    text column whose cells hold the values separated by it. A bag of more than `max_length` values is one
    DataError naming the file, the record and the column; `record(i)` names record i of the batch."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if delimiter is not None:
        text = pc.utf8_trim_whitespace(column.cast(pa.string()))
        column = pc.split_pattern(pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text), delimiter)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise DataError(f"{where}: column {name!r} is {column.type}; expected a list of strings or integers per "
                        "record (--bag)")
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if (lengths > max_length).any():
        i = int(np.argmax(lengths > max_length))
        raise DataError(f"{where}: record {record(i)}: column {name!r} holds a bag of {lengths[i]} values, more than "
                        f"--max-length {max_length}")
    try:
        values = category_text(pc.list_flatten(column), name)
    except DataError as e:
        raise DataError(f"{where}: {e} in its bags (--bag)") from None
    if delimiter is not None:  # "a||b": a missing value between a and b
        values = pc.utf8_trim_whitespace(values)
        values = pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)
    return TextBags(values, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def bag_ids(bags: TextBags, ids: CategoryIds) -> Ragged:
    """A shard's bags as stored: each value's id (its column's vocabulary or hash buckets) as ID_DTYPE steps of 1."""
    return Ragged(ids(bags.values).astype(ID_DTYPE)[:, None], bags.offsets)
