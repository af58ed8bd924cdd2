"""Table sources read by Spark: `csv:PATH` and `parquet:PATH` (a file, a folder of parts, or a glob).

One or several label columns (`--label`) hold the target (`--target` class, binary, multilabel or regression;
inferred from the first records where not stated); the features are the other columns, or `--features`. Plain
features are numbers (Parquet: also arrays of numbers, such as a flattened image), stored as they are. A table
(`--categorical` columns, or `--numeric-missing impute`) is read into `TableRows` instead: its numbers and its
categorical columns' text, which the job encodes once it has fitted them on the train split (`etl/tables.py`,
`mpitrain.data.encoding`). Scoring reads a table model's records by its columns (`SourceOptions.columns`, the
manifest's): the columns it reads must be there, and each batch's good records are encoded into the model's rows at
once (`TableEncoder`). Records reach Python as Arrow record batches, never as row objects.

Where the files are local, the columns, the labels' kind and the target are found before Spark starts (the CSV
header and first lines, the Parquet schema and first rows), so a wrong option fails within seconds; otherwise
Spark finds them when the job connects. Text class labels get their classes from one Spark pass over the label
column: the sorted distinct values, which become the manifest's `class_names`.
"""
from __future__ import annotations

import gzip
import itertools
import math
import os

import numpy as np

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.encoding import TableEncoder, TableRows, column_kind, numeric_values, parse_table
from mpitrain.data.sequences import Ragged, SequenceRows
from mpitrain.data.shards import FEATURE_DTYPES, TARGETS
from mpitrain.etl.records import BadRecords, ReadBatch, Target, checked_batch
from mpitrain.etl.sequence_columns import ragged_column, step_features
from mpitrain.etl.sources import Source, SourceOptions, split_paths
from mpitrain.etl.tables import NUMERIC_MISSING

SAMPLE = 100  # the first records, whose labels decide a target that --target leaves open
MAX_CLASSES = 10_000  # distinct text labels a class target may have
NUMERIC_KINDS = ("integer", "number", "boolean", "null")


def _column(name: str):
    from pyspark.sql.functions import col
    return col(f"`{name}`")


def _describe(label, features: np.ndarray) -> str:
    """A row by its leading values, e.g. '7,0,0,12,...' (label first, if any), to find it with grep."""
    leading = ",".join(f"{v:g}" for v in ([] if label is None else [label]) + list(features[:4]))
    return f"'{leading}{',...' if len(features) > 4 else ''}'"


def _label_kind(values) -> tuple[str, bool]:
    """The kind of a label column's sampled values (text, integer or number) and whether all are 0 or 1."""
    kind, zero_one = "integer", True
    for value in values:
        if isinstance(value, str):
            try:
                value = float(value) if value.strip() else None
            except ValueError:
                return "text", False
        if value is None or not math.isfinite(value):
            continue
        kind = kind if value == int(value) else "number"
        zero_one &= value in (0, 1)
    return kind, zero_one


HADOOP_CODECS = (".bz2", ".xz", ".zst", ".lz4", ".snappy", ".deflate")  # Spark reads them; Python here does not


def _check_rows(files: list[str], path: str, header: bool) -> None:
    """A DataError naming the file (or `path`, for several) when no local CSV file at `path` holds a line of values
    (after its header line, with `header`): found before Spark starts, not as "0 classes" after it ran."""
    def lines(name: str) -> int:  # non-empty lines, up to 2
        if name.endswith(HADOOP_CODECS):
            return 2
        with (gzip.open if name.endswith(".gz") else open)(name, "rt", encoding="utf-8", errors="replace") as f:
            return len(list(itertools.islice((line for line in f if line.strip()), 2)))
    found = [lines(name) for name in files]
    if files and max(found) <= int(header):
        what = "only a header line" if max(found) else "empty"
        raise DataError(f"{files[0]}: no data rows ({what}); expected rows of values" if len(files) == 1 else
                        f"{path}: no data rows in its {len(files)} files ({what}); expected rows of values")


def _local_files(path: str) -> list[str]:
    """The files Spark reads at a local path (a file, a folder's visible files at any depth, a glob), sorted."""
    import glob
    files = []
    for match in sorted(glob.glob(path)):
        if os.path.isdir(match):
            for root, folders, names in os.walk(match):
                folders[:] = sorted(f for f in folders if not f.startswith(("_", ".")))
                files += [os.path.join(root, n) for n in sorted(names) if not n.startswith(("_", "."))]
        else:
            files.append(match)
    return files


class TableSource(Source):
    """What CSV and Parquet share: the split paths, the label and feature columns, the target, a table's columns.

    The columns are resolved (`_resolve`) from the column names, their kinds where the format has types, and a
    sample of the first records: before Spark starts for local files, else in `connect`.
    """

    default_label = "0"
    holds_sequences = False  # whether the format has list columns (`--sequence`)

    def __init__(self, spec: str, path: str, options: SourceOptions):
        self.paths = split_paths(spec, path, options)
        self.splits = tuple(self.paths)
        if options.feature_dtype not in FEATURE_DTYPES:
            raise ConfigError(f"--feature-dtype {options.feature_dtype}: expected one of {FEATURE_DTYPES}")
        if options.target not in ("", *TARGETS):
            raise ConfigError(f"--target {options.target}: expected one of {', '.join(TARGETS)}")
        if options.numeric_missing not in NUMERIC_MISSING:
            raise ConfigError(f"--numeric-missing {options.numeric_missing}: expected one of "
                              f"{', '.join(NUMERIC_MISSING)}")
        self.options = options
        self.encoder = TableEncoder(options.columns) if options.columns else None  # a table model's (scoring)
        if self.encoder and (options.features or options.categorical):
            raise ConfigError("--features: a table model reads the columns it was trained on "
                              f"({', '.join(self.encoder.numeric + self.encoder.categorical)}); expected no --features")
        self.table = bool(options.categorical) or options.numeric_missing == "impute" or self.encoder is not None
        if self.table and (options.feature_shape or options.feature_dtype != "float32"):
            raise ConfigError("--feature-shape and --feature-dtype: a table (--categorical, --numeric-missing "
                              "impute) stores one float32 row of its columns, expected neither")
        self.feature_dtype = options.feature_dtype
        if options.sequences and not self.holds_sequences:
            raise ConfigError(f"--sequence: sequence columns are read from a parquet: source, not {spec}")
        if options.sequences and (self.table or options.feature_shape or options.feature_dtype != "float32"):
            raise ConfigError("--sequence: a dataset of sequences stores its sequences and numeric --features as "
                              "float32, expected no --categorical, --numeric-missing impute, --feature-shape or "
                              "--feature-dtype")
        super().__init__(spec, (), 1.0, options.num_classes or None)
        if self.num_classes is not None and self.num_classes < 2:
            raise ConfigError(f"--num-classes {self.num_classes}: expected at least 2")
        self.resolved = False
        self.text_labels = False
        local = None if "://" in self.paths["train"] else self._inspect_local()
        if local is not None:
            self._resolve(*local)

    def connect(self, spark) -> None:
        if not self.resolved:
            self._resolve(*self._inspect_spark(spark))
        if self.text_labels and not self.target.class_names:
            names = tuple(self.options.class_names) or self._label_texts(spark)
            self.target = Target("class", self.target.columns, len(names), names)
            self.num_classes, self.class_names = len(names), list(names)

    def _inspect_local(self):
        """(columns, {column: kind}, {label column: sampled values}) from a local file, or None: Spark finds them."""
        raise NotImplementedError

    def _inspect_spark(self, spark):
        raise NotImplementedError

    def _label_texts(self, spark) -> tuple[str, ...]:
        """The sorted distinct values of a text class label column over every split (one Spark pass)."""
        raise NotImplementedError

    def _names(self, option: str, text: str, columns: list[str], indices: bool) -> list[str]:
        """The column names a comma-separated option gives (names, or 0-based indices where `indices`)."""
        names = []
        for part in text.split(","):
            name = part.strip()
            if name not in columns and indices and name.isdigit() and int(name) < len(columns):
                name = columns[int(name)]
            if name not in columns:
                raise ConfigError(f"{option} {text}: no column {name!r} in {self.spec}; expected "
                                  f"{'a name or a 0-based index' if indices else 'a name'} of "
                                  f"{columns[:20]}{' ...' if len(columns) > 20 else ''}")
            names.append(name)
        if len(set(names)) < len(names):
            raise ConfigError(f"{option} {text}: names a column twice")
        return names

    def _resolve(self, columns: list[str], kinds: dict[str, str], sample: dict[str, list]) -> None:
        """Labels, keys, features (numeric and categorical) and the target, checked against the source's columns."""
        options = self.options
        self.source_columns, self.column_kinds = columns, kinds
        self.labels = self._names("--label", options.label or self.default_label, columns, True) \
            if options.labeled else []
        self.keys = tuple(self._names("--keys", ",".join(options.keys), columns, False)) if options.keys else ()
        self.sequences = self._names("--sequence", ",".join(options.sequences), columns, False) \
            if options.sequences else []
        if self.encoder:
            features, categorical = self._model_columns(columns)
        else:
            categorical = self._names("--categorical", ",".join(options.categorical), columns, False) \
                if options.categorical else []
            features = self._names("--features", ",".join(options.features), columns, True) if options.features \
                else [] if self.sequences else [c for c in columns if c not in self.labels and c not in self.keys]
        for name in self.sequences:
            if name in self.labels or name in features or name in categorical:
                raise ConfigError(f"--sequence {name}: {name!r} is also a label, feature or categorical column")
        for name in categorical:
            if name in self.labels:
                raise ConfigError(f"--categorical {name}: {name!r} is a --label column")
        self.categorical = categorical
        self.features = [c for c in features if c not in categorical and c not in self.labels]
        if not self.features and not categorical and not self.sequences:
            raise ConfigError(f"{self.spec}: no feature columns besides the labels and keys (columns: {columns})")
        if self.table:
            taken = [f"{c}_missing" for c in self.features if f"{c}_missing" in columns]
            if options.numeric_missing == "impute" and taken:
                raise ConfigError(f"--numeric-missing impute: adds the indicator column {taken[0]!r}, but {self.spec} "
                                  "has a column of that name")
        self._check_kinds(kinds)
        self.target = self._target(sample)
        if self.encoder:
            self.feature_shape = (self.encoder.width,)
        self.resolved = True

    def _model_columns(self, columns: list[str]) -> tuple[list[str], list[str]]:
        """The numeric and categorical columns a table model reads (its encoder's), each one of the source's and
        none a label column."""
        numeric, categorical = self.encoder.numeric, self.encoder.categorical
        missing = [c for c in numeric + categorical if c not in columns]
        if missing:
            raise ConfigError(f"{self.spec}: no column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}, "
                              f"which the model reads (numeric {numeric}, categorical {categorical}); the source has "
                              f"{columns[:20]}{' ...' if len(columns) > 20 else ''}")
        for name in numeric + categorical:
            if name in self.labels:
                raise ConfigError(f"--label {self.options.label or self.default_label}: {name!r} is a column the "
                                  "model reads, not a label")
        return list(numeric), list(categorical)

    def _check_kinds(self, kinds: dict[str, str]) -> None:
        """Where the format has types: features are numbers (plain features: also arrays), categorical columns
        strings or integers."""
        if not kinds:
            return
        wanted = {**{name: NUMERIC_KINDS + (() if self.table or self.sequences else ("array",))
                     for name in self.features},
                  **{name: ("string", "integer", "boolean", "null") for name in self.categorical},
                  **{name: ("array",) for name in self.sequences}}
        for name, allowed in wanted.items():
            if kinds[name] not in allowed:
                what = "strings or integers (a categorical column)" if name in self.categorical else \
                    "a list of numbers per record (a --sequence column)" if name in self.sequences else \
                    "numbers" + ("" if self.table else " or arrays of numbers") + \
                    (" (or name it in --categorical)" if kinds[name] == "string" else "")
                raise ConfigError(f"{self.spec}: column {name!r} is {kinds[name]}; expected {what} "
                                  f"(columns: {self.source_columns})")

    def _target(self, sample: dict[str, list]) -> Target:
        """The stated or inferred target (docs/etl.md#labels-and-targets), checked against the label columns."""
        options, labels = self.options, self.labels
        if not labels:
            return Target(options.target or "class", (), self.num_classes)
        found = {name: _label_kind(sample.get(name, ())) for name in labels}
        text = [name for name in labels if found[name][0] == "text"]
        kind = options.target
        if not kind:
            if len(labels) == 1:
                kind = "regression" if found[labels[0]][0] == "number" else "class"
            elif text:
                raise ConfigError(f"--label {','.join(labels)}: column {text[0]!r} holds text; several label columns "
                                  "hold numbers: 0 or 1 (--target multilabel) or any (--target regression)")
            else:
                kind = "multilabel" if all(zero_one for _, zero_one in found.values()) else "regression"
        needs = {"class": (1, 1, "one label column"), "binary": (1, 1, "one label column"),
                 "multilabel": (2, None, "two or more label columns"), "regression": (1, None, "label columns")}
        low, high, what = needs[kind]
        if not low <= len(labels) <= (high or len(labels)):
            raise ConfigError(f"--target {kind}: expected {what}, --label gives {len(labels)} ({','.join(labels)})")
        if kind != "class" and options.num_classes:
            raise ConfigError(f"--num-classes {options.num_classes}: only a class target has classes, this one is "
                              f"{kind}")
        self.text_labels = kind == "class" and bool(text)
        if self.text_labels and options.num_classes and not options.class_names:  # scoring: the model's classes
            raise ConfigError(f"--num-classes {options.num_classes}: the label column {labels[0]!r} holds text; its "
                              "distinct values are the classes")
        return Target(kind, tuple(labels), self.num_classes if kind == "class" else None)

    def _shape(self, width: int) -> tuple[int, ...]:
        shape = self.options.feature_shape or (width,)
        if int(np.prod(shape)) != width:
            raise ConfigError(f"--feature-shape {','.join(map(str, shape))}: holds {int(np.prod(shape))} values, "
                              f"expected {width} (the feature values of a row of {self.spec})")
        return tuple(shape)

    def empty_rows(self):
        x, y = super().empty_rows()
        if self.target.kind != "class":
            y = np.empty((0, len(self.labels)), np.float32)
        if self.sequences:
            return SequenceRows(np.empty((0, len(self.features)), np.float32),
                                {name: Ragged.empty(self.step_features[name]) for name in self.sequences}), y
        return (TableRows.empty(len(self.features), len(self.categorical)) if self.table and not self.encoder
                else x), y

    def _table_batch(self, split: str, records, labels: list, seen: int, bad: BadRecords, positions: np.ndarray,
                     record) -> ReadBatch:
        """Records (a pyarrow Table or RecordBatch of named columns) of a table -> TableRows of the good ones (a
        table model's rows of them, encoded)."""
        where = self.paths[split]
        y, label_ok = np.full(len(positions), -1, np.int32), np.ones(len(positions), bool)
        if labels:
            y, label_ok, describe = self.target.check(labels, where, record)
            bad.add(np.flatnonzero(~label_ok), describe)
        imputed = self.features if self.options.numeric_missing == "impute" else ()
        parsed = self.encoder.parse(records) if self.encoder else \
            parse_table(records, self.features, self.categorical, imputed)
        bad.add(np.flatnonzero(label_ok & parsed.bad), lambda i: f"{where}: {parsed.problem(i)} at record {record(i)}")
        good = label_ok & ~parsed.bad
        rows = parsed.rows[good]
        return ReadBatch(self.encoder.encode_rows(rows) if self.encoder else rows, y[good], seen, bad, positions[good])


class CsvSource(TableSource):
    """CSV with label columns (`--label`, default the first) and numeric features, or a table's columns;
    `--no-header` without names (columns `_c0`, `_c1`, ...).

    Spark reads the files as lines (splitting large files across tasks); each task parses its Arrow batch of
    lines at once with pyarrow's C++ CSV reader, numbers as float64 and text columns (categorical ones, text
    labels) as strings. Lines with too few or too many fields are bad records. An empty field is missing. Text
    where a number belongs makes the block parse again with every column as text, to find the records it is in.
    """

    def _inspect_local(self):
        files = _local_files(self.paths["train"])
        if not files:
            raise DataError(f"{self.spec}: no files at {self.paths['train']}")
        for split, path in self.paths.items():
            _check_rows(files if split == "train" else _local_files(path), path, self.options.header)
        if files[0].endswith(HADOOP_CODECS):
            return None  # a codec only Hadoop's readers know: Spark reads the first lines
        opener = gzip.open if files[0].endswith(".gz") else open
        with opener(files[0], "rt", encoding="utf-8", errors="replace") as f:
            lines = list(itertools.islice((line.rstrip("\r\n") for line in f if line.strip()), SAMPLE + 1))
        return self._lines_schema(lines)

    def _inspect_spark(self, spark):
        lines = spark.read.text(self.paths["train"]).where("value != ''").limit(SAMPLE + 1).collect()
        return self._lines_schema([row.value for row in lines])

    def _lines_schema(self, lines: list[str]):
        import pyarrow as pa
        import pyarrow.csv as pcsv
        if not lines:
            raise DataError(f"{self.spec}: no lines; expected a header or rows of values")
        width = lines[0].count(",") + 1  # at least the fields; pyarrow finds how many there are
        first = pcsv.read_csv(pa.py_buffer((lines[0] + "\n").encode()),
                              read_options=pcsv.ReadOptions(autogenerate_column_names=True, use_threads=False),
                              convert_options=pcsv.ConvertOptions(column_types={f"f{i}": pa.string()
                                                                                for i in range(width)}))
        fields = [first.column(i)[0].as_py() or "" for i in range(first.num_columns)]
        self.header_line = lines[0] if self.options.header else None
        columns = [f.strip() for f in fields] if self.options.header else [f"_c{i}" for i in range(len(fields))]
        self.columns = columns
        rows = lines[1:] if self.options.header else lines
        table = self._parse(rows, {}, columns, text=True)
        return columns, {}, {name: table.column(str(columns.index(name))).to_pylist() for name in columns}

    def _resolve(self, columns, kinds, sample):
        super()._resolve(columns, kinds, sample)
        if not self.table:
            self.feature_shape = self._shape(len(self.features))

    def frame(self, spark, split):
        return spark.read.text(self.paths[split])

    def _parse(self, lines: list[str], malformed: dict[int, str], columns: list[str] | None = None,
               text: bool = False):
        """Lines -> a pyarrow Table of the columns used, named by their index; lines of the wrong width go to
        `malformed` (index in `lines` -> the line). Numbers are float64 unless `text`; strings stay strings."""
        import pyarrow as pa
        import pyarrow.csv as pcsv
        columns = columns or self.columns
        names = [str(i) for i in range(len(columns))]
        used = names if text else list(dict.fromkeys(str(columns.index(c))
                                                      for c in [*self.labels, *self.features, *self.categorical]))
        strings = {str(columns.index(c)) for c in self.categorical} if not text else set(names)
        if self.text_labels:
            strings.add(str(columns.index(self.labels[0])))

        def skip(row):
            malformed[row.number - 1] = row.text
            return "skip"

        def parse(types):
            return pcsv.read_csv(pa.py_buffer(("\n".join(lines) + "\n").encode()),
                                 read_options=pcsv.ReadOptions(column_names=names, use_threads=False),
                                 parse_options=pcsv.ParseOptions(invalid_row_handler=skip),
                                 convert_options=pcsv.ConvertOptions(column_types=types, include_columns=used,
                                                                     null_values=[""], strings_can_be_null=True))
        if not lines:
            return pa.table({name: pa.array([], pa.string()) for name in used})
        try:
            return parse({n: pa.string() if n in strings else pa.float64() for n in used})
        except pa.ArrowInvalid:  # text where a number belongs: every column as text, numbers converted later
            malformed.clear()
            return parse({n: pa.string() for n in used})

    def convert(self, split: str, batch) -> ReadBatch:
        all_lines = batch.column(0).to_pylist()
        positions = [i for i, line in enumerate(all_lines) if line and line != self.header_line]
        lines = [all_lines[i] for i in positions]
        malformed = {}  # index in `lines` -> the line
        table = self._parse(lines, malformed)
        bad = BadRecords()
        texts = list(malformed.values())
        expected = f"{len(self.columns)} {'fields' if self.table else 'numbers'} separated by commas"
        bad.add(np.arange(len(texts)), lambda i: f"{self.paths[split]}: malformed line {texts[i][:80]!r}, "
                                                 f"expected {expected}")
        parsed = np.array([p for i, p in enumerate(positions) if i not in malformed], np.int64)
        kept = [line for i, line in enumerate(lines) if i not in malformed]
        index = {name: str(self.columns.index(name)) for name in self.columns}
        labels = [table.column(index[name]) for name in self.labels]
        if self.table:
            records = table.rename_columns([self.columns[int(n)] for n in table.column_names])
            return self._table_batch(split, records, labels, len(lines), bad, parsed,
                                     lambda i: repr(kept[i][:60] + ("..." if len(kept[i]) > 60 else "")))
        values = [numeric_values(table.column(index[name]), name) for name in self.features]
        x = np.column_stack([v for v, _ in values]) if values else np.zeros((len(kept), 0))
        text = np.logical_or.reduce([unparsable for _, unparsable in values]) if values else np.zeros(len(kept), bool)
        bad.add(np.flatnonzero(text), lambda i: f"{self.paths[split]}: malformed line {kept[i][:80]!r}, "
                                                f"expected {expected}")
        keep = np.flatnonzero(~text)
        first = numeric_values(labels[0], self.labels[0])[0][keep] if labels and not self.text_labels else None
        batch = checked_batch(x[keep].astype(np.float32).reshape(len(keep), *self.feature_shape),
                              [label.take(keep) for label in labels] if labels else None, self.num_classes,
                              self.paths[split], lambda i: _describe(None if first is None else first[i], x[keep[i]]),
                              bad, self.feature_dtype, parsed[keep], self.target)
        batch.seen = len(lines)
        return batch

    def _label_texts(self, spark) -> tuple[str, ...]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from mpitrain.data.encoding import category_text
        label = str(self.columns.index(self.labels[0]))

        def distinct(batches):
            for batch in batches:
                lines = [line for line in batch.column(0).to_pylist() if line and line != self.header_line]
                values = category_text(self._parse(lines, {}).column(label).combine_chunks(), self.labels[0])
                yield pa.RecordBatch.from_arrays([pc.unique(values.drop_null())], ["value"])

        frames = [self.frame(spark, split) for split in self.splits]
        frame = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
        return _checked_classes(self, frame.mapInArrow(distinct, "value string").distinct())


class ParquetSource(TableSource):
    """Parquet with label columns (`--label`, default `label`) and `--features` columns (default: the rest), or a
    table's columns.

    A plain feature column holds numbers or arrays of numbers (a flattened image); every array must
    have the length of the first row's, else the record is bad. A table's numeric columns hold numbers (null or
    NaN: missing), its categorical ones strings or integers.
    """

    default_label = "label"
    holds_sequences = True

    def _inspect_local(self):
        import pyarrow.dataset as ds
        files = _local_files(self.paths["train"])
        if not files:
            raise DataError(f"{self.spec}: no files at {self.paths['train']}")
        try:
            dataset = ds.dataset(files, format="parquet")
            schema = dataset.schema
            for split, path in self.paths.items():  # the files' footers count their rows
                split_files = files if split == "train" else _local_files(path)
                if split_files and not ds.dataset(split_files, format="parquet").count_rows():
                    raise DataError(f"{split_files[0]}: no data rows; expected Parquet records" if len(split_files) == 1
                                    else f"{path}: no data rows in its {len(split_files)} files; expected Parquet "
                                         "records")
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{self.spec}: not a readable Parquet file ({str(e)[:200]})") from None
        kinds = {f.name: column_kind(f.type) for f in schema}
        labels = self._sample_labels(list(kinds))
        head = dataset.head(SAMPLE, columns=labels) if labels else None
        return list(kinds), kinds, {name: head.column(name).to_pylist() for name in labels} if head else {}

    def _inspect_spark(self, spark):
        from pyspark.sql import types as T
        frame = spark.read.parquet(self.paths["train"])

        def kind(data_type) -> str:
            for name, classes in (("integer", T.IntegralType), ("number", (T.FractionalType,)),
                                  ("boolean", T.BooleanType), ("string", T.StringType), ("array", T.ArrayType),
                                  ("null", T.NullType)):
                if isinstance(data_type, classes):
                    return name
            return data_type.simpleString()

        kinds = {field.name: kind(field.dataType) for field in frame.schema.fields}
        labels = self._sample_labels(list(kinds))
        rows = frame.select(*map(_column, labels)).limit(SAMPLE).collect() if labels else []
        return list(kinds), kinds, {name: [row[name] for row in rows] for name in labels}

    def _sample_labels(self, columns: list[str]) -> list[str]:
        """The label columns to sample (the names --label gives, where they exist; `_resolve` checks them)."""
        if not self.options.labeled:
            return []
        names = [part.strip() for part in (self.options.label or self.default_label).split(",")]
        names = [columns[int(n)] if n not in columns and n.isdigit() and int(n) < len(columns) else n for n in names]
        return [n for n in names if n in columns]

    def _resolve(self, columns, kinds, sample):
        self.step_target = ""  # a label column of a list per record: one class per step of the sequences
        steps = [name for name in self._sample_labels(columns) if kinds.get(name) == "array"]
        if steps and self.options.sequences:
            if len(self._sample_labels(columns)) > 1 or self.options.target not in ("", "class"):
                raise ConfigError(f"--label {steps[0]}: a label column of lists gives one class per step (sequence "
                                  "labelling); expected it alone, and --target class")
            self.step_target = steps[0]
            sample = {name: [v for values in sample.get(name, []) if values for v in values] for name in sample}
        super()._resolve(columns, kinds, sample)
        for name in self.labels:
            if kinds[name] not in (*NUMERIC_KINDS, "string") and name != self.step_target:
                raise ConfigError(f"{self.spec}: label column {name!r} is {kinds[name]}; expected numbers (or text "
                                  f"class labels) (columns: {columns})")

    def connect(self, spark) -> None:
        from pyspark.sql import functions as F
        super().connect(spark)
        if self.table:
            return
        if self.sequences:
            self._connect_sequences(spark)
            return
        arrays = [name for name in self.features if self.column_kinds[name] == "array"]
        first = spark.read.parquet(self.paths["train"]).where(" and ".join(f"`{a}` is not null" for a in arrays)) \
            .select(*[F.size(_column(a)) for a in arrays]).first() if arrays else ()
        if arrays and first is None:
            raise DataError(f"{self.spec}: no row with all of {arrays} present; expected array features")
        lengths = dict(zip(arrays, first or ()))
        self.widths = [lengths.get(name, 0) for name in self.features]  # 0: a scalar column
        self.feature_shape = self._shape(sum(max(w, 1) for w in self.widths))

    def _connect_sequences(self, spark) -> None:
        """The features of each sequence column's steps, from its first non-empty sequence; x holds the numeric
        --features only ((rows, 0) without any)."""
        from pyspark.sql import functions as F
        frame = spark.read.parquet(self.paths["train"])
        self.step_features = {}
        for name in self.sequences:
            first = frame.where(F.size(_column(name)) > 0).select(_column(name)).first()
            if first is None:
                raise DataError(f"{self.spec}: column {name!r} holds no non-empty sequence; expected a list of numbers "
                                "per record (--sequence)")
            self.step_features[name] = step_features(first[0])
        self.widths = [0] * len(self.features)
        self.feature_shape = (len(self.features),)

    def frame(self, spark, split):
        columns = [*self.labels, *self.features, *self.categorical, *self.sequences, *self.keys]
        return spark.read.parquet(self.paths[split]).select(*map(_column, dict.fromkeys(columns)))

    def convert(self, split: str, batch) -> ReadBatch:
        labels = [batch.column(name) for name in self.labels]
        if self.table:
            return self._table_batch(split, batch, labels, batch.num_rows, BadRecords(), np.arange(batch.num_rows),
                                     lambda i: f"{i} of a batch")
        if self.sequences:
            return self._sequence_batch(split, batch, labels)
        import pyarrow.compute as pc
        seen, bad = batch.num_rows, BadRecords()
        good = np.ones(seen, bool)
        for name, width in zip(self.features, self.widths):
            if width:
                lengths = pc.fill_null(pc.list_value_length(batch.column(name)), -1).to_numpy(zero_copy_only=False)
                wrong = good & (lengths != width)
                bad.add(np.flatnonzero(wrong), lambda i: f"{self.paths[split]}: column {name!r} holds "
                                                         f"{'no' if lengths[i] < 0 else lengths[i]} values at record "
                                                         f"{i} of a batch, expected {width}")
                good &= ~wrong
        positions = np.flatnonzero(good)
        batch = batch.take(positions) if not good.all() else batch
        parts = [batch.column(name).flatten().to_numpy(zero_copy_only=False).reshape(-1, width) if width
                 else numeric_values(batch.column(name), name)[0][:, None]
                 for name, width in zip(self.features, self.widths)]
        x = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        labels = [batch.column(name) for name in self.labels] if self.labels else None
        first = numeric_values(labels[0], self.labels[0])[0] if labels and not self.text_labels else None
        batch = checked_batch(x.reshape(len(x), *self.feature_shape), labels, self.num_classes, self.paths[split],
                              lambda i: _describe(None if first is None else first[i], x[i]), bad,
                              self.feature_dtype, positions, self.target)
        batch.seen = seen
        return batch

    def _sequence_batch(self, split: str, batch, labels: list) -> ReadBatch:
        """A record batch of a sequence dataset: its numeric --features as x, each --sequence column ragged
        (`etl/sequence_columns.py`: a wrong sequence stops the job), the good records' rows (`SequenceRows`)."""
        where = self.paths[split]
        x = np.stack([numeric_values(batch.column(name), name)[0] for name in self.features], axis=1) \
            if self.features else np.empty((batch.num_rows, 0), np.float32)
        first = numeric_values(labels[0], self.labels[0])[0] \
            if labels and not self.text_labels and not self.step_target else None

        def record(i: int) -> str:
            return f"{i} of a batch" + ("" if first is None else f" (label {first[i]:g})")
        sequences = {name: ragged_column(batch.column(name), name, self.step_features[name], self.options.max_length,
                                         where, record) for name in self.sequences}
        if self.step_target:
            steps = self._step_labels(labels[0], sequences[self.sequences[0]], where, record)
            sequences[self.step_target] = steps
            labels = [np.maximum.reduceat(steps.values[:, 0], steps.offsets[:-1]).astype(np.int64)]
        checked = checked_batch(x, labels or None, self.num_classes, where, record, BadRecords(), "float32",
                                None, self.target)
        checked.x = SequenceRows(checked.x, {name: seqs[checked.kept] for name, seqs in sequences.items()})
        checked.seen = batch.num_rows
        return checked

    def _step_labels(self, column, first: Ragged, where: str, record) -> Ragged:
        """The step target's classes of a record batch, ragged: as long as the first sequence column's sequences, each
        a class of the target, else one DataError naming the record (docs/sequences.md)."""
        steps = ragged_column(column, self.step_target, 1, self.options.max_length, where, record)
        differs = steps.lengths != first.lengths
        if differs.any():
            i = int(np.argmax(differs))
            raise DataError(f"{where}: record {record(i)}: label column {self.step_target!r} holds {steps.lengths[i]} "
                            f"classes, expected one per step of {self.sequences[0]!r} ({first.lengths[i]} steps)")
        _, ok, _ = self.target.check([steps.values[:, 0]], where, record)
        if not ok.all():
            step = int(np.argmax(~ok))
            i = int(np.searchsorted(steps.offsets, step, side="right") - 1)
            raise DataError(f"{where}: record {record(i)}: label column {self.step_target!r} holds "
                            f"{steps.values[step, 0]:g} at step {step - steps.offsets[i]}, expected "
                            f"{self.target.expected}")
        return steps

    def _label_texts(self, spark) -> tuple[str, ...]:
        frames = [spark.read.parquet(self.paths[split]).select(_column(self.labels[0]).cast("string").alias("value"))
                  for split in self.splits]
        frame = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
        return _checked_classes(self, frame.where("value is not null").distinct())


def _checked_classes(source: TableSource, distinct) -> tuple[str, ...]:
    """The sorted values of a DataFrame of distinct label texts, at least 2 and at most MAX_CLASSES."""
    names = sorted(row.value for row in distinct.limit(MAX_CLASSES + 1).collect() if row.value is not None)
    label = source.labels[0]
    if len(names) > MAX_CLASSES:
        raise DataError(f"{source.spec}: label column {label!r} holds more than {MAX_CLASSES} distinct texts; "
                        "expected class names (--target regression for numbers)")
    if len(names) < 2:
        raise DataError(f"{source.spec}: label column {label!r} holds {len(names)} distinct text(s) {names}, "
                        "expected at least 2 classes")
    return tuple(names)
