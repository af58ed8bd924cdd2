"""What the table sources share (`TableSource`; `csv.py`, `parquet.py`): `csv:PATH` and `parquet:PATH`, a file, a folder
of parts, or a glob.

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

import math
import os

import numpy as np

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.encoding import TableEncoder, TableRows, numeric_values, parse_table
from mpitrain.data.sequences import Inputs, Ragged, SequenceRows
from mpitrain.data.shards import FEATURE_DTYPES, TARGETS
from mpitrain.etl.bag_columns import TextBags, bag_column
from mpitrain.etl.records import BadRecords, ReadBatch, Target, checked_batch
from mpitrain.etl.sequence_columns import ragged_column
from mpitrain.etl.sources.base import Source, SourceOptions, split_paths
from mpitrain.etl.tables import NUMERIC_MISSING

SAMPLE = 100  # the first records, whose labels decide a target that --target leaves open
MAX_CLASSES = 10_000  # distinct text labels a class target may have
NUMERIC_KINDS = ("integer", "number", "boolean", "null")


def describe_row(label, features: np.ndarray) -> str:
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


def local_files(path: str) -> list[str]:
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

    tabular = separate_test = unlabeled_records = True

    default_label = "0"
    holds_sequences = False  # whether the format has list columns (`--sequence`)
    step_target = ""  # a label column of a list per record: one class per step of the sequences (parquet's)

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
        self.encoder = TableEncoder(options.columns, options.dataset) if options.columns else None  # a table model's (scoring)
        if self.encoder and (options.features or options.categorical):
            raise ConfigError("--features: a table model reads the columns it was trained on "
                              f"({', '.join(self.encoder.numeric + self.encoder.categorical)}); expected no --features")
        self.table = bool(options.categorical) or options.numeric_missing == "impute" or self.encoder is not None
        if self.table and (options.feature_shape or options.feature_dtype != "float32"):
            raise ConfigError("--feature-shape and --feature-dtype: a table (--categorical, --numeric-missing "
                              "impute) stores float32 numbers and int32 ids of its columns, expected neither")
        self.feature_dtype = options.feature_dtype
        if options.sequences and not self.holds_sequences:
            raise ConfigError(f"--sequence: sequence columns are read from a parquet: source, not {spec}")
        if (options.sequences or options.bags) and (self.table or options.feature_shape or
                                                    options.feature_dtype != "float32"):
            option = "--sequence" if options.sequences else "--bag"
            raise ConfigError(f"{option}: a dataset of sequences or bags stores them and its numeric --features as "
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
        self.bags = self._names("--bag", ",".join(options.bags), columns, False) if options.bags else []
        self.sequences = [*(self._names("--sequence", ",".join(options.sequences), columns, False)
                            if options.sequences else []), *self.bags]  # a bag is stored as a sequence of ids
        if len(set(self.sequences)) < len(self.sequences):
            raise ConfigError(f"--bag {','.join(self.bags)}: names a --sequence column")
        self.step_features = dict.fromkeys(self.bags, 1)  # the --sequence columns' are found once Spark reads them
        if self.encoder:
            features, categorical = self._model_columns(columns)
        else:
            categorical = self._names("--categorical", ",".join(options.categorical), columns, False) \
                if options.categorical else []
            features = self._names("--features", ",".join(options.features), columns, True) if options.features \
                else [] if self.sequences else [c for c in columns if c not in self.labels and c not in self.keys]
        for name in self.sequences:
            if name in self.labels or name in features or name in categorical:
                raise ConfigError(f"{'--bag' if name in self.bags else '--sequence'} {name}: {name!r} is also a "
                                  "label, feature or categorical column")
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
        elif self.sequences:  # x: the numeric --features beside the sequence and bag columns
            self.feature_shape = (len(self.features),)
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
                    "a list of strings or integers per record (a --bag column)" if name in self.bags else \
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
                                {name: TextBags.empty() if name in self.bags else Ragged.empty(self.step_features[name])
                                 for name in self.sequences}), y
        return (TableRows.empty(len(self.features), len(self.categorical)) if self.table and not self.encoder
                else x), y

    def _sequence_batch(self, split: str, records, labels: list, bad: BadRecords | None = None,
                        seen: int | None = None, record=None, positions: np.ndarray | None = None) -> ReadBatch:
        """Records (a pyarrow RecordBatch or Table of named columns) of a sequence dataset: its numeric --features as
        x, each --sequence column ragged (`etl/sequence_columns.py`: a wrong sequence stops the job), each --bag
        column's texts (`etl/bag_columns.py`: in a CSV cell, separated by --bag-delimiter), the good records' rows
        (`SequenceRows`). `bad` and `seen` count what the format dropped before; `record(i)` names record i, and
        `positions` are the records' in the batch read (default: the records are the batch)."""
        where = self.paths[split]
        x = np.stack([numeric_values(records.column(name), name)[0] for name in self.features], axis=1) \
            if self.features else np.empty((records.num_rows, 0), np.float32)
        first = numeric_values(labels[0], self.labels[0])[0] \
            if labels and not self.text_labels and not self.step_target else None
        if record is None:
            def record(i: int) -> str:
                return f"{i} of a batch" + ("" if first is None else f" (label {first[i]:g})")
        delimiter = None if self.typed_columns else self.options.bag_delimiter
        sequences = {name: bag_column(records.column(name), name, self.options.max_length, where, record, delimiter)
                     if name in self.bags else
                     ragged_column(records.column(name), name, self.step_features[name], self.options.max_length,
                                   where, record) for name in self.sequences}
        if self.step_target:
            steps = self._step_labels(labels[0], sequences[self.sequences[0]], where, record)
            sequences[self.step_target] = steps
            labels = [np.maximum.reduceat(steps.values[:, 0], steps.offsets[:-1]).astype(np.int64)]
        checked = checked_batch(x, labels or None, self.num_classes, where, record, bad or BadRecords(), "float32",
                                None, self.target)
        checked.x = SequenceRows(checked.x, {name: seqs[checked.kept] for name, seqs in sequences.items()})
        if positions is not None:
            checked.kept = np.asarray(positions)[checked.kept]
        checked.seen = records.num_rows if seen is None else seen
        return checked

    def _step_labels(self, column, first: Ragged, where: str, record) -> Ragged:
        """A label column of a class per step (parquet's)."""
        raise NotImplementedError

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
        return ReadBatch(self._encoded(rows) if self.encoder else rows, y[good], seen, bad, positions[good])

    def _encoded(self, rows: TableRows):
        """A table model's input of parsed rows: their numbers, and beside them their ids (`Inputs`) when the model
        has categorical columns."""
        x = self.encoder.numbers(rows)
        return Inputs(x, {"categorical": self.encoder.ids(rows)}) if self.encoder.categorical else x


def checked_classes(source: TableSource, distinct) -> tuple[str, ...]:
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
