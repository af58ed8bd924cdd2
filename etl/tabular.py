"""Table sources read by Spark: `csv:PATH` and `parquet:PATH` (a file, a folder of parts, or a glob).

One column holds integer class labels 0..K-1; the features are the other columns (CSV: all
numeric; Parquet: the chosen columns, numbers or arrays of numbers such as flattened images).
Both reach Python as Arrow record batches, never as row objects. Labels are 0..K-1 with K
`--num-classes`, or the largest label seen + 1.
"""
from __future__ import annotations

from mpitrain.errors import ConfigError, DataError
from mpitrain.etl.records import BadRecords, ReadBatch, checked_batch
from mpitrain.etl.sources import Source, SourceOptions, split_paths
from mpitrain.data.shards import FEATURE_DTYPES

import numpy as np

def _column(name: str):
    from pyspark.sql.functions import col
    return col(f"`{name}`")


def _describe(label, features: np.ndarray) -> str:
    """A row by its leading values, e.g. '7,0,0,12,...' (label first, if any), to find it with grep."""
    leading = ",".join(f"{v:g}" for v in ([] if label is None else [label]) + list(features[:4]))
    return f"'{leading}{',...' if len(features) > 4 else ''}'"


class TableSource(Source):
    """What CSV and Parquet share: the split paths, the label column, feature shape and dtype."""

    default_label = "0"

    def __init__(self, spec: str, path: str, options: SourceOptions):
        self.paths = split_paths(spec, path, options)
        self.splits = tuple(self.paths)
        if options.feature_dtype not in FEATURE_DTYPES:
            raise ConfigError(f"--feature-dtype {options.feature_dtype}: expected one of {FEATURE_DTYPES}")
        self.options = options
        self.feature_dtype = options.feature_dtype
        super().__init__(spec, (), 1.0, options.num_classes or None)
        if self.num_classes is not None and self.num_classes < 2:
            raise ConfigError(f"--num-classes {self.num_classes}: expected at least 2")

    def _label(self, columns: list[str]) -> str | None:
        """The label column: `--label` as a name, or as a 0-based index; None for unlabeled records."""
        if not self.options.labeled:
            return None
        label = self.options.label or self.default_label
        if label in columns:
            return label
        if label.isdigit() and int(label) < len(columns):
            return columns[int(label)]
        raise ConfigError(f"--label {label}: no such column in {self.spec}; expected a name or a 0-based index "
                          f"of {columns[:20]}{' ...' if len(columns) > 20 else ''}")

    def _shape(self, width: int) -> tuple[int, ...]:
        shape = self.options.feature_shape or (width,)
        if int(np.prod(shape)) != width:
            raise ConfigError(f"--feature-shape {','.join(map(str, shape))}: holds {int(np.prod(shape))} values, "
                              f"expected {width} (the feature values of a row of {self.spec})")
        return tuple(shape)

    def _batch(self, split: str, labels: np.ndarray | None, x: np.ndarray, bad: BadRecords, seen: int,
               positions: np.ndarray) -> ReadBatch:
        batch = checked_batch(x.reshape(len(x), *self.feature_shape), labels, self.num_classes, self.paths[split],
                              lambda i: _describe(None if labels is None else labels[i], x[i]), bad,
                              self.feature_dtype, positions)
        batch.seen = seen
        return batch


class CsvSource(TableSource):
    """CSV with a label column (`--label`, default the first) and numeric features; `--no-header` without names.

    Spark reads the files as lines (splitting large files across tasks); each task parses its
    Arrow batch of lines at once with pyarrow's C++ CSV reader. Lines with too few or too many
    fields are bad records, as are empty or non-finite values; a batch holding text where a
    number belongs is parsed again line by line to find it.
    """

    def connect(self, spark) -> None:
        first = spark.read.text(self.paths["train"]).first()
        if first is None:
            raise DataError(f"{self.spec}: no lines; expected a header or rows of numbers")
        fields = first.value.split(",")
        self.header_line = first.value if self.options.header else None
        self.columns = [f.strip() for f in fields] if self.options.header else [f"_c{i}" for i in range(len(fields))]
        self.label = self._label(self.columns)
        self.label_index = None if self.label is None else self.columns.index(self.label)
        self.feature_shape = self._shape(len(self.columns) - (self.label is not None))

    def frame(self, spark, split):
        return spark.read.text(self.paths[split])

    def convert(self, split: str, batch) -> ReadBatch:
        all_lines = batch.column(0).to_pylist()
        positions = [i for i, line in enumerate(all_lines) if line and line != self.header_line]
        lines = [all_lines[i] for i in positions]
        bad = BadRecords()
        malformed = {}  # index in `lines` -> the line
        try:
            values = self._parse_block(lines, malformed)
        except ValueError:  # text where a number belongs: find the lines
            values = self._parse_lines(lines, malformed)
        texts = list(malformed.values())
        bad.add(np.arange(len(texts)), lambda i: f"{self.paths[split]}: malformed line {texts[i][:80]!r}, "
                                                 f"expected {len(self.columns)} numbers separated by commas")
        parsed = np.array([p for i, p in enumerate(positions) if i not in malformed], np.int64)
        if self.label_index is None:
            return self._batch(split, None, values.astype(np.float32), bad, len(lines), parsed)
        labels = values[:, self.label_index].astype(np.float64)
        x = np.delete(values, self.label_index, axis=1).astype(np.float32)
        return self._batch(split, labels, x, bad, len(lines), parsed)

    def _parse_block(self, lines: list[str], malformed: dict[int, str]) -> np.ndarray:
        """All lines at once with pyarrow; rows of the wrong width go to `malformed`. Empty values are NaN."""
        import pyarrow as pa
        import pyarrow.csv as pcsv

        def skip(row):
            if row.number is None:  # pyarrow could not say which line: find them one by one
                raise ValueError("a malformed line of unknown number")
            malformed[row.number - 1] = row.text
            return "skip"

        names = [str(i) for i in range(len(self.columns))]
        try:
            table = pcsv.read_csv(pa.py_buffer("\n".join(lines).encode()),
                                  read_options=pcsv.ReadOptions(column_names=names, use_threads=False),
                                  parse_options=pcsv.ParseOptions(invalid_row_handler=skip),
                                  convert_options=pcsv.ConvertOptions(column_types={n: pa.float64() for n in names}))
        except (pa.ArrowInvalid, ValueError) as e:
            malformed.clear()
            raise ValueError(str(e)) from None
        if table.num_rows == 0:
            return np.zeros((0, len(names)))
        return np.column_stack([column.to_numpy() for column in table.columns])

    def _parse_lines(self, lines: list[str], malformed: dict[int, str]) -> np.ndarray:
        rows = []
        for index, line in enumerate(lines):
            fields = line.split(",")
            try:
                if len(fields) != len(self.columns):
                    raise ValueError
                rows.append([float(f) if f.strip() else np.nan for f in fields])
            except ValueError:
                malformed[index] = line
        return np.array(rows, dtype=np.float64).reshape(len(rows), len(self.columns))


class ParquetSource(TableSource):
    """Parquet with a label column (`--label`, default `label`) and `--features` columns (default: the rest).

    A feature column holds numbers or arrays of numbers (a flattened image); every array must
    have the length of the first row's, else the record is bad.
    """

    default_label = "label"

    def connect(self, spark) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, NumericType
        frame = spark.read.parquet(self.paths["train"])
        self.label = self._label(frame.columns)
        self.keys = tuple(self.options.keys)
        missing = [key for key in self.keys if key not in frame.columns]
        if missing:
            raise ConfigError(f"--keys {','.join(self.keys)}: no column {missing[0]!r} in {self.spec} "
                              f"(columns: {frame.columns})")
        self.features = list(self.options.features) or [c for c in frame.columns
                                                        if c != self.label and c not in self.keys]
        types = {field.name: field.dataType for field in frame.schema.fields}
        for name in [self.label, *self.features] if self.label else self.features:
            kind = types.get(name)
            numeric = isinstance(kind, NumericType) or (name != self.label and isinstance(kind, ArrayType)
                                                        and isinstance(kind.elementType, NumericType))
            if not numeric:
                raise ConfigError(f"{self.spec}: column {name!r} is {kind.simpleString() if kind else 'missing'}; "
                                  "expected numbers" + ("" if name == self.label else " or arrays of numbers") +
                                  f" (columns: {frame.columns})")
        arrays = [name for name in self.features if isinstance(types[name], ArrayType)]
        first = frame.where(" and ".join(f"`{a}` is not null" for a in arrays) or "true") \
            .select(*[F.size(_column(a)) for a in arrays]).first() if arrays else ()
        if arrays and first is None:
            raise DataError(f"{self.spec}: no row with all of {arrays} present; expected array features")
        lengths = dict(zip(arrays, first or ()))
        self.widths = [lengths.get(name, 0) for name in self.features]  # 0: a scalar column
        self.feature_shape = self._shape(sum(max(w, 1) for w in self.widths))

    def frame(self, spark, split):
        columns = [*([self.label] if self.label else []), *self.features, *self.keys]
        return spark.read.parquet(self.paths[split]).select(*map(_column, columns))

    def convert(self, split: str, batch) -> ReadBatch:
        import pyarrow.compute as pc
        seen, bad = batch.num_rows, BadRecords()
        good = np.ones(seen, bool)
        first = 1 if self.label else 0  # the frame's columns: the label (if any), the features, the keys
        for j, (name, width) in enumerate(zip(self.features, self.widths), start=first):
            if width:
                lengths = pc.fill_null(pc.list_value_length(batch.column(j)), -1).to_numpy(zero_copy_only=False)
                wrong = good & (lengths != width)
                bad.add(np.flatnonzero(wrong), lambda i: f"{self.paths[split]}: column {name!r} holds "
                                                         f"{'no' if lengths[i] < 0 else lengths[i]} values at record "
                                                         f"{i} of a batch, expected {width}")
                good &= ~wrong
        positions = np.flatnonzero(good)
        batch = batch.take(positions) if not good.all() else batch
        parts = [batch.column(j).flatten().to_numpy(zero_copy_only=False).reshape(-1, width) if width
                 else batch.column(j).to_numpy(zero_copy_only=False)[:, None]
                 for j, width in enumerate(self.widths, start=first)]
        x = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        labels = batch.column(0).to_numpy(zero_copy_only=False) if self.label else None
        return self._batch(split, labels, x, bad, seen, positions)
