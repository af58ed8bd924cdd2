"""The Spark ETL job: a source in, a dataset folder (HDF5 shards + manifest) out.

Per split, tasks read their own record ranges (the driver never loads the data), every
row gets a random key from (seed, split, index), rows are sorted by it, numbered with
`zipWithIndex` and partitioned into exactly `shards` shards: shard i holds positions
[i*n//shards, (i+1)*n//shards). Each shard is written by its executor into a temporary
sibling of `out`; the driver then writes the manifest (the commit point) and renames
the folder into place. Only the RDD API is used, so it runs in local mode and on any
cluster whose executors share the file system holding `out`.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import shutil
import uuid
from dataclasses import dataclass

import numpy as np

from mpitrain.errors import ConfigError, DataError
from mpitrain.etl.sources import Source, open_source
from mpitrain.shard_format import MANIFEST_NAME, Manifest, shard_path, write_manifest, write_shard

STATS_SPLIT = "train"  # mean/std come from this split only, so test data never leaks into them


@dataclass(frozen=True)
class EtlPlan:
    """A validated request: everything checked that can be checked without Spark."""

    source: Source
    out: str
    shards: int
    seed: int
    overwrite: bool


def plan_etl(source: str, out: str, shards: int, seed: int = 0, overwrite: bool = False,
             test_fraction: float = 0.2) -> EtlPlan:
    """Check the output folder, open the source and check `shards` against its splits."""
    if seed < 0:
        raise ConfigError(f"--seed {seed}: expected an integer >= 0")
    out = os.path.abspath(out)
    _check_out(out, overwrite)
    opened = open_source(source, seed, test_fraction)
    rows = opened.split_rows()
    smallest = min(rows, key=rows.get)
    if not 1 <= shards <= rows[smallest]:
        raise ConfigError(f"--shards {shards}: expected 1..{rows[smallest]} "
                          f"(the {smallest} split of {source} has {rows[smallest]} rows)")
    return EtlPlan(opened, out, shards, seed, overwrite)


def run_etl(spark, source: str, out: str, shards: int, seed: int = 0, overwrite: bool = False,
            test_fraction: float = 0.2) -> Manifest:
    """Write the dataset `source` to `out` in `shards` shards per split; return its manifest."""
    return write_dataset(spark, plan_etl(source, out, shards, seed, overwrite, test_fraction))


def write_dataset(spark, plan: EtlPlan) -> Manifest:
    """Run a planned job; on any failure the temporary folder goes and `out` is untouched."""
    tmp = f"{plan.out}.etl-tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        with _task_data_errors():
            written = {split: _write_split(spark.sparkContext, plan, tmp, split, rows)
                       for split, rows in plan.source.split_rows().items()}
        manifest = _manifest(plan, written)
        write_manifest(tmp, manifest)
        _move_into_place(tmp, plan.out, plan.overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _check_out(out: str, overwrite: bool) -> None:
    if not os.path.lexists(out):
        return
    if not overwrite:
        raise DataError(f"{out}: exists; pass --overwrite to replace it")
    # --overwrite deletes the old folder, so it must be a dataset (or empty), never e.g. $HOME
    if not os.path.isdir(out) or (os.listdir(out) and not os.path.isfile(os.path.join(out, MANIFEST_NAME))):
        raise DataError(f"{out}: exists and is not a dataset folder (no {MANIFEST_NAME}); "
                        "refusing to replace it, even with --overwrite")


def _move_into_place(tmp: str, out: str, overwrite: bool) -> None:
    """Rename `tmp` to `out`; an old `out` is moved aside first and deleted only afterwards."""
    _check_out(out, overwrite)  # again: something may have appeared there while the job ran
    if not os.path.lexists(out):
        os.rename(tmp, out)
        return
    old = f"{out}.etl-old-{uuid.uuid4().hex[:8]}"
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old)


def _shuffle_key(seed: int, split: str, index: int) -> tuple[int, int]:
    """A random 64-bit key for one row, the same on every run with this seed; `index` breaks ties."""
    digest = hashlib.blake2b(f"{seed}/{split}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big"), index


def _keyed_rows(source: Source, seed: int, split: str, start: int, stop: int):
    """Rows [start, stop) of `split` as (shuffle key, (label, feature bytes))."""
    x, y = source.read(split, start, stop)
    for i in range(stop - start):
        yield _shuffle_key(seed, split, start + i), (int(y[i]), x[i].tobytes())


def _shard_task(source: Source, tmp: str, split: str, shard: int, rows):
    """Write one shard from its (position, (label, bytes)) rows.

    Returns [(ShardInfo, label counts, sum and sum of squares of the scaled features)].
    """
    rows = sorted(rows, key=lambda row: row[0])
    x = np.frombuffer(b"".join(features for _, (_, features) in rows), np.uint8)
    x = x.reshape(len(rows), *source.feature_shape)
    y = np.array([label for _, (label, _) in rows], np.int32)
    info = write_shard(tmp, shard_path(split, shard), x, y)
    values = x.astype(np.float64) * source.scale + source.offset
    counts = np.bincount(y, minlength=source.num_classes)
    return [(info, counts, float(values.sum()), float(np.square(values).sum()))]


def _write_split(sc, plan: EtlPlan, tmp: str, split: str, n: int) -> list[tuple]:
    """Shuffle and shard one split of `n` rows; the tasks' results in shard order (as collected)."""
    source, seed, shards = plan.source, plan.seed, plan.shards
    parts = min(n, sc.defaultParallelism)
    ranges = [(i * n // parts, (i + 1) * n // parts) for i in range(parts)]
    rows = sc.parallelize(ranges, parts).flatMap(lambda r: _keyed_rows(source, seed, split, *r))
    # The keys are uniform on [0, 2**64), so equal key ranges give a balanced sort without sampling.
    ordered = rows.repartitionAndSortWithinPartitions(parts, lambda key: key[0] * parts >> 64)
    # ((key, row), position) -> (position, row)
    positioned = ordered.zipWithIndex().map(lambda numbered: (numbered[1], numbered[0][1]))
    # position p belongs to the shard i with i*n//shards <= p < (i+1)*n//shards
    by_shard = positioned.partitionBy(shards, lambda p: ((p + 1) * shards - 1) // n)
    written = by_shard.mapPartitionsWithIndex(lambda shard, it: _shard_task(source, tmp, split, shard, it))
    return written.collect()


@contextlib.contextmanager
def _task_data_errors():
    """Raise a Spark task's DataError again on the driver, as a DataError."""
    try:
        yield
    except Exception as e:
        # Spark wraps a task's exception into its own, keeping only the worker's traceback text.
        found = re.search(r"^mpitrain\.errors\.DataError: (.*)$", str(e), re.MULTILINE)
        if found is None:
            raise
        raise DataError(found.group(1)) from None


def _manifest(plan: EtlPlan, written: dict[str, list[tuple]]) -> Manifest:
    source = plan.source
    stats = written[STATS_SPLIT]
    count = sum(info.rows for info, *_ in stats) * math.prod(source.feature_shape)
    mean = sum(total for *_, total, _ in stats) / count
    std = math.sqrt(max(sum(squares for *_, squares in stats) / count - mean * mean, 0.0))
    if not std > 0:
        raise DataError(f"{source.spec}: every {STATS_SPLIT} feature is {mean}; expected varying values (std > 0)")
    return Manifest(
        feature_shape=source.feature_shape, feature_dtype=source.feature_dtype,
        scale=source.scale, offset=source.offset, mean=mean, std=std, num_classes=source.num_classes,
        label_counts={split: [int(c) for c in sum(counts for _, counts, *_ in results)]
                      for split, results in written.items()},
        splits={split: [info for info, *_ in results] for split, results in written.items()},
        source=source.spec, seed=plan.seed, transforms=[])
