"""A table's records as rows of `x` and `ids`: the one mapping of raw columns to model rows, which the manifest's
`columns` record, so that the ETL, Spark scoring and export apply the same one.

    encoder = TableEncoder(manifest.columns)
    encoded = encoder.encode(batch)      # a pyarrow RecordBatch or Table, or {column name: values}
    encoded.x, encoded.ids               # float32 (rows, encoder.width), int32 (rows, categorical); a bad row: zeros
    encoded.bad, encoded.problem(i)      # the rows that cannot be encoded, and why (one line naming the column)

`encode` is two steps, which the ETL runs apart: its read tasks parse records (`parse_table`, giving
`TableRows`), the driver fits statistics and vocabularies on the train split, then the shard tasks map the parsed
rows (`TableEncoder.numbers` and `TableEncoder.ids`). A row of x holds the `columns["numeric"]` entries in order,
and a row of ids one id per `columns["categorical"]` entry, an integer (`ID_DTYPE`):

- numeric `{name}`: the value as a float; a missing one (null, an empty CSV field, NaN) becomes the entry's `impute`
  when it has one, else the row is bad; then `(value - mean) / std` when the entry has `mean` and `std`. Text that
  is not a number, and an infinite value, make a bad row. An indicator `{name, missing_of: COL}` is 1 where COL was
  missing, else 0.
- categorical `{name, ids}`: a value's text (strings as they are, an integer's decimal text, a boolean's
  `true`/`false`) maps to 0 when missing; with a `vocabulary`, to 2 + its index there, or 1 (out of vocabulary)
  when it is not there; with `hash_buckets` B, to `1 + hash_ids`: splitmix64 of the FNV-1a 64-bit hash of its
  UTF-8 bytes, mod B; with a `vocabulary_path`, by Parquet files of the dataset (`mpitrain.data.vocabulary_files`).

pyarrow (the `spark` and `onnx` extras) is imported when a batch is parsed or encoded.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.kernels.splitmix import splitmix64

FNV_OFFSET, FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)
HASH = "fnv1a64-splitmix64"  # the hash of `hash_ids`, named in a hashed column's manifest entry
MISSING_ID, OUT_OF_VOCABULARY_ID = 0, 1
# Ids (a categorical or bag column's) are integers from the ETL to the embedding's gather, stored as ID_DTYPE: at most
# MAX_IDS per column (a table of as many rows; the sparse exchange carries them in int32 too).
ID_DTYPE = "int32"
MAX_IDS = 1 << 31
# A sequence column of floats stores them as float32, which holds every integer only up to 2**24: larger ones are
# numbers, not token ids. A column of integers (`integer`) and a bag column store theirs as int32 (up to MAX_IDS).
TOKEN_IDS = 1 << 24


def fnv1a64(texts) -> np.ndarray:
    """FNV-1a 64 of each value's UTF-8 bytes (a pyarrow string array; a null's hash is FNV's offset basis)."""
    import pyarrow as pa
    texts = _array(texts).cast(pa.string())
    n = len(texts)
    offsets, data = string_buffers(texts)
    lengths = offsets[1:] - offsets[:-1]
    order = np.argsort(-lengths, kind="stable")  # longest first: the values still being hashed are a prefix
    starts, ordered = offsets[:-1][order], lengths[order]
    hashes = np.full(n, FNV_OFFSET, np.uint64)
    with np.errstate(over="ignore"):
        for position in range(int(ordered[0]) if n else 0):
            active = int(np.searchsorted(-ordered, -position, side="left"))  # values longer than `position`
            hashes[:active] = (hashes[:active] ^ data[starts[:active] + position].astype(np.uint64)) * FNV_PRIME
    out = np.empty(n, np.uint64)
    out[order] = hashes
    return out


def string_buffers(texts) -> tuple[np.ndarray, np.ndarray]:
    """A pyarrow string array's value offsets (int64, n + 1, into the data) and its data buffer (uint8), as views;
    the i-th value's UTF-8 bytes are data[offsets[i]:offsets[i + 1]]."""
    n = len(texts)
    offsets = np.frombuffer(texts.buffers()[1], np.int32)[texts.offset:texts.offset + n + 1].astype(np.int64) \
        if n else np.zeros(1, np.int64)
    data = texts.buffers()[2]
    return offsets, np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)


def text_hashes(texts) -> np.ndarray:
    """splitmix64(FNV-1a 64) of each value's UTF-8 bytes: uint64, 0 for a missing value."""
    texts = _array(texts)
    hashes = splitmix64(fnv1a64(texts))
    return np.where(texts.is_null().to_numpy(zero_copy_only=False), np.uint64(0), hashes)


def hash_ids(texts, buckets: int) -> np.ndarray:
    """A hashed column's ids (int64): 0 for a missing value, else 1 + splitmix64(FNV-1a 64(UTF-8 bytes)) mod
    `buckets`."""
    texts = _array(texts)
    ids = (splitmix64(fnv1a64(texts)) % np.uint64(buckets)).astype(np.int64) + 1
    return np.where(texts.is_null().to_numpy(zero_copy_only=False), MISSING_ID, ids)


def vocabulary_ids(texts, vocabulary) -> np.ndarray:
    """A vocabulary column's ids (int64): 0 for a missing value, 2 + the value's index in `vocabulary` (a pyarrow
    string array), 1 for a value not in it."""
    import pyarrow.compute as pc
    texts = _array(texts)
    index = pc.fill_null(pc.index_in(texts, value_set=vocabulary), -1).to_numpy(zero_copy_only=False)
    ids = np.where(index < 0, OUT_OF_VOCABULARY_ID, index.astype(np.int64) + 2)
    return np.where(texts.is_null().to_numpy(zero_copy_only=False), MISSING_ID, ids)


def column_kind(data_type) -> str:
    """An Arrow type as the ETL names column kinds: integer, number, boolean, string, array, null or the type."""
    import pyarrow as pa
    t = pa.types
    if t.is_integer(data_type):
        return "integer"
    if t.is_floating(data_type) or t.is_decimal(data_type):
        return "number"
    if t.is_dictionary(data_type):
        return column_kind(data_type.value_type)
    for kind, test in (("boolean", t.is_boolean), ("string", t.is_string), ("string", t.is_large_string),
                       ("null", t.is_null), ("array", t.is_list), ("array", t.is_large_list),
                       ("array", t.is_fixed_size_list)):
        if test(data_type):
            return kind
    return str(data_type)


def category_text(values, name: str):
    """A categorical column as a pyarrow string array of its values' text, null where missing."""
    import pyarrow as pa
    values = _array(values)
    kind = column_kind(values.type)
    if kind not in ("string", "integer", "boolean", "null"):
        raise DataError(f"column {name!r} holds {values.type}, expected strings or integers (a categorical column)")
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    return values.cast(pa.string())


def numeric_values(values, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A numeric column as float64 (NaN where missing) and a mask of the values that are text, not numbers."""
    import pyarrow as pa
    import pyarrow.compute as pc
    values = _array(values)
    kind = column_kind(values.type)
    unparsable = np.zeros(len(values), bool)
    if kind == "null":
        return np.full(len(values), np.nan), unparsable
    if kind == "string":
        values = pc.utf8_trim_whitespace(values.cast(pa.string()))
        try:
            values = values.cast(pa.float64())
        except pa.ArrowInvalid:  # some text is not a number: find it value by value
            numbers = np.full(len(values), np.nan)
            for i, text in enumerate(values.to_pylist()):
                try:
                    numbers[i] = float(text) if text is not None else np.nan
                except ValueError:
                    unparsable[i] = True
            return numbers, unparsable
    elif kind not in ("integer", "number", "boolean"):
        raise DataError(f"column {name!r} holds {values.type}, expected numbers (a numeric column)")
    return values.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64, copy=False), unparsable


def _array(values):
    """A pyarrow Array of a ChunkedArray (its chunks joined), an Array, or array-like values."""
    import pyarrow as pa
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    return values if isinstance(values, pa.Array) else pa.array(values)


def _column(batch, name: str):
    """Column `name` of a RecordBatch, Table or dict of values, as one pyarrow array."""
    if isinstance(batch, dict):
        if name not in batch:
            raise DataError(f"no column {name!r}; the records have {sorted(batch)}")
        return _array(batch[name])
    if name not in batch.schema.names:
        raise DataError(f"no column {name!r}; the records have {batch.schema.names}")
    return _array(batch.column(name))


def _rows(batch) -> int:
    if isinstance(batch, dict):
        return len(next(iter(batch.values()))) if batch else 0
    return batch.num_rows


@dataclass
class TableRows:
    """Parsed rows of a table, not yet encoded: numeric values (float64, NaN where missing) and each categorical
    column's text (a pyarrow string array, null where missing). The ETL carries them through its shuffle; they
    index, concatenate and pickle as whole arrays."""

    numeric: np.ndarray  # (rows, numeric columns)
    categorical: list  # one pyarrow StringArray per categorical column

    def __len__(self) -> int:
        return len(self.numeric)

    def __getitem__(self, index) -> TableRows:
        """The rows at `index` (integer positions, or a boolean mask)."""
        import pyarrow as pa
        index = np.asarray(index)
        index = np.flatnonzero(index) if index.dtype == bool else index.astype(np.int64, copy=False)
        taken = pa.array(index, pa.int64())
        return TableRows(self.numeric[index], [column.take(taken) for column in self.categorical])

    @staticmethod
    def concat(parts: Sequence[TableRows]) -> TableRows:
        import pyarrow as pa
        return TableRows(np.concatenate([p.numeric for p in parts]),
                         [pa.concat_arrays(list(columns)) for columns in zip(*(p.categorical for p in parts))])

    @staticmethod
    def empty(numeric: int, categorical: int) -> TableRows:
        import pyarrow as pa
        return TableRows(np.empty((0, numeric)), [pa.array([], pa.string()) for _ in range(categorical)])

    def content(self) -> np.ndarray:
        """The rows' content as uint64 words (for the ETL's shuffle keys): the numeric values' bits (every NaN
        alike), then each categorical value's `text_hashes`."""
        numeric = np.where(np.isnan(self.numeric), np.nan, self.numeric).view(np.uint64)
        return np.concatenate([numeric, *(text_hashes(c)[:, None] for c in self.categorical)], axis=1)


@dataclass
class Parsed:
    """Records parsed into TableRows; `bad` marks the rows that cannot be encoded, `problem(i)` says why."""

    rows: TableRows
    bad: np.ndarray
    problems: list[tuple[np.ndarray, Callable[[int], str]]]  # per column: (its bad rows, describe(row))

    def problem(self, i: int) -> str:
        """Why row i is bad: its first bad column, e.g. "column 'age' holds 'abc', expected a number"."""
        for mask, describe in self.problems:
            if mask[i]:
                return describe(i)
        return ""


def parse_table(batch, numeric: Sequence[str], categorical: Sequence[str], imputed: Collection[str] = ()) -> Parsed:
    """Columns of `batch` by name -> TableRows. A row is bad where a numeric column holds text that is not a number,
    an infinite value, or nothing (unless the column is in `imputed`: its missing values stay NaN)."""
    rows = _rows(batch)
    values = np.empty((rows, len(numeric)))
    problems = []
    for j, name in enumerate(numeric):
        column = _column(batch, name)
        values[:, j], unparsable = numeric_values(column, name)
        missing = np.isnan(values[:, j]) & ~unparsable
        infinite = np.isinf(values[:, j])
        if unparsable.any():
            problems.append((unparsable, lambda i, name=name, column=column:
                             f"column {name!r} holds {column[i].as_py()!r}, expected a number"))
        if infinite.any():
            problems.append((infinite, lambda i, name=name, column=values[:, j]:
                             f"column {name!r} holds {column[i]}, expected a finite number"))
        if name not in imputed and missing.any():
            problems.append((missing, lambda i, name=name: f"column {name!r} is missing, expected a number "
                                                           "(--numeric-missing impute fills it in)"))
    texts = [category_text(_column(batch, name), name) for name in categorical]
    bad = np.zeros(rows, bool)
    for mask, _ in problems:
        bad |= mask
    return Parsed(TableRows(values, texts), bad, problems)


@dataclass
class Encoded:
    """Encoded records: `x` float32 (rows, width) and `ids` (rows, categorical columns), zeros in a bad row; `bad`
    and `problem(i)` as `Parsed`'s."""

    x: np.ndarray
    ids: np.ndarray
    bad: np.ndarray
    problem: Callable[[int], str]


class TableEncoder:
    """The manifest's `columns` as a mapping of records to rows of x and ids (see the module docstring).

    `numeric` and `categorical` name the raw columns a record must have (indicators are computed, not read);
    `imputed` the numeric ones whose missing values are filled in; `root` is the dataset's folder or URL, where a
    column's file vocabulary lies (`mpitrain.data.vocabulary_files`), and `file_ids` what looks its values up
    (`CategoryIds`).
    """

    def __init__(self, columns: dict[str, list[dict]], root: str | None = None, file_ids=None):
        self.columns = columns
        entries = columns.get("numeric", [])
        self.numeric = [c["name"] for c in entries if "missing_of" not in c]
        self.categorical = [c["name"] for c in columns.get("categorical", [])]
        self.imputed = {c["name"] for c in entries if "impute" in c}
        self.width = len(entries)  # x's; ids have one per categorical column
        for entry in entries:
            if "missing_of" in entry and entry["missing_of"] not in self.numeric:
                raise DataError(f"columns.numeric {entry['name']!r}: missing_of {entry['missing_of']!r} is not a "
                                f"numeric column ({self.numeric})")
        self.column_ids = [CategoryIds(entry, "columns.categorical", root, file_ids)
                           for entry in columns.get("categorical", [])]

    def parse(self, batch) -> Parsed:
        """The encoder's raw columns of `batch` parsed (`parse_table`)."""
        return parse_table(batch, self.numeric, self.categorical, self.imputed)

    def encode(self, batch) -> Encoded:
        """Records (a pyarrow RecordBatch or Table, or {column name: values}) -> rows of x and ids, bad rows marked."""
        parsed = self.parse(batch)
        x = np.zeros((len(parsed.rows), self.width), np.float32)
        ids = np.zeros((len(parsed.rows), len(self.categorical)), ID_DTYPE)
        good = np.flatnonzero(~parsed.bad)
        x[good], ids[good] = self.numbers(parsed.rows[good]), self.ids(parsed.rows[good])
        return Encoded(x, ids, parsed.bad, parsed.problem)

    def numbers(self, rows: TableRows) -> np.ndarray:
        """Parsed rows (no bad ones among them) -> float32 rows of x."""
        x = np.empty((len(rows), self.width), np.float32)
        entries = self.columns.get("numeric", [])
        for j, entry in enumerate(entries):
            if "missing_of" in entry:
                x[:, j] = np.isnan(rows.numeric[:, self.numeric.index(entry["missing_of"])])
                continue
            values = rows.numeric[:, self.numeric.index(entry["name"])]
            if "impute" in entry:
                values = np.where(np.isnan(values), float(entry["impute"]), values)
            if "mean" in entry:
                values = (values - float(entry["mean"])) / (float(entry["std"]) or 1.0)
            x[:, j] = values
        return x

    def ids(self, rows: TableRows) -> np.ndarray:
        """Parsed rows (no bad ones among them) -> their ids, ID_DTYPE (rows, categorical columns)."""
        ids = np.empty((len(rows), len(self.categorical)), ID_DTYPE)
        for j, (column_ids, texts) in enumerate(zip(self.column_ids, rows.categorical)):
            ids[:, j] = column_ids(texts)
        return ids


class CategoryIds:
    """The ids of a categorical column's (or a bag column's) texts by its manifest entry: {name, ids, vocabulary},
    {name, ids, hash_buckets, hash} (see the module docstring) or a vocabulary in Parquet parts under `root`, the
    dataset's folder or URL (`mpitrain.data.vocabulary_files`), looked up by `file_ids(entry)` where given (a
    callable of texts: `mpitrain.parallel.vocabulary_lookup`'s, shared among ranks); an entry whose ids do not match
    is a DataError naming it under `where` (the manifest's key)."""

    def __init__(self, entry: dict, where: str, root: str | None = None, file_ids=None):
        self.entry, self.vocabulary, self.file = entry, None, None
        if "vocabulary_path" in entry:
            from mpitrain.data.vocabulary_files import FileVocabulary  # it imports this module's hash
            if root is None:
                raise DataError(f"{where} {entry.get('name')!r}: its vocabulary is the Parquet files "
                                f"{entry.get('vocabulary_path')!r} of its dataset, and no dataset is known here")
            self.file = file_ids(entry) if file_ids else FileVocabulary(entry, root, where)
            return
        vocabulary, buckets = entry.get("vocabulary"), entry.get("hash_buckets")
        if not (isinstance(vocabulary, list) and entry.get("ids") == len(vocabulary) + 2 or
                isinstance(buckets, int) and entry.get("ids") == buckets + 1 and entry.get("hash", HASH) == HASH):
            raise DataError(f"{where} {entry.get('name')!r}: expected a vocabulary of ids - 2 values, ids - 1 "
                            f"hash_buckets of hash {HASH!r} or a vocabulary_path (it has {sorted(entry)})")

    def __call__(self, texts) -> np.ndarray:
        """int64 ids of `texts` (a pyarrow string array, null where missing)."""
        if self.file is not None:
            return self.file(texts)
        if "hash_buckets" in self.entry:
            return hash_ids(texts, self.entry["hash_buckets"])
        if self.vocabulary is None:
            import pyarrow as pa
            self.vocabulary = pa.array([str(v) for v in self.entry["vocabulary"]], pa.string())
        return vocabulary_ids(texts, self.vocabulary)
