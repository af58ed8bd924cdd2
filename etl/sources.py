"""ETL sources, chosen by the `--source` string: `idx:/folder`, `digits:`, `csv:PATH`, `parquet:PATH`, `images:/folder`.

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

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.config.domains import check_number
from mpitrain.data.sequences import MAX_LENGTH
from mpitrain.etl.idx import find_splits, read_records
from mpitrain.etl.records import ReadBatch, Target, checked_batch
from mpitrain.etl.sequence_columns import DEFAULT_MAX_LENGTH

KNOWN_SOURCES = ("idx:/folder (MNIST-format IDX files, plain or .gz)",
                 "digits: (scikit-learn's bundled 8x8 digits)",
                 "csv:PATH (file, folder or glob; label columns, numeric and categorical features)",
                 "parquet:PATH (label columns; numeric, numeric-array or categorical feature columns)",
                 "images:/folder (CLASS_NAME/*.png|jpg)")
READ_ROWS = 10000  # rows per read task of a source read by record ranges


MAX_CLASSES = 1 << 24  # --num-classes: a sane bound (a model's output layer has as many units)


@dataclass(frozen=True)
class SourceOptions:
    """Options of the csv, parquet and images sources (the command line's source options)."""

    test: str = ""  # a separate test split at this path, same kind and layout as the source
    label: str = ""  # csv, parquet: label columns, names or 0-based indices, comma-separated (default: csv the
    # first column, parquet "label")
    target: str = ""  # csv, parquet: class, binary, multilabel or regression; "": inferred (etl/tabular.py)
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
    sequences: tuple[str, ...] = ()  # parquet: columns of a sequence per record, stored ragged (docs/sequences.md)
    max_length: int = DEFAULT_MAX_LENGTH  # parquet: the most steps a sequence may have

    def __post_init__(self):
        check_number("--num-classes", self.num_classes, f"[0, {MAX_CLASSES}]", integer=True)
        check_number("--max-length", self.max_length, f"[1, {MAX_LENGTH}]", integer=True)


class Source(ABC):
    """Features stored as `feature_dtype`; `value * scale + offset` gives the float a model sees."""

    feature_dtype = "uint8"
    offset = 0.0
    splits: tuple[str, ...] = ("train", "test")
    class_names: list[str] = []
    keys: tuple[str, ...] = ()  # columns of `frame` that identify a record (none: scoring numbers the rows)
    target = Target()  # what the labels hold: class labels, unless a table source's --target says otherwise
    table = False  # a table's rows (`TableRows`, encoded after fitting: etl/tables.py), not plain features

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


class IdxSource(RangeSource):
    """An IDX folder with splits `train` and `test`; images become [1, rows, cols] scaled by 1/255."""

    def __init__(self, spec: str, folder: str):
        self.headers = find_splits(folder)
        train_images = self.headers["train"][0]
        for images, _ in self.headers.values():
            if images.row_shape != train_images.row_shape:
                raise DataError(f"{images.path}: images of shape {list(images.row_shape)}, expected "
                                f"{list(train_images.row_shape)} like {train_images.path}")
        super().__init__(spec, (1, *train_images.row_shape), 1 / 255, 10)

    def known_rows(self) -> dict[str, int]:
        return {split: images.count for split, (images, _) in self.headers.items()}

    def read_range(self, split, start, stop):
        images, labels = self.headers[split]
        x = read_records(images, start, stop).reshape(stop - start, *self.feature_shape)
        return checked_batch(x, read_records(labels, start, stop), self.num_classes, labels.path,
                             lambda i: start + i)


class DigitsSource(RangeSource):
    """scikit-learn's `load_digits` (1797 rows, values 0..16 scaled by 1/16); the job carves its test split."""

    splits = ("train",)

    def __init__(self, spec: str):
        super().__init__(spec, (1, 8, 8), 1 / 16, 10)

    def known_rows(self) -> dict[str, int]:
        return {"train": len(_load_digits().target)}

    def read_range(self, split, start, stop):
        digits = _load_digits()
        x = digits.images[start:stop].astype(np.uint8).reshape(stop - start, *self.feature_shape)
        return checked_batch(x, digits.target[start:stop], self.num_classes, "sklearn load_digits",
                             lambda i: start + i)


def _load_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("--source digits: needs scikit-learn (pip install scikit-learn)") from None
    return load_digits()


def carved_rows(name: str, fraction: float, rows: int) -> int:
    """Rows a `--NAME-fraction` carves from `rows`; both parts must be non-empty."""
    carved = round(rows * fraction) if 0 < fraction < 1 else 0
    if not 0 < carved < rows:
        raise ConfigError(f"--{name}-fraction {fraction}: gives {carved} of {rows} rows to the {name} split, "
                          "expected a fraction leaving both splits non-empty")
    return carved


def open_source(spec: str, test_fraction: float = 0.2, options: SourceOptions = SourceOptions()) -> Source:
    """Parse `--source` and open it (headers validated, no rows read).

    A source without a test split whose rows are known has `test_fraction` checked here.
    """
    from mpitrain.etl.images import ImageFolderSource
    from mpitrain.etl.tabular import CsvSource, ParquetSource

    scheme, _, argument = spec.partition(":")
    kinds = {"csv": CsvSource, "parquet": ParquetSource, "images": ImageFolderSource}
    if scheme == "idx" and argument:
        source = IdxSource(spec, os.path.abspath(argument))  # tasks may run elsewhere, in another folder
    elif scheme == "digits" and not argument:
        source = DigitsSource(spec)
    elif scheme in kinds and argument:
        source = kinds[scheme](spec, argument, options)
    else:
        raise ConfigError(f"--source {spec!r}: expected one of: {'; '.join(KNOWN_SOURCES)}")
    if options.test and scheme not in kinds:
        raise ConfigError(f"--test {options.test}: only csv, parquet and images sources take a separate test split")
    if "test" not in source.splits and source.known_rows():
        carved_rows("test", test_fraction, source.known_rows()["train"])
    return source
