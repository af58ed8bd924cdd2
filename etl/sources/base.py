"""What every ETL source is (`Source`, `RangeSource`), its options (`SourceOptions`) and the path helpers they share;
each source is a file of this folder, registered in `mpitrain.etl.sources` (`__init__.py`).

A source says how its features are stored (shape, dtype, scale/offset to floats), which
splits it has (a source without `test` gets one carved by the job), and reads a split as an
RDD of `ReadBatch`es: numpy blocks of good rows with the bad records counted. The driver
never holds the data. Sources are pickled into tasks.

Scoring (`etl/scoring.py`) reads a split as a DataFrame of records (`frame`) and turns each
Arrow record batch of it into a ReadBatch itself (`convert`), keeping the `keys` columns
that identify each record; the ETL's `read` is the same two steps.
"""
from __future__ import annotations

import os
import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from mpitrain.base.domains import check_number
from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.sequences import MAX_LENGTH
from mpitrain.etl.records import ReadBatch, Target
from mpitrain.etl.sequence_columns import DEFAULT_MAX_LENGTH

READ_ROWS = 10000  # rows per read task of a source read by record ranges


MAX_CLASSES = 1 << 24  # --num-classes: a sane bound (a model's output layer has as many units)


@dataclass(frozen=True)
class SourceOptions:
    """Options of the csv, parquet and images sources (the command line's source options)."""

    test: str = ""  # a separate test split at this path, same kind and layout as the source
    label: str = ""  # csv, parquet: label columns, names or 0-based indices, comma-separated (default: csv the
    # first column, parquet "label")
    target: str = ""  # csv, parquet: class, binary, multilabel or regression; "": inferred (etl/sources/table.py)
    header: bool = True  # csv: the first line names the columns
    features: tuple[str, ...] = ()  # csv, parquet: feature columns (default: all but the labels and keys)
    categorical: tuple[str, ...] = ()  # csv, parquet: columns of strings or integers that become ids (a table)
    numeric_missing: str = "bad"  # csv, parquet: a missing number makes a bad record, or is imputed ("impute")
    feature_shape: tuple[int, ...] = ()  # csv, parquet: shape of one row's features (default: flat)
    feature_dtype: str = "float32"  # csv, parquet: stored dtype, float32 or uint8 (integers 0..255)
    num_classes: int = 0  # csv, parquet: 0 means the largest label + 1
    image_size: tuple[int, ...] = ()  # images: (height, width) every image is resized to
    color: str = "gray"  # images: gray (1 channel) or rgb (3 channels)
    labeled: bool = True  # csv, parquet, images: records carry a label (scoring reads unlabeled ones too)
    keys: tuple[str, ...] = ()  # parquet: columns that identify a record, copied into scoring's output
    class_names: tuple[str, ...] = ()  # images: the class folders in class order (default: the sorted sub-folders);
    # csv, parquet: the classes of text labels (default: their sorted distinct values)
    columns: dict | None = None  # csv, parquet (scoring): a table model's columns (its manifest's): the records'
    # columns it reads, encoded into its rows (`mpitrain.data.encoding.TableEncoder`)
    dataset: str | None = None  # scoring: the model's dataset, where its columns' file vocabularies lie
    sequences: tuple[str, ...] = ()  # parquet: columns of a sequence per record, stored ragged (docs/sequences.md)
    max_length: int = DEFAULT_MAX_LENGTH  # parquet: the most steps a sequence may have (csv, parquet: values a bag)
    bags: tuple[str, ...] = ()  # csv, parquet: columns of a list of categorical values per record (etl/bag_columns.py)
    bag_delimiter: str = "|"  # csv: what separates a bag's values in its cell

    def __post_init__(self):
        check_number("--num-classes", self.num_classes, f"[0, {MAX_CLASSES}]", integer=True)
        check_number("--max-length", self.max_length, f"[1, {MAX_LENGTH}]", integer=True)
        if len(self.bag_delimiter) != 1 or self.bag_delimiter in ',"\n\r':
            raise ConfigError(f"--bag-delimiter {self.bag_delimiter!r}: expected one character other than the CSV "
                              "field separator ',', a quote or a line break")


class Source(ABC):
    """Features stored as `feature_dtype`; `value * scale + offset` gives the float a model sees."""

    feature_dtype = "uint8"
    offset = 0.0
    splits: tuple[str, ...] = ("train", "test")
    class_names: list[str] = []
    keys: tuple[str, ...] = ()  # columns of `frame` that identify a record (none: scoring numbers the rows)
    target = Target()  # what the labels hold: class labels, unless a table source's --target says otherwise
    table = False  # a table's rows (`TableRows`, encoded after fitting: etl/tables.py), not plain features
    # What the source is and can do, asked instead of its `--source` scheme (`mpitrain.etl.sources.SOURCES`):
    scheme = ""  # the `--source` scheme, `SCHEME:ARGUMENT`
    usage = ""  # `--source`'s form and a few words, for the list of known sources
    takes_path = True  # the argument is a path (digits: none)
    separate_test = False  # takes `--test PATH`: a test split of its own
    unlabeled_records = False  # its records may come without labels (scoring's --no-label)
    key_columns = False  # records carry columns that identify them (scoring's --keys)
    tabular = False  # records of named columns: label columns, a table model's columns
    typed_columns = False  # its columns have types of their own (parquet); else every column is parsed as text

    @classmethod
    def open(cls, spec: str, argument: str, options: SourceOptions) -> Source:
        """The source of `--source SCHEME:ARGUMENT`, headers validated, no rows read."""
        return cls(spec, argument, options)

    def __init__(self, spec: str, feature_shape: tuple[int, ...], scale: float, num_classes: int | None):
        self.spec = spec
        self.feature_shape = feature_shape
        self.scale = scale
        self.num_classes = num_classes  # None: the largest label seen + 1

    def connect(self, spark) -> None:
        """Learn what only Spark can tell (columns, feature shape); called before `read`."""

    def known_rows(self) -> dict[str, int] | None:
        """Records per split when known without reading them (for checks before Spark starts)."""
        return None

    def empty_rows(self):
        """(x, y) of no rows, as `read`'s batches hold them."""
        return np.empty((0, *self.feature_shape), self.feature_dtype), np.empty(0, np.int32)

    def read(self, spark, split: str):
        """The records of `split` as an RDD of ReadBatch."""
        return dataframe_batches(self.frame(spark, split), lambda batch: self.convert(split, batch))

    @abstractmethod
    def frame(self, spark, split: str):
        """The records of `split` as a DataFrame (raw: lines, files, columns), the `keys` columns included."""

    @abstractmethod
    def convert(self, split: str, batch) -> ReadBatch:
        """A pyarrow RecordBatch of `frame`'s records -> their good rows, bad ones counted (in a task)."""


class RangeSource(Source):
    """A source read by record ranges, `READ_ROWS` records per task; as a DataFrame, its record numbers `row`."""

    keys = ("row",)

    @abstractmethod
    def known_rows(self) -> dict[str, int]:
        """Records per split."""

    @abstractmethod
    def read_range(self, split: str, start: int, stop: int) -> ReadBatch:
        """Records [start, stop) of `split`."""

    def read(self, spark, split):
        n = self.known_rows()[split]
        ranges = [(start, min(start + READ_ROWS, n)) for start in range(0, n, READ_ROWS)]
        return spark.sparkContext.parallelize(ranges, len(ranges)).map(lambda r: self.read_range(split, *r))

    def frame(self, spark, split):
        n = self.known_rows()[split]
        return spark.range(0, n, numPartitions=max(1, -(-n // READ_ROWS))).withColumnRenamed("id", "row")

    def convert(self, split, batch):
        """The records numbered in `batch` (consecutive: a range's partition cut into Arrow batches in order)."""
        rows = batch.column(0).to_numpy()
        if not len(rows):
            return self.read_range(split, 0, 0)
        if rows[-1] - rows[0] + 1 != len(rows):
            raise ValueError(f"{self.spec}: record numbers {rows[0]}..{rows[-1]} of a batch are not consecutive")
        return self.read_range(split, int(rows[0]), int(rows[-1]) + 1)


def dataframe_batches(frame, convert):
    """An RDD of `convert(pyarrow.RecordBatch) -> ReadBatch` over a DataFrame: Arrow in, numpy blocks out.

    Spark hands each Python task whole Arrow record batches (no Python row objects); the
    ReadBatch goes back pickled, one binary value per record batch.
    """
    def run(batches):
        import pyarrow as pa
        for batch in batches:
            data = pickle.dumps(convert(batch), protocol=pickle.HIGHEST_PROTOCOL)
            yield pa.RecordBatch.from_arrays([pa.array([data], pa.binary())], ["batch"])

    return frame.mapInArrow(run, "batch binary").rdd.map(lambda row: pickle.loads(row.batch))


def split_paths(spec: str, path: str, options: SourceOptions) -> dict[str, str]:
    """{"train": path} and, with `--test PATH`, {"test": PATH}: each checked to exist."""
    paths = {"train": check_path(spec, path)}
    if options.test:
        paths["test"] = check_path(f"--test {options.test}", options.test)
    return paths


def source_paths(spec: str, options: SourceOptions) -> list[str]:
    """The local paths (folders, files, globs; absolute) `--source` and `--test` read."""
    argument = spec.partition(":")[2]
    return [os.path.abspath(path) for path in (argument, options.test) if path and "://" not in path]


def check_path(spec: str, path: str) -> str:
    """`path` made absolute when it is a local path (tasks may run in another folder); it must exist."""
    if "://" in path:
        return path
    path = os.path.abspath(path)
    import glob
    if not glob.glob(path):
        raise DataError(f"{spec}: {path} does not exist")
    return path


def carved_rows(name: str, fraction: float, rows: int) -> int:
    """Rows a `--NAME-fraction` carves from `rows`; both parts must be non-empty."""
    carved = round(rows * fraction) if 0 < fraction < 1 else 0
    if not 0 < carved < rows:
        raise ConfigError(f"--{name}-fraction {fraction}: gives {carved} of {rows} rows to the {name} split, "
                          "expected a fraction leaving both splits non-empty")
    return carved


