"""The label columns of targets other than class labels, for scoring: a binary, multilabel or regression model scores
a csv or parquet table whose label columns hold 0/1 labels or numbers.

    columns = label_columns("a,b", "multilabel", ["a", "b"])          # --label a,b (default: the model's names)
    source = TargetColumns("parquet:rows.parquet", options, "multilabel", columns)
    source.connect(spark); read = source.convert("train", batch)      # read.y: float32 (rows, 2)

The ETL's table sources (`etl/sources/table.py`, `csv.py`, `parquet.py`) read one integer class label. This wraps
one opened without labels, so that its feature columns exclude the label columns, and takes the labels from the
records itself: a parquet source carries them as extra key columns of its frame; a csv source parses every column
as a float32 feature, and the label columns are cut out of the parsed values (then the features are checked against
the model's dtype).
A label that is missing or not a number, or not 0 or 1 for binary and multilabel targets, makes the record bad.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from mpitrain.base.errors import ConfigError
from mpitrain.etl.records import ReadBatch, checked_batch
from mpitrain.etl.sources import Source, SourceOptions, open_source, schemes_that, source_kind


def label_columns(label: str, target: str, names: list[str], width: int) -> tuple[str, ...]:
    """The label columns of a model of `width` outputs: `--label` split on commas (names, or 0-based indices as
    the ETL takes them), by default the model's target names; () for a binary model without names (the source's
    own default label column)."""
    columns = tuple(part.strip() for part in label.split(",")) if label else tuple(names)
    if columns and len(columns) != width:
        given = f"--label {label}" if label else f"the model's target names {list(names)}"
        raise ConfigError(f"{given}: {len(columns)} label columns, but the {target} model has {width} outputs "
                          f"{list(names)}; expected one label column per output (--label a,b,...)")
    return columns


class TargetColumns(Source):
    """A csv or parquet source whose ReadBatch.y holds the float32 values of its label columns (rows, k), and whose
    features (the other columns) are the model's `feature_shape` and `feature_dtype` from `options`."""

    def __init__(self, spec: str, options: SourceOptions, target: str, columns: tuple[str, ...]):
        self.kind = source_kind(spec)
        if not self.kind.tabular:
            raise ConfigError(f"{spec}: a {target} model reads its labels from columns of "
                              f"{schemes_that('tabular', 'or')} records (--label); score "
                              f"{self.kind.scheme} records with --no-label")
        self.target, self.options = target, options
        # untyped columns (csv): every column a float32 feature, the labels cut out here; typed columns (parquet): the
        # features as the model takes them, the label columns named here riding along as keys, not taken for features
        unlabeled = replace(options, labeled=False, **({"feature_shape": (), "feature_dtype": "float32"}
                                                      if not self.kind.typed_columns else
                                                      {"keys": (*options.keys, *(c for c in columns
                                                                                 if not c.isdigit()))}))
        self.inner = open_source(spec, options=unlabeled)
        self.columns = columns or (self.inner.default_label,)
        super().__init__(spec, tuple(options.feature_shape), self.inner.scale, None)
        self.feature_dtype, self.splits, self.keys = options.feature_dtype, self.inner.splits, ()

    def connect(self, spark) -> None:
        if self.kind.typed_columns:
            from pyspark.sql.types import BooleanType, NumericType
            types = {field.name: field.dataType for field in spark.read.parquet(self.inner.paths["train"]).schema}
            self.names = [self._column(column, list(types)) for column in self.columns]
            for name in self.names:
                if not isinstance(types[name], (NumericType, BooleanType)):
                    raise ConfigError(f"{self.spec}: label column {name!r} is {types[name].simpleString()}; "
                                      "expected numbers or booleans")
            self.inner = open_source(self.spec, options=replace(self.inner.options,
                                                                keys=(*self.options.keys, *self.names)))
            self.inner.connect(spark)
            self.keys = tuple(self.options.keys)
            return
        self.inner.connect(spark)
        self.names = [self._column(column, self.inner.columns) for column in self.columns]
        self.positions = [self.inner.columns.index(name) for name in self.names]
        width = len(self.inner.columns) - len(self.positions)
        if width != int(np.prod(self.feature_shape)):
            raise ConfigError(f"{self.spec}: {width} feature columns beside the labels {self.names}, but the model "
                              f"takes rows of shape {list(self.feature_shape)}")

    def _column(self, column: str, names: list[str]) -> str:
        """A label column by name, or by 0-based index as the ETL's --label takes it."""
        if column in names:
            return column
        if column.isdigit() and int(column) < len(names):
            return names[int(column)]
        raise ConfigError(f"--label {','.join(self.columns)}: no column {column!r} in {self.spec}; expected names "
                          f"or 0-based indices of {names[:20]}{' ...' if len(names) > 20 else ''}")

    def frame(self, spark, split: str):
        return self.inner.frame(spark, split)

    def convert(self, split: str, batch) -> ReadBatch:
        import pyarrow as pa
        import pyarrow.compute as pc

        read = self.inner.convert(split, batch)
        where, kept = self.inner.paths[split], np.asarray(read.kept, np.int64)
        if self.kind.typed_columns:
            x = read.x
            labels = np.column_stack([pc.cast(batch.column(name).take(pa.array(kept)), pa.float64())
                                      .to_numpy(zero_copy_only=False) for name in self.names]) \
                if len(kept) else np.zeros((0, len(self.names)))
        else:
            labels, x = read.x[:, self.positions], np.delete(read.x, self.positions, axis=1)
        good = np.isfinite(labels).all(axis=1)
        expected = "numbers"
        if self.target != "regression":
            good &= np.isin(labels, (0, 1)).all(axis=1)
            expected = "0 or 1"
        read.bad.add(np.flatnonzero(~good), lambda i: f"{where}: labels {dict(zip(self.names, labels[i].tolist()))} "
                                                      f"at record {kept[i]} of a batch, expected {expected}")
        checked = checked_batch(x[good].reshape(-1, *self.feature_shape), None, None, where,
                                lambda i: f"{kept[good][i]} of a batch", read.bad, self.feature_dtype, kept[good])
        labels = labels[good][np.isin(kept[good], checked.kept)]  # the rows whose features are good too
        return ReadBatch(checked.x, labels.astype(np.float32), read.seen, read.bad, checked.kept)
