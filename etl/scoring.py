"""Batch scoring with Spark: a trained model's probabilities (or regression's values) for every record of a source.

    spark-submit etl/score.py --model runs/fashion_lenet --source idx:/usr/share/datasets/fashion-mnist --out p.parquet
    mpitrain score --model lenet.onnx --source csv:new.csv --no-label --out p.parquet

The model is an ONNX file, or a run directory exported in memory (`mpitrain.rundir.export`); its bytes
are broadcast to the executors once. The source is read with the ETL's sources, options and
bad-record rules (`--max-bad-fraction`); a table model's csv or parquet records by the columns its export
carries (the manifest's `columns`), encoded in the tasks as the ETL encoded the training rows (`TableEncoder`: a
category never seen in training gets id 1), since its graph takes encoded rows (docs/tables.md); a sequence
model's by its dataset's sequence and bag columns, each stored as the ETL stored it (`StoredSequences`) and padded
per batch, fed with its lengths (docs/sequences.md). Executors score
the Arrow record batches of the source's DataFrame (`mapInArrow`) with onnxruntime, one session per Python
worker, and emit per batch its predictions plus one tally row (records seen, bad ones, the confusion counts of
class targets, the labels and outputs of other targets), which the driver sums. The output is a
Parquet folder, written into a temporary sibling and renamed into place: the record's keys,
`predicted`, `probabilities` (not for regression) and `label` (when the source has labels), and
`_metrics.json` (Parquet readers skip `_` files) with the counts and, given labels, the metrics:
for class targets accuracy, loss and the confusion matrix as `mpitrain eval` writes them, for
other targets the kind's exact metrics (`mpitrain.training.scores.target_metrics`).

Columns by the model's target kind (its `manifest` metadata, which `mpitrain export` records; a model without it is
refused as not an mpitrain export), k its outputs:

    class       predicted int          probabilities array<float> (K)   label int
    binary      predicted array<int>   probabilities array<float> (1)   label array<float> (1)
    multilabel  predicted array<int>   probabilities array<float> (k)   label array<float> (k)
    regression  predicted array<float> (k), the values                  label array<float> (k)

Labels of other targets than class come from csv or parquet columns, one per output (`--label a,b`, by default
the model's target names: `mpitrain.etl.target_columns`).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass, replace

import numpy as np

from mpitrain.base.domains import check_number
from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.sequences import Inputs
from mpitrain.data.shards import FEATURE_DTYPES
from mpitrain.etl.job import FRACTIONS, check_bad_records, task_data_errors
from mpitrain.etl.output import atomic_folder, check_apart, check_out
from mpitrain.etl.records import BadRecords
from mpitrain.etl.sources import SOURCES, Source, SourceOptions, open_source, schemes_that, source_kind, source_paths
from mpitrain.etl.target_columns import TargetColumns, label_columns

METRICS_NAME = "_metrics.json"  # inside the output folder; also what marks a folder --overwrite may replace
ROW_ID = "row"  # the key column made for sources without keys of their own
STORED_TRANSFORMS = ("standardize", "binarize")  # manifest transforms that change the stored values
TALLIES = ("_seen", "_bad", "_samples", "_confusion", "_loss")
TARGETS_TALLY = "_targets"  # other targets than class: a batch's labels and outputs (np.savez), for exact metrics


@dataclass(frozen=True)
class ScoringModel:
    """An ONNX model's bytes and what the driver needs to know of it."""

    data: bytes
    path: str
    sha256: str  # names the model's onnxruntime session in the executors
    input_name: str
    feature_dtype: str
    feature_shape: tuple[int, ...]
    outputs: int  # classes, or the target's columns
    description: dict  # the manifest's feature description `mpitrain export` records
    metadata: dict
    sequences: dict  # a sequence model's {column: (values input, lengths input)}; {} for rows of fixed size

    @property
    def target(self) -> str:
        """The model's target kind: class, binary, multilabel or regression (class for an export older than
        targets)."""
        return self.description.get("target", "class")

    @property
    def output_columns(self) -> list[str]:
        """The Parquet columns of the model's outputs: `predicted` and, but for regression, `probabilities`."""
        return ["predicted"] + ([] if self.target == "regression" else ["probabilities"])


def load_model(path: str) -> ScoringModel:
    """An ONNX file, or a run directory's newest checkpoint exported in memory; one input of rows
    [N, *feature_shape], one output of probabilities or values [N, columns]."""
    from mpitrain.rundir.export import (
        EXTERNAL_DATA_BYTES,
        export_run,
        initializer_bytes,
        input_rows_shape,
        metadata,
        output_width,
        require_onnx,
        sequence_inputs,
    )

    onnx = require_onnx()
    if os.path.isdir(path):
        proto = export_run(path)
    elif os.path.isfile(path):
        try:
            proto = onnx.load(path, load_external_data=False)
            if initializer_bytes(proto) <= EXTERNAL_DATA_BYTES:  # a larger one is refused below, unchecked
                onnx.checker.check_model(proto)
        except Exception as e:  # protobuf's DecodeError, onnx's ValidationError: the file is not a model
            raise DataError(f"--model {path}: not a valid ONNX model ({type(e).__name__}: {str(e)[:200]})") from None
    else:
        raise DataError(f"--model {path}: no such file or run directory")
    weights = initializer_bytes(proto)
    if weights > EXTERNAL_DATA_BYTES:
        raise ConfigError(f"--model {path}: its weights hold {weights:,} bytes (its embedding tables), "
                          f"more than one ONNX model carries in memory ({EXTERNAL_DATA_BYTES:,}) and than Spark "
                          "broadcasts to every executor; score it under MPI, each rank holding its share of the "
                          "rows: mpiexec -n N mpitrain predict RUN_DIR --records PATH (docs/tables.md)")
    props = metadata(proto)
    if "manifest" not in props:  # what `mpitrain export` records of the dataset; without it rows mean nothing here
        raise DataError(f"--model {path}: not an mpitrain export (its metadata has no dataset manifest); expected an "
                        "ONNX file `mpitrain export` wrote, or a run directory")
    dtype, shape = input_rows_shape(proto)
    if dtype not in FEATURE_DTYPES:
        raise ConfigError(f"--model {path}: takes {dtype} rows; scoring reads rows stored as one of {FEATURE_DTYPES}")
    description = json.loads(props["manifest"])
    stored = [t["name"] for t in description.get("transforms", []) if t.get("name") in STORED_TRANSFORMS and not
              (t["name"] == "standardize" and description.get("sequences"))]  # a sequence model's: _Scorer applies it
    if stored:
        raise ConfigError(f"--model {path}: its dataset stored rows transformed by --{stored[0]}, but scoring feeds "
                          "a source's rows to the model as they are; score models whose dataset kept its rows "
                          "(--scale is fine)")
    if description.get("step_target"):
        raise ConfigError(f"--model {path}: gives a class per step of its sequences; scoring writes one prediction "
                          "per record (score it with `mpitrain predict`)")
    columns = sequence_inputs(proto, [column["name"] for column in description.get("sequences", [])])
    data = proto.SerializeToString()
    return ScoringModel(data, os.path.abspath(path), hashlib.sha256(data).hexdigest(), proto.graph.input[0].name,
                        dtype, shape, output_width(proto), description, props, columns)


@dataclass(frozen=True)
class ScorePlan:
    """A validated scoring request: everything checked that can be checked without Spark."""

    model: ScoringModel
    source: Source
    split: str
    out: str
    overwrite: bool
    max_bad_fraction: float = 0.0
    labeled: bool = True


def plan_scoring(model: str, source: str, out: str, split: str = "", overwrite: bool = False,
                 max_bad_fraction: float = 0.0, options: SourceOptions = SourceOptions()) -> ScorePlan:
    """Check `out`, load the model and open the source with the model's row shape, dtype and classes
    filling what `options` leaves open (csv/parquet feature shape, image size and color). A model of another
    target than class reads its labels from csv or parquet columns (`TargetColumns`; `options.label` may name
    several, comma-separated). A table model's records are read by its columns and encoded (`_table_source`)."""
    check_number("--max-bad-fraction", max_bad_fraction, FRACTIONS["max_bad_fraction"])
    out = os.path.abspath(out)
    check_apart(out, source_paths(source, options), "score")
    check_out(out, overwrite, METRICS_NAME, "predictions")
    scoring = load_model(model)
    shape, target = scoring.feature_shape, scoring.target
    kind = source_kind(source)
    if not options.labeled and not kind.unlabeled_records:
        raise ConfigError(f"--no-label: only {schemes_that('unlabeled_records')} sources may lack labels; {source} "
                          "has them")
    if options.keys and not kind.key_columns:
        raise ConfigError(f"--keys {','.join(options.keys)}: only {schemes_that('key_columns')} sources have key "
                          f"columns; {source} gets a `row` (images: `path`)")
    if target == "class" and "," in options.label and options.labeled:
        raise ConfigError(f"--label {options.label}: a class model reads one label column")
    options = replace(options, num_classes=scoring.outputs if target == "class" else 0,
                      class_names=tuple(scoring.description.get("class_names", ())))
    if scoring.description.get("columns"):
        opened = _table_source(source, options, scoring)
    elif scoring.sequences:
        opened = _sequence_source(source, options, scoring)
    else:
        options = replace(options, feature_shape=options.feature_shape or shape, feature_dtype=scoring.feature_dtype,
                          image_size=options.image_size or shape[1:],
                          color=options.color or {1: "gray", 3: "rgb"}.get(shape[0], "gray"))
        if target == "class" or not options.labeled:
            opened = open_source(source, options=options)
        else:
            names = scoring.description.get("target_names", [])
            opened = TargetColumns(source, options, target,
                                   label_columns(options.label, target, names, scoring.outputs))
    if target == "class" and options.labeled and opened.num_classes and opened.num_classes != scoring.outputs:
        raise ConfigError(f"{source}: labels of {opened.num_classes} classes, but the model scores "
                          f"{scoring.outputs} classes")
    split = split or ("test" if "test" in opened.splits else "train")
    if split not in opened.splits:
        raise ConfigError(f"--split {split}: {source} has splits {list(opened.splits)}")
    plan = ScorePlan(scoring, opened, split, out, overwrite, max_bad_fraction, options.labeled)
    if opened.feature_shape:
        _check_shape(plan)
    return plan


def _table_source(spec: str, options: SourceOptions, scoring: ScoringModel) -> Source:
    """A csv or parquet source of a table model's raw records, read by the model's columns and encoded as its ETL
    encoded the training rows (`TableEncoder` of the manifest's `columns`: unseen categories get id 1, missing ones
    id 0, missing numbers the train mean where the columns impute them); labels checked against the model's target,
    a column per output for other targets than class (`label_columns`)."""
    description, target = scoring.description, scoring.target
    labels = _labels_of_columns(spec, options, scoring, "a table model")
    return open_source(spec, options=replace(options, columns=description["columns"], target=target,
                                             label=",".join(labels) or options.label,
                                             dataset=scoring.metadata.get("dataset")))


def _sequence_source(spec: str, options: SourceOptions, scoring: ScoringModel) -> Source:
    """A csv or parquet source of a sequence model's records: its dataset's sequence and bag columns by name (a
    --sequence column from parquet; a bag from a Parquet list or a CSV cell of `--bag-delimiter` values) and
    `--features` its fixed numeric columns (none by default), read and checked as the ETL read them."""
    columns, target = scoring.description["sequences"], scoring.target
    labels = _labels_of_columns(spec, options, scoring, "a sequence model")
    return open_source(spec, options=replace(
        options, sequences=tuple(c["name"] for c in columns if not c.get("bag")),
        bags=tuple(c["name"] for c in columns if c.get("bag")), max_length=max(c["max_length"] for c in columns),
        feature_shape=(), feature_dtype="float32", target=target, label=",".join(labels) or options.label))


def _labels_of_columns(spec: str, options: SourceOptions, scoring: ScoringModel, model: str) -> tuple:
    """The label columns of a model that reads records by column name (`model`: what it is, for the message): a
    csv or parquet source is required; other targets than class read a column per output (`label_columns`)."""
    if not source_kind(spec).tabular:
        raise ConfigError(f"{spec}: {model} reads the columns of {schemes_that('tabular', 'or')} records; expected "
                          + " or ".join(f"{s}:PATH" for s, k in SOURCES.items() if k.tabular))
    target = scoring.target
    return label_columns(options.label, target, scoring.description.get("target_names", []), scoring.outputs) \
        if target != "class" and options.labeled else ()


def _check_shape(plan: ScorePlan) -> None:
    if tuple(plan.source.feature_shape) != plan.model.feature_shape:
        fixed = " (the numeric --features beside its sequences)" if plan.model.sequences else ""
        raise ConfigError(f"{plan.source.spec}: rows of shape {list(plan.source.feature_shape)}, but the model takes "
                          f"{list(plan.model.feature_shape)}{fixed}")
    for column in plan.model.description.get("sequences", []) if getattr(plan.source, "resolved", False) else ():
        found = getattr(plan.source, "step_features", {}).get(column["name"], column["features"])
        if found != column["features"]:
            raise ConfigError(f"{plan.source.spec}: column {column['name']!r} holds steps of {found} numbers, but "
                              f"the model reads {column['features']} per step")


def score(spark, plan: ScorePlan) -> dict:
    """Score `plan` and write its output; return what `_metrics.json` holds. On failure `out` is untouched."""
    from pyspark.sql import functions as F

    source, model = plan.source, plan.model
    source.connect(spark)
    _check_shape(plan)
    frame = source.frame(spark, plan.split)
    keys = list(source.keys)
    if not keys:
        frame, keys = frame.withColumn(ROW_ID, F.monotonically_increasing_id()), [ROW_ID]
    outputs = [*model.output_columns, *(["label"] if plan.labeled else [])]
    shared = spark.sparkContext.broadcast(model.data)
    task = _Scorer(source, plan.split, shared, model.sha256, model.input_name, model.feature_dtype, keys, outputs,
                   plan.labeled, model.outputs, model.target, model.sequences,
                   model.description.get("sequences", []), model.description.get("transforms", []),
                   model.metadata.get("dataset"))
    scored = frame.mapInArrow(task, _schema(frame.schema, keys, plan.labeled, model.target)).persist()
    try:
        with atomic_folder(plan.out, plan.overwrite, METRICS_NAME, "predictions", "score", create=False) as tmp:
            with task_data_errors():
                tallies = scored.where(F.col("predicted").isNull())
                metrics = _tally(tallies.select(*TALLIES).collect(), plan)
                if plan.labeled and model.target != "class":
                    metrics.update(_target_metrics(tallies.select(TARGETS_TALLY).collect(), plan, metrics["rows"]))
                scored.where(F.col("predicted").isNotNull()).select(*keys, *outputs).write.parquet(tmp)
            with open(os.path.join(tmp, METRICS_NAME), "w") as f:
                json.dump(metrics, f, indent=2)
    finally:
        scored.unpersist()
        shared.unpersist()
    return metrics


def metric_lines(metrics: dict) -> list[str]:
    """What `mpitrain score` prints of `_metrics.json`'s metrics: class targets the accuracy, loss and confusion
    matrix; other targets their single figures (auc, r2, ...); nothing without labels."""
    if "confusion" in metrics:
        return [f"accuracy {metrics['accuracy']:.4f}  loss {metrics['loss']:.4f}",
                "confusion matrix (rows: label, columns: predicted):",
                *("  " + " ".join(f"{count:6d}" for count in row) for row in metrics["confusion"])]
    figures = [f"{key} {value:.4f}" for key, value in metrics.items() if isinstance(value, float)]
    return ["  ".join(figures)] if figures else []


def _schema(input_schema, keys: list[str], labeled: bool, target: str):
    """The scored DataFrame: keys, predictions (null in tally rows) and tallies (null in prediction rows)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )
    fields = [StructField(key, input_schema[key].dataType, True) for key in keys]
    if target == "class":
        fields += [StructField("predicted", IntegerType()), StructField("probabilities", ArrayType(FloatType()))]
        fields += [StructField("label", IntegerType())] if labeled else []
    else:
        fields += [StructField("predicted", ArrayType(FloatType() if target == "regression" else IntegerType()))]
        fields += [] if target == "regression" else [StructField("probabilities", ArrayType(FloatType()))]
        fields += [StructField("label", ArrayType(FloatType()))] if labeled else []
    fields += [StructField("_seen", LongType()), StructField("_bad", LongType()),
               StructField("_samples", ArrayType(StringType())), StructField("_confusion", ArrayType(LongType())),
               StructField("_loss", DoubleType()), StructField(TARGETS_TALLY, BinaryType())]
    return StructType(fields)


def _tally(rows, plan: ScorePlan) -> dict:
    """Sum the tally rows; fail above --max-bad-fraction (as the ETL does); accuracy etc. given class labels."""
    from mpitrain.training.evaluation import Evaluation

    seen, bad = sum(row["_seen"] for row in rows), BadRecords()
    for row in rows:
        bad.merge(BadRecords(row["_bad"], list(row["_samples"])))
    check_bad_records(plan.source.spec, seen, bad, plan.max_bad_fraction)
    if seen == bad.count:
        raise DataError(f"{plan.source.spec}: the {plan.split} split has no good records")
    metrics = {"model": plan.model.path, "model_sha256": plan.model.sha256,
               "checkpoint": plan.model.metadata.get("checkpoint", ""), "source": plan.source.spec,
               "split": plan.split, "target": plan.model.target, "records": seen, "bad_records": bad.count,
               "rows": seen - bad.count}
    if plan.labeled and plan.model.target == "class":
        k = plan.model.outputs
        confusion = np.sum([row["_confusion"] for row in rows], axis=0).reshape(k, k)
        metrics.update(Evaluation(confusion, sum(row["_loss"] for row in rows)).to_dict())
    return metrics


def _target_metrics(rows, plan: ScorePlan, total: int) -> dict:
    """The exact metrics of a target kind other than class (`target_metrics`) over every batch's labels and outputs,
    brought to the driver: at most `MAX_EXACT_ROWS` rows, as for `mpitrain eval`."""
    from mpitrain.training.scores import MAX_EXACT_ROWS, target_metrics

    if total > MAX_EXACT_ROWS:
        raise DataError(f"{plan.source.spec}: exact metrics bring every label and output to the driver, and {total} "
                        f"rows are more than the limit of {MAX_EXACT_ROWS}; score with --no-label, or a sample")
    parts = [np.load(io.BytesIO(row[TARGETS_TALLY])) for row in rows]
    labels, outputs = (np.concatenate([part[name] for part in parts]) for name in ("labels", "outputs"))
    return target_metrics(plan.model.target, labels, outputs)


class _Scorer:
    """The executors' side (pickled into tasks; the model travels as a broadcast): Arrow record batches
    of the source's records -> predictions of the good ones, and one tally row per batch."""

    def __init__(self, source, split, model, sha256, input_name, feature_dtype, keys, columns, labeled, outputs,
                 target, sequences: dict, entries: list[dict], transforms: list[dict], dataset: str | None):
        self.source, self.split, self.model, self.sha256 = source, split, model, sha256
        self.input_name, self.feature_dtype, self.keys = input_name, feature_dtype, keys
        self.labeled, self.outputs, self.target = labeled, outputs, target
        self.names = [*keys, *columns, *TALLIES, TARGETS_TALLY]  # columns: the predictions' (and the label)
        self.sequences, self.entries = sequences, entries  # a sequence model's inputs and its columns' entries
        # the model's first input is its fixed features' `x` unless it is a column's values (no `x` beside them)
        self.fixed = input_name not in {values for values, _ in sequences.values()}
        self.stored = None  # their StoredSequences, made in the executor (a vocabulary's Arrow array, once)
        self.dataset = dataset  # the model's dataset: where a bag column's file vocabulary lies
        self.standardize = next(((np.asarray(t["mean"]), np.asarray(t["std"])) for t in transforms
                                 if t["name"] == "standardize"), None)  # a sequence model's fixed features'

    def _feeds(self, x) -> dict:
        """The model's inputs of a read batch's rows: rows of fixed size as they are (a table's numbers and ids as
        its `Inputs`); a sequence model's fixed
        features as `x` (where it takes them; standardized as the ETL stored them), each column as the ETL stored
        it (`StoredSequences`: a bag's ids, a standardized column's values), padded, and its lengths."""
        from mpitrain.rundir.export import IDS, INPUT
        if isinstance(x, Inputs):  # a table's numbers (none: no input `x`) and its categorical ids, int64 in ONNX
            return {**({INPUT: x.x} if x.x.shape[1] else {}), IDS: x.columns[IDS].astype(np.int64)}
        if not self.sequences:
            return {self.input_name: x.astype(self.feature_dtype, copy=False)}
        from mpitrain.etl.sequence_columns import StoredSequences
        self.stored = self.stored or StoredSequences(self.entries, self.dataset)
        fixed = x.x if self.standardize is None else \
            ((x.x.astype(np.float64) - self.standardize[0]) / self.standardize[1]).astype(np.float32)
        feeds = {self.input_name: fixed.astype(np.float32, copy=False)} if self.fixed else {}
        for name, stored in self.stored(x.sequences).items():
            values, lengths = self.sequences[name]
            feeds[values], feeds[lengths] = stored.padded()
            if feeds[values].dtype.kind in "iu":  # a bag's ids: int64 in ONNX
                feeds[values] = feeds[values].astype(np.int64)
        return feeds

    def __call__(self, batches):
        import pyarrow as pa

        from mpitrain.training.scores import decisions

        session = _session(self.model, self.sha256)
        for batch in batches:
            read = self.source.convert(self.split, batch)
            n = len(read.x)
            outputs = session.run(None, self._feeds(read.x))[0] if n else \
                np.zeros((0, self.outputs), np.float32)
            predicted = decisions(self.target, outputs)
            columns = [batch.column(key).take(pa.array(read.kept, pa.int64())) for key in self.keys]
            if self.target == "class":
                columns += [pa.array(predicted, pa.int32()), _lists(outputs, pa.float32())]
                columns += [pa.array(read.y, pa.int32())] if self.labeled else []
            else:
                columns += [_lists(predicted, pa.float32() if self.target == "regression" else pa.int32())]
                columns += [] if self.target == "regression" else [_lists(outputs, pa.float32())]
                columns += [_lists(read.y, pa.float32())] if self.labeled else []
            tallies = [pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.list_(pa.string())),
                       pa.nulls(n, pa.list_(pa.int64())), pa.nulls(n, pa.float64()), pa.nulls(n, pa.binary())]
            yield pa.RecordBatch.from_arrays(columns + tallies, self.names)
            yield pa.RecordBatch.from_arrays(
                [pa.nulls(1, column.type) for column in columns] + self._tally(read, outputs, predicted), self.names)

    def _tally(self, read, outputs, predicted) -> list:
        import pyarrow as pa
        k = self.outputs
        confusion, loss, targets = np.zeros(k * k, np.int64), 0.0, None
        if self.labeled and self.target == "class" and len(predicted):
            confusion = np.bincount(read.y * k + predicted, minlength=k * k).astype(np.int64)
            chosen = outputs[np.arange(len(predicted)), read.y].astype(np.float64)
            loss = float(-np.log(np.maximum(chosen, np.finfo(np.float32).tiny)).sum())
        elif self.labeled and self.target != "class":
            packed = io.BytesIO()
            np.savez(packed, labels=read.y.reshape(len(outputs), k), outputs=outputs)
            targets = packed.getvalue()
        return [pa.array([read.seen], pa.int64()), pa.array([read.bad.count], pa.int64()),
                pa.array([read.bad.samples], pa.list_(pa.string())), pa.array([confusion], pa.list_(pa.int64())),
                pa.array([loss], pa.float64()), pa.array([targets], pa.binary())]


def _lists(values: np.ndarray, dtype):
    """An Arrow list column of the rows of a (rows, k) array."""
    import pyarrow as pa
    n, k = values.shape
    return pa.ListArray.from_arrays(pa.array(np.arange(0, n * k + 1, k, dtype=np.int32)),
                                    pa.array(np.ascontiguousarray(values).ravel(), dtype))


_SESSIONS: dict = {}  # model sha256 -> its onnxruntime session, one per executor Python worker


def _session(model, sha256: str):
    """The onnxruntime session of the broadcast `model`, made once per Python worker, one thread per task cpu."""
    session = _SESSIONS.get(sha256)
    if session is None:
        import onnxruntime as ort
        from pyspark import TaskContext
        options = ort.SessionOptions()
        context = TaskContext.get()
        options.intra_op_num_threads = max(1, context.cpus() if context is not None else 1)
        options.inter_op_num_threads = 1
        session = _SESSIONS[sha256] = ort.InferenceSession(model.value, options, providers=["CPUExecutionProvider"])
    return session
