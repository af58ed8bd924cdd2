"""`parquet:PATH`: Parquet files, their columns typed: numbers, arrays of numbers, text, sequences (`TableSource`)."""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.encoding import column_kind, numeric_values
from mpitrain.data.sequences import Ragged
from mpitrain.etl.records import BadRecords, ReadBatch, checked_batch
from mpitrain.etl.sequence_columns import ragged_column, step_features
from mpitrain.etl.sources.table import NUMERIC_KINDS, SAMPLE, TableSource, checked_classes, describe_row, local_files


def _column(name: str):
    from pyspark.sql.functions import col
    return col(f"`{name}`")


class ParquetSource(TableSource):
    """Parquet with label columns (`--label`, default `label`) and `--features` columns (default: the rest), or a
    table's columns.

    A plain feature column holds numbers or arrays of numbers (a flattened image); every array must
    have the length of the first row's, else the record is bad. A table's numeric columns hold numbers (null or
    NaN: missing), its categorical ones strings or integers.
    """

    scheme = "parquet"
    usage = "parquet:PATH (label columns; numeric, numeric-array or categorical feature columns)"
    key_columns = typed_columns = True

    default_label = "label"
    holds_sequences = True

    def _inspect_local(self):
        import pyarrow.dataset as ds
        files = local_files(self.paths["train"])
        if not files:
            raise DataError(f"{self.spec}: no files at {self.paths['train']}")
        try:
            dataset = ds.dataset(files, format="parquet")
            schema = dataset.schema
            for split, path in self.paths.items():  # the files' footers count their rows
                split_files = files if split == "train" else local_files(path)
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
        for name in self.sequences:
            if name in self.bags:
                continue
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
                              lambda i: describe_row(None if first is None else first[i], x[i]), bad,
                              self.feature_dtype, positions, self.target)
        batch.seen = seen
        return batch

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
        return Ragged(steps.values.astype(np.float32), steps.offsets)  # stored as the manifest's step target is

    def _label_texts(self, spark) -> tuple[str, ...]:
        frames = [spark.read.parquet(self.paths[split]).select(_column(self.labels[0]).cast("string").alias("value"))
                  for split in self.splits]
        frame = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
        return checked_classes(self, frame.where("value is not null").distinct())
