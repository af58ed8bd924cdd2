"""A vocabulary too large for manifest.json: Parquet parts beside it, partitioned by the values' text hash.

    entry = {"name": "user", "ids": 1_000_002, "vocabulary_path": "vocabularies/user", "vocabulary_parts": 8,
             "hash": "fnv1a64-splitmix64", "min_count": 1}                 # a manifest's column entry
    lookup = FileVocabulary(entry, root="data/clicks")                   # the dataset's folder or URL
    ids = lookup(texts)                                                  # int64: 0 missing, 1 unseen, 2.. values

`mpitrain etl --vocabulary-files` writes a column whose vocabulary passes `--max-vocabulary` this way
(`mpitrain.etl.tables`): part g of G, `PATH/part-GGGGG.parquet`, holds the values whose `text_hashes` mod G is g,
sorted by their text, in columns `value` (string), `id` (int64) and `count` (train rows that hold it, int64). A
part's ids are consecutive: 2 + the values of the parts before it + the value's place in the part. Each part is
written by the Spark task that counted its values, so the vocabulary never passes through the driver; and a value's
id is found in its own part, so a reader loads only the parts the values it looks up hash to (`parts_of`), each
once. The ids do not follow the values' frequency, as a manifest's vocabulary does (most frequent first): a file
vocabulary is for a column with more values than an embedding table is worth ordering.
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.data.encoding import HASH, MISSING_ID, OUT_OF_VOCABULARY_ID, text_hashes, vocabulary_ids
from mpitrain.data.storage import open_storage

PART_FIELDS = ("value", "id", "count")


def part_path(folder: str, part: int) -> str:
    """The relative path of part `part` of the vocabulary at `folder` (relative to the dataset)."""
    return f"{folder}/part-{part:05d}.parquet"


def parts_of(texts, parts: int) -> np.ndarray:
    """The part (0..parts-1) of each value of `texts` (a pyarrow string array); a missing value's is 0."""
    return (text_hashes(texts) % np.uint64(parts)).astype(np.int64)


def file_paths(entries: list[dict]) -> list[str]:
    """The relative paths of every part of the file vocabularies among column entries (a manifest's categorical
    columns and bag columns)."""
    return [part_path(e["vocabulary_path"], p) for e in entries if "vocabulary_path" in e
            for p in range(e["vocabulary_parts"])]


def check_file_entry(entry: dict, where: str) -> None:
    """A file vocabulary's entry: a relative path inside the dataset, parts >= 1, ids >= 2, the hash."""
    path, parts, ids = entry.get("vocabulary_path"), entry.get("vocabulary_parts"), entry.get("ids")
    if not (isinstance(path, str) and path and not path.startswith("/") and ".." not in path.split("/")
            and isinstance(parts, int) and parts >= 1 and isinstance(ids, int) and ids >= 2
            and entry.get("hash") == HASH):
        raise DataError(f"{where} {entry.get('name')!r}: vocabulary_path {path!r}, vocabulary_parts {parts!r}, ids "
                        f"{ids!r}, hash {entry.get('hash')!r}; expected a relative path inside the dataset, parts "
                        f">= 1, ids >= 2 and hash {HASH!r}")


class FileVocabulary:
    """The ids of a column's values by its file vocabulary under `root` (the dataset's folder or URL). Each part is
    read once, when a value hashing to it is first looked up. Not a collective."""

    def __init__(self, entry: dict, root: str, where: str = "columns.categorical"):
        check_file_entry(entry, where)
        self.entry, self.root = entry, root
        self.parts: dict[int, object] = {}  # part -> its values (a pyarrow string array), in id order

    def __call__(self, texts) -> np.ndarray:
        """int64 ids of `texts` (a pyarrow string array, null where missing)."""
        import pyarrow as pa
        texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
        missing = texts.is_null().to_numpy(zero_copy_only=False)
        ids = np.full(len(texts), OUT_OF_VOCABULARY_ID, np.int64)
        part = parts_of(texts, self.entry["vocabulary_parts"])
        for p in np.unique(part[~missing]):
            rows = np.flatnonzero((part == p) & ~missing)
            values, first = self.part(int(p))
            found = vocabulary_ids(texts.take(pa.array(rows)), values)  # 2 + the place in the part, or 1
            ids[rows] = np.where(found >= 2, found + (first - 2), OUT_OF_VOCABULARY_ID)
        ids[missing] = MISSING_ID
        return ids

    def part(self, p: int):
        """(values of part `p` in id order, the id of its first value), read once."""
        if p not in self.parts:
            self.parts[p] = read_part(self.root, self.entry, p)
        return self.parts[p]

    def __getstate__(self):  # shipped to Spark's tasks without the parts it read
        return {**self.__dict__, "parts": {}}


def read_part(root: str, entry: dict, p: int):
    """(the values of part `p` of `entry`'s vocabulary under `root`, the id of the first), checked: the part's ids
    are consecutive; a part missing or of other columns is a DataError naming its file."""
    import pyarrow.parquet as pq
    relative = part_path(entry["vocabulary_path"], p)
    store = open_storage(root)
    try:
        with store.open(relative) as f:
            table = pq.read_table(f, columns=["value", "id"])
    except FileNotFoundError:
        raise DataError(f"{store.path(relative)}: no such file; expected part {p} of {entry['name']!r}'s vocabulary "
                        f"({entry['vocabulary_parts']} parts, written by mpitrain etl --vocabulary-files)") from None
    except Exception as e:  # pyarrow's ArrowInvalid, a missing column: not a vocabulary part
        raise DataError(f"{store.path(relative)}: {type(e).__name__}: {str(e)[:200]}; expected a Parquet part of "
                        f"columns {', '.join(PART_FIELDS)}") from None
    ids = table.column("id").to_numpy()
    first = int(ids[0]) if len(ids) else 2
    if len(ids) and not (np.array_equal(ids, np.arange(first, first + len(ids))) and first >= 2
                         and first + len(ids) <= entry["ids"]):
        raise DataError(f"{store.path(relative)}: ids {ids[:3].tolist()}..., expected consecutive ids inside "
                        f"2..{entry['ids'] - 1}")
    return table.column("value").combine_chunks(), first
