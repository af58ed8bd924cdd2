"""A table's columns fitted on the train split, as the manifest's `columns`, and the shards' rows encoded with them.

Numeric columns get their train mean and standard deviation (over the values present) for `--standardize`, and
their train mean as the value a missing one takes under `--numeric-missing impute`, with an indicator column
`COL_missing` for each column that misses values in the train split. Categorical columns get a vocabulary of the
values seen at least `--min-count` times in the train split, most frequent first (ties by their text), or hash
into `--hash-buckets`. Spark counts the values: each task counts its partition's train rows, the counts meet by
value hash in `reduceByKey`, and the driver takes only the vocabularies, after their sizes passed
`--max-vocabulary`. `TableTransforms` then maps the rows of each shard (`mpitrain.data.encoding.TableEncoder`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.encoding import HASH, TableEncoder, TableRows, text_hashes
from mpitrain.data.shards import MAX_IDS
from mpitrain.etl.transforms import Transforms
from mpitrain.etl.vocabulary_files import vocabulary_folder, write_part

NUMERIC_MISSING = ("bad", "impute")  # --numeric-missing: a missing number makes a bad record, or is imputed
MAX_VOCABULARY = 100_000  # --max-vocabulary's default: a larger vocabulary should be hashed


@dataclass(frozen=True)
class TableOptions:
    """How categorical columns become ids (the command line's --hash-buckets, --min-count, --max-vocabulary)."""

    hash_buckets: tuple[tuple[str, int], ...] = ()  # (COL, N): COL hashes into N buckets; ("", N): every other one
    # (the --categorical and --bag columns)
    min_count: int = 1  # a value seen fewer times in the train split is out of vocabulary (id 1)
    max_vocabulary: int = MAX_VOCABULARY  # a larger vocabulary fails the job, naming the column, unless:
    vocabulary_files: bool = False  # a larger vocabulary is written as Parquet parts beside the manifest

    def __post_init__(self):
        for column, buckets in self.hash_buckets:
            if not 1 <= buckets < MAX_IDS:
                raise ConfigError(f"--hash-buckets {column + ':' if column else ''}{buckets}: expected 1..{MAX_IDS - 1} "
                                  "buckets (ids 1..buckets; 0 is a missing value)")
        if self.min_count < 1:
            raise ConfigError(f"--min-count {self.min_count}: expected an integer >= 1")
        if not 1 <= self.max_vocabulary <= MAX_IDS - 2:
            raise ConfigError(f"--max-vocabulary {self.max_vocabulary}: expected 1..{MAX_IDS - 2} (ids 0 and 1 are "
                              "missing and out of vocabulary; ids are int32)")

    def check(self, categorical: tuple[str, ...]) -> None:
        """Every column --hash-buckets names is a `categorical` one (the --categorical and --bag columns)."""
        for column, buckets in self.hash_buckets:
            if column and column not in categorical:
                raise ConfigError(f"--hash-buckets {column}:{buckets}: {column!r} is not a --categorical or --bag "
                                  f"column ({', '.join(categorical) or 'there are none'})")

    def buckets(self, column: str) -> int:
        """The hash buckets of `column`; 0: it gets a vocabulary."""
        named = dict(self.hash_buckets)
        return named.get(column, named.get("", 0))


@dataclass
class NumericStats:
    """Per column: how many values are present, their mean and sum of squared deviations (merged by Chan's
    formula, exact to rounding for any split of the rows), and the rows."""

    rows: int
    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray) -> NumericStats:
        present = ~np.isnan(values)
        count = present.sum(axis=0)
        mean = np.where(present, values, 0).sum(axis=0) / np.maximum(count, 1)
        m2 = np.where(present, values - mean, 0) ** 2
        return cls(len(values), count, mean, m2.sum(axis=0))

    def merge(self, other: NumericStats) -> NumericStats:
        count = self.count + other.count
        delta = other.mean - self.mean
        weight = other.count / np.maximum(count, 1)
        return NumericStats(self.rows + other.rows, count, self.mean + delta * weight,
                            self.m2 + other.m2 + delta * delta * self.count * weight)

    @property
    def std(self) -> np.ndarray:
        """The population standard deviation (numpy's default), 1 where it is 0 or no value is present."""
        std = np.sqrt(self.m2 / np.maximum(self.count, 1))
        return np.where(std > 0, std, 1.0)


def _merge_counts(a, b):
    """Two (values, counts) of one column's values summed by value."""
    import pyarrow as pa
    table = pa.table({"value": pa.concat_arrays([a[0], b[0]]), "count": np.concatenate([a[1], b[1]])})
    summed = table.group_by("value").aggregate([("count", "sum")])
    return summed.column("value").combine_chunks(), summed.column("count_sum").to_numpy()


def _value_counts(rows: TableRows, columns: list[int], groups: int):
    """((column, group), (values, counts)) of the rows' categorical values, a group per value hash."""
    import pyarrow.compute as pc
    for j in columns:
        counted = pc.value_counts(rows.categorical[j].drop_null())
        values, counts = counted.field("values"), counted.field("counts").to_numpy(zero_copy_only=False)
        group = (text_hashes(values) % np.uint64(groups)).astype(np.int64)
        for g in np.unique(group):
            take = np.flatnonzero(group == g)
            yield (j, int(g)), (values.take(take), counts[take])


def vocabularies(train_rows, names: list[str], columns: list[int], options: TableOptions, spec: str,
                 root: str) -> dict:
    """{column index: its vocabulary (values seen at least --min-count times in the train rows, by descending count
    then text)} from an RDD of TableRows. A vocabulary over --max-vocabulary is one DataError naming the column, or
    with --vocabulary-files Parquet parts written into `root` by the tasks that counted their values (`file_parts`),
    given as its entry's fields."""
    import pyarrow as pa
    if not columns:
        return {}
    groups = max(1, train_rows.getNumPartitions())
    min_count = options.min_count

    def frequent(counted):
        values, counts = counted
        keep = np.flatnonzero(counts >= min_count)
        return values.take(pa.array(keep)), counts[keep]

    kept = train_rows.flatMap(lambda rows: _value_counts(rows, columns, groups)) \
        .reduceByKey(_merge_counts, groups).mapValues(frequent).persist()
    try:
        sizes = kept.map(lambda item: (item[0], len(item[1][1]))).collectAsMap()  # {(column, group): values}
        result = {}
        for j in columns:
            size = sum(n for (column, _), n in sizes.items() if column == j)
            if size <= options.max_vocabulary:
                continue
            if size > MAX_IDS - 2 or not options.vocabulary_files:
                more = f"more than the {MAX_IDS - 2} ids of a column; hash it (--hash-buckets {names[j]}:N)" \
                    if size > MAX_IDS - 2 else f"more than --max-vocabulary {options.max_vocabulary}; hash it " \
                    f"(--hash-buckets {names[j]}:N), raise --max-vocabulary or keep it in Parquet files beside " \
                    "the manifest (--vocabulary-files)"
                raise DataError(f"{spec}: categorical column {names[j]!r} has {size} distinct values in the train "
                                f"split (seen at least --min-count {min_count} times), {more}")
            result[j] = file_parts(kept, j, vocabulary_folder(names[j]), groups, sizes, root)
        in_files = set(result)
        parts = kept.filter(lambda item: item[0][0] not in in_files).collect()
    finally:
        kept.unpersist()
    for j in columns:
        if j in result:
            continue
        mine = [counted for (column, _), counted in parts if column == j]
        table = pa.table({"value": pa.concat_arrays([v for v, _ in mine]) if mine else pa.array([], pa.string()),
                          "count": np.concatenate([c for _, c in mine]) if mine else np.zeros(0, np.int64)})
        result[j] = table.sort_by([("count", "descending"), ("value", "ascending")]).column("value").to_pylist()
    return result


def file_parts(kept, column: int, folder: str, groups: int, sizes: dict, root: str) -> dict:
    """Write `column`'s vocabulary as Parquet parts, one per value-hash group of `kept` (the RDD of ((column, group),
    (values, counts))), each by the task that holds the group; parts of no values are written empty by the driver.
    Returns the entry's fields (`mpitrain.data.vocabulary_files`)."""
    import pyarrow as pa
    first, start = {}, 2
    for group in range(groups):
        first[group] = start
        start += sizes.get((column, group), 0)
    kept.filter(lambda item: item[0][0] == column) \
        .map(lambda item: write_part(root, folder, item[0][1], *item[1], first[item[0][1]])).collect()
    for group in range(groups):
        if (column, group) not in sizes:
            write_part(root, folder, group, pa.array([], pa.string()), np.zeros(0, np.int64), first[group])
    return {"ids": start, "vocabulary_path": folder, "vocabulary_parts": groups, "hash": HASH}


def vocabulary_entry(vocabulary: list | dict | None = None, min_count: int = 1, buckets: int = 0) -> dict:
    """How a categorical (or bag) column's manifest entry says its values become ids: its `vocabulary` (ids 2..;
    a dict: the fields of a file vocabulary), or its hash `buckets` (ids 1..buckets); id 0 is a missing value, 1 one
    out of vocabulary."""
    if buckets:
        return {"ids": buckets + 1, "hash_buckets": buckets, "hash": HASH}
    if isinstance(vocabulary, dict):
        return {**vocabulary, "min_count": min_count}
    return {"ids": len(vocabulary) + 2, "vocabulary": vocabulary, "min_count": min_count}


def fit_columns(train_rows, numeric: list[str], categorical: list[str], options: TableOptions, standardize: bool,
                impute: bool, spec: str, root: str) -> dict[str, list[dict]]:
    """The manifest's `columns` fitted on an RDD of the train split's TableRows (see the module docstring); file
    vocabularies are written into `root`, the folder (or staging URL) being written."""
    entries = [{"name": name} for name in numeric]
    indicators = []
    if numeric and (standardize or impute):
        stats = train_rows.map(lambda rows: NumericStats.of(rows.numeric)).reduce(NumericStats.merge)
        for j, entry in enumerate(entries):
            if standardize:
                entry.update(mean=float(stats.mean[j]), std=float(stats.std[j]))
            if impute:
                entry["impute"] = float(stats.mean[j])  # 0 for a column with no train value
                if stats.count[j] < stats.rows:
                    indicators.append({"name": f"{entry['name']}_missing", "missing_of": entry["name"]})
    hashed = {j: options.buckets(name) for j, name in enumerate(categorical) if options.buckets(name)}
    found = vocabularies(train_rows, categorical, [j for j in range(len(categorical)) if j not in hashed], options,
                         spec, root)
    groups = {"numeric": entries + indicators, "categorical": []}
    for j, name in enumerate(categorical):
        groups["categorical"].append({"name": name, **(vocabulary_entry(buckets=hashed[j]) if j in hashed else
                                                       vocabulary_entry(found[j], options.min_count))})
    return {group: columns for group, columns in groups.items() if columns}


def fit_bags(train_rows, names: list[str], options: TableOptions, spec: str, root: str) -> dict[str, dict]:
    """{bag column: its ids' entry (name, ids, and vocabulary or hash buckets)} fitted on an RDD of the train split's
    `SequenceRows` (`etl/bag_columns.py`): a vocabulary of the column's values as a categorical column's, or its
    --hash-buckets."""
    fitted = [name for name in names if not options.buckets(name)]
    texts = train_rows.map(lambda rows: TableRows(np.empty((len(rows), 0)),
                                                  [rows.sequences[name].values for name in fitted]))
    found = vocabularies(texts, fitted, list(range(len(fitted))), options, spec, root) if fitted else {}
    return {name: {"name": name, **(vocabulary_entry(found[fitted.index(name)], options.min_count) if name in fitted
                                    else vocabulary_entry(buckets=options.buckets(name)))} for name in names}


@dataclass
class TableTransforms(Transforms):
    """A table's `Transforms`: its parsed rows (`TableRows`) encoded by the fitted `columns` into float32 rows of
    x and integer rows of ids, fed to the model as stored (scale 1, offset 0); `--one-hot` as for any class
    target."""

    fitted: dict = field(default_factory=dict)

    def __post_init__(self):
        self.options = replace(self.options, scale=False, standardize=False)  # the columns standardize
        super().__post_init__()
        self.encoder = TableEncoder(self.fitted, self.root)

    @property
    def columns(self) -> dict:
        return self.fitted

    @property
    def feature_dtype(self) -> str:
        return "float32"

    @property
    def scale_offset(self) -> tuple[float, float]:
        return 1.0, 0.0

    def apply(self, x: TableRows, keys: np.ndarray) -> np.ndarray:
        return self.encoder.numbers(x)

    def apply_ids(self, x: TableRows) -> np.ndarray | None:
        return self.encoder.ids(x) if self.encoder.categorical else None
