"""The Spark ETL job: a source in, a dataset folder (HDF5 shards + manifest) out.

Per source split, tasks read blocks of rows (the driver never loads the data) and drop bad
records, counting them. Each row gets a key hashed from its content and the seed; blocks are
range-partitioned by key and sorted (see `etl/shuffle.py`). From per-partition class counts
(the strata: classes, a binary outcome, or none for multilabel and regression targets) the
driver fails on too many bad records, carves stratified test/validation splits, and
places every row at an exact position of its output split; shard i of a split of n rows
holds positions [i*n//shards, (i+1)*n//shards). Transforms are fitted on the train split
(see `etl/transforms.py`), and so are a table's columns (`etl/tables.py`: statistics and
vocabularies of the rows placed in the train split, so carved test and validation rows add
nothing); its rows are encoded as their shards are written. Each shard is written by its
executor into a temporary sibling of `out`; the driver then writes the manifest (the commit
point) and renames the folder into place. Only numpy blocks (a table's: numbers and Arrow
arrays of its categorical values) travel between tasks, so it runs in local mode and on any cluster
whose executors share the file system holding `out`. An `out` that is a URL (s3://bucket/prefix)
is written through `etl/remote.py`: each executor uploads the shards it wrote to a staging
prefix, the driver copies them into place and uploads the manifest last.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from mpitrain.base.domains import check_number
from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.encoding import ID_DTYPE, TableRows
from mpitrain.data.sequences import MAX_LENGTH, SequenceRows, token_ids
from mpitrain.data.shards import (
    CHUNK_ROWS,
    COMPRESSIONS,
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    holds_ids,
    shard_path,
    write_manifest,
)
from mpitrain.data.storage import is_url
from mpitrain.etl.output import atomic_folder, check_apart, check_out
from mpitrain.etl.records import BadRecords, ReadBatch
from mpitrain.etl.remote import RemoteDataset, check_remote_out, write_shard_to
from mpitrain.etl.shuffle import (
    ORDERS,
    Placement,
    key_partition,
    label_keys,
    plan_placement,
    row_keys,
    shard_of,
    strata,
)
from mpitrain.etl.sources import Source, SourceOptions, carved_rows, open_source, source_paths
from mpitrain.etl.tables import TableOptions, TableTransforms, fit_bags, fit_columns
from mpitrain.etl.transforms import FeatureStats, StepStats, TransformOptions, Transforms, mean_and_std
from mpitrain.kernels.rows import flat_rows

STATS_SPLIT = "train"  # mean/std and fitted transforms come from this split only, so test data never leaks
log = logging.getLogger(__name__)


# The domain of each fraction of EtlOptions (its command-line option: --test-fraction, ...). 0 test rows carve
# nothing; a fraction that leaves a split empty for the source's rows is refused once they are known (`carved_rows`).
FRACTIONS = {"test_fraction": "[0, 1)", "validation_fraction": "[0, 1)", "max_bad_fraction": "[0, 1]"}
MAX_SHARDS = 1_000_000  # shards per split: a sane bound


@dataclass(frozen=True)
class EtlOptions:
    """What to carve, transform and tolerate; the fields are command-line options (the option groups of etl/cli.py)."""

    test_fraction: float = 0.2  # carved from a source without a test split, stratified
    validation_fraction: float = 0.0  # of the train rows, carved into a `validation` split, stratified
    max_bad_fraction: float = 0.0  # the job fails when more of the records are bad
    compression: str = "none"  # the shards' codec, one of mpitrain.data.shards.COMPRESSIONS
    order: str = "shuffled"  # the rows' order in the shards, one of ORDERS
    transforms: TransformOptions = TransformOptions()
    source_options: SourceOptions = SourceOptions()
    tables: TableOptions = TableOptions()  # how a table's categorical columns become ids

    def __post_init__(self):
        for name, domain in FRACTIONS.items():  # before the source is opened and Spark starts
            check_number(f"--{name.replace('_', '-')}", getattr(self, name), domain)
        if self.order not in ORDERS:
            raise ConfigError(f"--order {self.order}: expected one of {', '.join(ORDERS)}")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(f"--compression {self.compression}: expected one of {', '.join(COMPRESSIONS)}")


@dataclass(frozen=True)
class EtlPlan:
    """A validated request: everything checked that can be checked without Spark."""

    source: Source
    out: str
    shards: int
    seed: int
    overwrite: bool
    options: EtlOptions = EtlOptions()

    def carving(self, split: str) -> tuple[list[str], list[float]]:
        """Output splits of source split `split` (carved ones first, the rest last) and their fractions."""
        if split != "train":
            return [split], []
        carved = [] if "test" in self.source.splits else [("test", self.options.test_fraction)]
        if self.options.validation_fraction:
            carved.append(("validation", self.options.validation_fraction))
        return [name for name, _ in carved] + ["train"], [fraction for _, fraction in carved]

    def output_rows(self, source_rows: dict[str, int]) -> dict[str, int]:
        """Rows of each output split, given rows per source split; fractions that leave a split empty fail."""
        rows = {}
        for split, n in source_rows.items():
            outputs, fractions = self.carving(split)
            for name, fraction in zip(outputs, fractions):
                rows[name] = carved_rows(name, fraction, n)
                n -= rows[name]
            rows[outputs[-1]] = n
        return rows

    def check_shards(self, rows: dict[str, int]) -> None:
        smallest = min(rows, key=rows.get)
        if not 1 <= self.shards <= rows[smallest]:
            raise ConfigError(f"--shards {self.shards}: expected 1..{rows[smallest]} "
                              f"(the {smallest} split of {self.source.spec} has {rows[smallest]} rows)")


def plan_etl(source: str, out: str, shards: int, seed: int = 0, overwrite: bool = False, **options) -> EtlPlan:
    """Check the options and the output folder, open the source and check `shards` where rows are known.

    `options` are EtlOptions fields.
    """
    check_number("--seed", seed, "[0, 1e18]", integer=True)
    check_number("--shards", shards, f"[1, {MAX_SHARDS}]", integer=True)
    options = EtlOptions(**options)
    if is_url(out):  # the store's package is checked here, before Spark starts
        out = check_remote_out(out, overwrite)
    else:
        out = os.path.abspath(out)
        check_apart(out, source_paths(source, options.source_options), "etl")
        check_out(out, overwrite, MANIFEST_NAME, "dataset")  # --overwrite deletes the old one: it must be a dataset
    plan = EtlPlan(open_source(source, options.test_fraction, options.source_options), out, shards, seed, overwrite, options)
    check_target_options(plan)
    known = plan.source.known_rows()
    if known:
        plan.check_shards(plan.output_rows(known))
    return plan


def check_target_options(plan: EtlPlan) -> None:
    """The options that depend on the source's target and on its being a table (before Spark starts where the
    source's columns are known then, and again once the job has connected)."""
    source, options = plan.source, plan.options
    categorical = options.source_options.categorical
    if options.source_options.bags and not source.tabular:
        raise ConfigError(f"--bag: bag columns are read from a csv: or parquet: source, not {source.spec}")
    if options.source_options.sequences and not getattr(source, "holds_sequences", False):
        raise ConfigError(f"--sequence: sequence columns are read from a parquet: source, not {source.spec}")
    if options.source_options.sequences or options.source_options.bags:
        if options.transforms.scale or options.transforms.binarize:
            raise ConfigError("--scale and --binarize: a dataset of sequences stores its values as they are, or "
                              "standardized per channel (--standardize); expected neither")
    categorical = (*categorical, *options.source_options.bags)
    if options.tables.hash_buckets and not categorical:
        raise ConfigError("--hash-buckets: hashes --categorical and --bag columns, and there are none")
    options.tables.check(categorical)
    if source.table and (options.transforms.scale or options.transforms.binarize):
        raise ConfigError("--scale and --binarize: a table (--categorical, --numeric-missing impute) stores its "
                          "numeric columns as they are, or standardized per column (--standardize); expected neither")
    kind = source.target.kind
    if kind != "class" and options.transforms.one_hot:
        raise ConfigError(f"--one-hot: one-hot labels are a class target's, this one is {kind}")
    if kind in ("multilabel", "regression") and options.order == "label":
        raise ConfigError(f"--order label: sorts rows by class or binary outcome, this target is {kind}")


def run_etl(spark, source: str, out: str, shards: int, seed: int = 0, overwrite: bool = False, **options) -> Manifest:
    """Write the dataset `source` to `out` in `shards` shards per split; return its manifest."""
    return write_dataset(spark, plan_etl(source, out, shards, seed, overwrite, **options))


def write_dataset(spark, plan: EtlPlan) -> Manifest:
    """Run a planned job; on any failure the temporary folder (or staging prefix) goes and `out` is untouched."""
    if is_url(plan.out):
        remote = RemoteDataset(plan.out, plan.overwrite)
        try:
            with task_data_errors():
                manifest = _write_splits(spark, plan, remote.staging)
            remote.commit(manifest)
        finally:
            remote.remove_staging()
        return manifest
    with atomic_folder(plan.out, plan.overwrite, MANIFEST_NAME, "dataset", "etl") as tmp:
        with task_data_errors():
            manifest = _write_splits(spark, plan, tmp)
        write_manifest(tmp, manifest)
    return manifest


class ShardWritten(NamedTuple):
    """What a shard task reports of the shard it wrote: its ShardInfo, label counts, the sum and the sum of squares
    of its model-visible feature values and (a regression target) of its targets per column, and its sequence
    columns' step statistics."""

    info: ShardInfo
    counts: np.ndarray
    total: float
    squares: float
    target_total: np.ndarray
    target_squares: np.ndarray
    steps: dict


@dataclass
class KeyedRows:
    """Rows with their shuffle keys; `seen` and `bad` carry a read batch's record counts through the shuffle."""

    keys: np.ndarray
    x: np.ndarray  # or a table's TableRows
    y: np.ndarray
    seen: int = 0
    bad: BadRecords = field(default_factory=BadRecords)


def _join(blocks: list):
    """Row blocks (numpy arrays, or a table's TableRows) joined in order."""
    return type(blocks[0]).concat(blocks) if isinstance(blocks[0], (TableRows, SequenceRows)) else np.concatenate(blocks)


def _as_bytes(values: np.ndarray) -> np.ndarray:
    return flat_rows(np.ascontiguousarray(values)).view(np.uint8)


def _keys(batch: ReadBatch, seed: int, order: str, target: str) -> np.ndarray:
    """The rows' shuffle keys: a hash of their content (a table's parsed values) and labels, and the seed; with
    `--order label`, the class or binary outcome first."""
    content = batch.x.content() if isinstance(batch.x, (TableRows, SequenceRows)) else batch.x
    labels = batch.y
    if labels.ndim > 1:  # binary, multilabel, regression: the target's values join the content
        content, labels = np.concatenate([_as_bytes(content), _as_bytes(labels)], axis=1), np.zeros(len(labels))
    keys = row_keys(content, labels, seed)
    return keys if order == "shuffled" else label_keys(keys, strata(batch.y, target))


def _scatter(batch: ReadBatch, seed: int, parts: int, order: str, kind: str):
    """Cut a read batch into (key partition, KeyedRows); the first piece carries the record counts."""
    keys = _keys(batch, seed, order, kind)
    target = key_partition(keys, parts)
    order = np.argsort(target, kind="stable")
    bounds = np.searchsorted(target[order], np.arange(parts + 1))
    pieces = [(p, order[a:b]) for p, (a, b) in enumerate(zip(bounds, bounds[1:])) if b > a] or [(0, order)]
    for i, (part, rows) in enumerate(pieces):
        yield part, KeyedRows(keys[rows], batch.x[rows], batch.y[rows],
                              batch.seen if i == 0 else 0, batch.bad if i == 0 else BadRecords())


def _sorted_part(pieces, empty: tuple) -> KeyedRows:
    """One key partition's pieces joined and sorted by key; `empty` is (x, y) of no rows."""
    pieces = [piece for _, piece in pieces]
    keys = np.concatenate([p.keys for p in pieces]) if pieces else np.empty(0, np.uint64)
    order = np.argsort(keys, kind="stable")
    x = _join([p.x for p in pieces]) if pieces else empty[0]
    y = np.concatenate([p.y for p in pieces]) if pieces else empty[1]
    bad = BadRecords()
    for piece in pieces:
        bad.merge(piece.bad)
    return KeyedRows(keys[order], x[order], y[order], sum(p.seen for p in pieces), bad)


def _sorted_parts(spark, source: Source, split: str, seed: int, order: str):
    """RDD of (partition index, KeyedRows sorted by key) for one source split; the read runs once (shuffle files)."""
    batches = source.read(spark, split)
    parts = max(spark.sparkContext.defaultParallelism, batches.getNumPartitions())
    kind = source.target.kind
    keyed = batches.flatMap(lambda batch: _scatter(batch, seed, parts, order, kind)).partitionBy(parts,
                                                                                                 lambda part: part)
    empty = source.empty_rows()
    return keyed.mapPartitionsWithIndex(lambda index, pieces: [(index, _sorted_part(pieces, empty))])


def _summary(part: KeyedRows, kind: str) -> tuple[np.ndarray, int, BadRecords]:
    return np.bincount(strata(part.y, kind)), part.seen, part.bad


def check_bad_records(spec: str, seen: int, bad: BadRecords, max_fraction: float) -> None:
    """Print a sample of the bad records; fail when more than `max_fraction` of all records are bad."""
    if not bad.count:
        return
    sample = "\n  ".join(bad.samples)
    log.warning("%s: %d of %d records are bad; the first:\n  %s", spec, bad.count, seen, sample)
    if bad.count > max_fraction * seen:
        raise DataError(f"{spec}: {bad.count} of {seen} records are bad, more than --max-bad-fraction "
                        f"{max_fraction:g} allows; the first: {'; '.join(bad.samples)}")


def _placed(index: int, part: KeyedRows, placement: Placement, shards: int, kind: str):
    """Cut a sorted partition into (global shard index, (positions, keys, x, y)) pieces."""
    output, position = placement.place(index, strata(part.y, kind))
    rows = np.array(placement.rows)
    target = output * shards + shard_of(position, rows[output], shards)
    order = np.argsort(target, kind="stable")
    ordered = target[order]
    for shard in np.unique(ordered):
        take = order[np.searchsorted(ordered, shard):np.searchsorted(ordered, shard, side="right")]
        yield int(shard), (position[take], part.keys[take], part.x[take], part.y[take])


def _label_counts(y: np.ndarray, kind: str, num_classes: int) -> np.ndarray:
    """The manifest's `label_counts` of some rows: rows per class (class), positives per label column (binary,
    multilabel), or [rows] (regression)."""
    if kind == "class":
        return np.bincount(y, minlength=num_classes)
    if kind in ("binary", "multilabel"):
        return np.rint(y.sum(axis=0, dtype=np.float64)).astype(np.int64)
    return np.array([len(y)])


def _shard_task(shard: int, pieces, placement: Placement, shards: int, transforms: Transforms, tmp: str,
                num_classes: int, compression: str, kind: str):
    """Write one shard from its pieces into `tmp` (a folder or a staging URL); returns [(split, ShardWritten)]."""
    position, keys, x, y = (_join(list(parts)) for parts in zip(*(piece for _, piece in pieces)))
    order = np.argsort(position)
    keys, x, y = keys[order], x[order], y[order]
    split = placement.outputs[shard // shards]
    sequences = transforms.apply_sequences(x.sequences) if isinstance(x, SequenceRows) else {}
    stored = transforms.apply(x.x if sequences else x, keys)
    info = write_shard_to(tmp, shard_path(split, shard % shards), stored, y, transforms.one_hot(y, num_classes),
                          compression, sequences, transforms.apply_ids(x))
    scale, offset = transforms.scale_offset
    values = stored.astype(np.float64) * scale + offset
    steps = {name: _sequence_stats(seqs) for name, seqs in sequences.items()}
    targets = y.astype(np.float64).reshape(len(y), -1) if kind == "regression" else np.zeros((0, 0))
    return [(split, ShardWritten(info, _label_counts(y, kind, num_classes), float(values.sum()),
                                 float(np.square(values).sum()), targets.sum(axis=0), np.square(targets).sum(axis=0),
                                 steps))]


def _train_rows(parts, placement: Placement, kind: str):
    """RDD of each partition's rows placed in the train split."""
    train = placement.outputs.index(STATS_SPLIT)

    def rows(indexed):
        index, part = indexed
        return part.x[placement.place(index, strata(part.y, kind))[0] == train]

    return parts.map(rows)


def _train_stats(parts, placement: Placement, source: Source) -> tuple[FeatureStats, dict | None]:
    """Per-feature sums, min and max of the model-visible values of the rows placed in the train split (a dataset of
    sequences: of its fixed features), and each sequence column's `StepStats` (None without them), in one pass."""
    scale, offset = source.scale, source.offset

    def of(x):
        if isinstance(x, SequenceRows):
            return FeatureStats.of(x.x * scale + offset), StepStats.of_columns(x)
        return FeatureStats.of(x * scale + offset), None

    def merge(a, b):
        return a[0].merge(b[0]), None if a[1] is None else StepStats.merge_columns(a[1], b[1])
    return _train_rows(parts, placement, source.target.kind).map(of).reduce(merge)


def _transforms(parts, placement: Placement, plan: EtlPlan, tmp: str) -> Transforms:
    """The transforms fitted on the train split's rows: a table's columns, or the feature transforms asked for and
    the bag columns' vocabularies (file vocabularies written into `tmp`)."""
    source, options = plan.source, plan.options
    if source.table:
        columns = fit_columns(_train_rows(parts, placement, source.target.kind), source.features, source.categorical,
                              options.tables, options.transforms.standardize,
                              options.source_options.numeric_missing == "impute", source.spec, tmp)
        return TableTransforms(options.transforms, plan.seed, "float32", 1.0, 0.0, root=tmp, fitted=columns)
    stats, step_stats = _train_stats(parts, placement, source) if options.transforms.needs_stats else (None, None)
    bags = fit_bags(_train_rows(parts, placement, source.target.kind), source.bags, options.tables, source.spec,
                    tmp) if getattr(source, "bags", None) else {}
    return Transforms(options.transforms, plan.seed, source.feature_dtype, source.scale, source.offset, stats,
                      step_stats, bags, tmp)


def _write_splits(spark, plan: EtlPlan, tmp: str) -> Manifest:
    source, options = plan.source, plan.options
    source.connect(spark)
    check_target_options(plan)
    kind = source.target.kind
    parts = {split: _sorted_parts(spark, source, split, plan.seed, plan.options.order) for split in source.splits}
    summaries = {split: rdd.values().map(lambda part: _summary(part, kind)).collect() for split, rdd in parts.items()}
    all_bad = BadRecords()
    for results in summaries.values():
        for _, _, bad in results:
            all_bad.merge(bad)
    records = sum(seen for results in summaries.values() for _, seen, _ in results)
    if not records:
        raise DataError(f"{source.spec}: no data rows; expected records to write")
    check_bad_records(source.spec, records, all_bad, options.max_bad_fraction)
    if kind == "class":
        num_classes = source.num_classes or max(len(counts) for results in summaries.values()
                                                for counts, *_ in results)
        if num_classes < 2:
            raise DataError(f"{source.spec}: labels give {num_classes} class(es), expected at least 2")
        width = num_classes
    else:  # binary: its two outcomes; multilabel: its labels; regression: none. Carving: by outcome, or not
        num_classes = {"binary": 2, "multilabel": len(source.target.columns)}.get(kind, 0)
        width = 2 if kind == "binary" else 1
    counts = {split: np.array([np.pad(c, (0, width - len(c))) for c, *_ in results])
              for split, results in summaries.items()}
    rows = {split: int(c.sum()) for split, c in counts.items()}
    for split, n in rows.items():
        if n == 0:
            raise DataError(f"{source.spec}: the {split} split has no good records")
    plan.check_shards(plan.output_rows(rows))
    placements = {split: plan_placement(*plan.carving(split), counts[split]) for split in parts}
    transforms = _transforms(parts["train"], placements["train"], plan, tmp)
    written, compression = {}, options.compression
    for split, rdd in parts.items():
        placement, shards = placements[split], plan.shards
        results = rdd.flatMap(lambda indexed: _placed(*indexed, placement, shards, kind)) \
            .partitionBy(len(placement.outputs) * shards, lambda shard: shard) \
            .mapPartitionsWithIndex(lambda shard, pieces: _shard_task(shard, pieces, placement, shards, transforms,
                                                                      tmp, num_classes, compression, kind)).collect()
        for output in placement.outputs:
            written[output] = [shard for split, shard in results if split == output]
    return _manifest(plan, transforms, num_classes, written, all_bad.count)


@contextlib.contextmanager
def task_data_errors():
    """Raise a Spark task's user error (a DataError, a shard that a full disk refused) again on the driver, as a
    DataError."""
    try:
        yield
    except Exception as e:
        # Spark wraps a task's exception into its own, keeping only the worker's traceback text.
        found = re.search(rf"^{re.escape(DataError.__module__)}\.\w*Error: (.*)$", str(e), re.MULTILINE)
        if found is None:
            raise
        raise DataError(found.group(1)) from None


def _manifest(plan: EtlPlan, transforms: Transforms, num_classes: int, written: dict[str, list[tuple]],
              bad_records: int) -> Manifest:
    source, columns = plan.source, transforms.columns
    stats = written[STATS_SPLIT]
    feature_shape = (len(columns.get("numeric", [])),) if columns else tuple(source.feature_shape)
    rows = sum(shard.info.rows for shard in stats)
    count = rows * math.prod(feature_shape)
    mean = sum(shard.total for shard in stats) / max(count, 1)
    std = math.sqrt(max(sum(shard.squares for shard in stats) / max(count, 1) - mean * mean, 0.0))
    columns_of_steps = plan.options.source_options.sequences or plan.options.source_options.bags
    sequences = _sequence_columns(source, written, transforms) if columns_of_steps else []
    if columns or sequences:  # a table's row, a sequence, go to the model as stored (docs/tables.md, sequences.md)
        mean, std = 0.0, 1.0
    if not std > 0:
        raise DataError(f"{source.spec}: every {STATS_SPLIT} feature is {mean}; expected varying values (std > 0)")
    scale, offset = transforms.scale_offset
    target = source.target
    order = [split for split in ("train", "validation", "test") if split in written]
    carved = [{"name": "split", "split": name, "from": "train", "fraction": fraction,
               "stratified": source.target.kind in ("class", "binary"), "seed": plan.seed}
              for name, fraction in zip(*plan.carving("train"))]
    return Manifest(
        feature_shape=feature_shape, feature_dtype=transforms.feature_dtype,
        scale=scale, offset=offset, mean=mean, std=std, num_classes=num_classes,
        label_counts={split: [int(c) for c in sum(shard.counts for shard in written[split])] for split in order},
        splits={split: [shard.info for shard in written[split]] for split in order},
        source=source.spec, seed=plan.seed, transforms=carved + transforms.manifest_entries(),
        class_names=list(source.class_names), bad_records=bad_records,
        compression=plan.options.compression, chunk_rows=CHUNK_ROWS, checksums="fletcher32", target=target.kind,
        target_names=list(target.columns) if target.kind != "class" else [], columns=columns, sequences=sequences,
        step_target=getattr(source, "step_target", ""), **_target_statistics(stats, rows, target.kind),
        id_dtype=ID_DTYPE if holds_ids(columns, sequences) else "")


def _target_statistics(stats: list[ShardWritten], rows: int, kind: str) -> dict[str, list[float]]:
    """A regression target's `target_mean` and `target_std` per column over the train split's rows (a std of 0
    counts as 1: a constant column is only centred), for `data.standardize_targets`; nothing for other targets."""
    if kind != "regression":
        return {}
    mean, std = mean_and_std(sum(shard.target_total for shard in stats), sum(shard.target_squares for shard in stats),
                             rows)
    return {"target_mean": mean.tolist(), "target_std": std.tolist()}


def _sequence_columns(source, written: dict[str, list[ShardWritten]], transforms: Transforms) -> list[dict]:
    """The manifest's `sequences`: each column's step features, the longest allowed and written, its steps per
    split (the reader sizes its windows by their mean), and its mean and std per channel when standardized (a bag
    column's: its vocabulary or hash buckets, `bag: true`)."""
    columns = []
    for name in source.sequences:
        stats = [shard.steps[name] for results in written.values() for shard in results]
        column = {"name": name, "features": source.step_features[name], "max_length": source.options.max_length,
                  "longest": max(total_longest for _, total_longest, _, _, _ in stats),
                  "shortest": min(shortest for _, _, shortest, _, _ in stats),
                  "steps": {split: sum(shard.steps[name][0] for shard in results) for split, results in written.items()}}
        ids = [bound for *_, bound, _ in stats if bound is not None]
        if ids and min(ids) > 0:  # every value a non-negative integer: token ids, 0..ids-1
            column["ids"] = max(ids)
        entry = transforms.sequence_entry(name)
        if not entry.get("bag") and any(integer for *_, integer in stats):  # stored as integers (token ids)
            column["integer"] = True
        columns.append({**column, **entry})
    return columns


def _sequence_stats(seqs) -> tuple:
    """A shard's (steps, longest, shortest, ids, integer) of a sequence column as stored: ids as `token_ids` gives
    them (0: not token ids), None for no values; integer: whether its values are integers (stored as int32)."""
    ids = token_ids(seqs.values) if seqs.values.size else None
    return (int(seqs.offsets[-1]), int(seqs.lengths.max(initial=0)), int(seqs.lengths.min(initial=MAX_LENGTH)), ids,
            seqs.values.dtype.kind in "iu")
