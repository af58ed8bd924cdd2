"""Rows/s of the Spark ETL on a generated CSV, beside a single-process pandas/numpy + h5py conversion of the same file.

The CSV has a header, a label column and 784 integer features 0..255 (half of them 0, like
image pixels), `--rows` rows (default 1,000,000). Both conversions do the same job: parse,
check, shuffle with a seed, carve a 20% test split, write 8 uint8 HDF5 shards per split and
compute the train mean/std. Spark runs `mpitrain.etl` in local mode on `--cores` cores
(default 2) from an already started session (its start-up is reported apart); the baseline
is `pandas.read_csv` (C parser), a numpy permutation and h5py in one process, timed in the
same run. Each figure is the best of `--repeat` runs.

Target: Spark >= 0.7x the single process's rows/s on one machine.

    python benchmarks/etl.py [--rows 1000000] [--cores 2] [--repeat 1] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import h5py
import numpy as np

from mpitrain.data.shards import shard_path
from mpitrain.etl.job import run_etl
from mpitrain.etl.sources import SourceOptions

from common import markdown_table, write_results

FEATURES = 784
CLASSES = 10
SHARDS = 8
TEST_FRACTION = 0.2
BLOCK = 20000  # rows generated per write


def csv_block(values: np.ndarray) -> bytes:
    """Integers 0..255 (rows, columns) as CSV text, built with numpy (no per-value Python formatting)."""
    flat = values.reshape(-1).astype(np.int64)
    digits = 1 + (flat >= 10) + (flat >= 100)
    ends = np.cumsum(digits + 1)  # each value, then ',' or '\n'
    text = np.empty(ends[-1], np.uint8)
    for k in range(3):  # digit k (0: units) sits k + 1 characters before the separator
        has = digits > k
        text[ends[has] - 2 - k] = 48 + (flat[has] // 10 ** k) % 10
    text[ends - 1] = ord(",")
    text[ends[values.shape[1] - 1::values.shape[1]] - 1] = ord("\n")
    return text.tobytes()


def generate_csv(path: str, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write((",".join(["label", *[f"pixel{j}" for j in range(FEATURES)]]) + "\n").encode())
        for start in range(0, rows, BLOCK):
            n = min(BLOCK, rows - start)
            pixels = np.where(rng.random((n, FEATURES)) < 0.5, 0, rng.integers(1, 256, (n, FEATURES)))
            f.write(csv_block(np.column_stack([rng.integers(0, CLASSES, n), pixels])))


def convert_single_process(csv: str, out: str, seed: int) -> tuple[float, float]:
    """The baseline: one process reads, checks, shuffles, splits and writes the same shards."""
    import pandas as pd
    table = pd.read_csv(csv, dtype=np.float32, engine="c").to_numpy()
    labels, x = table[:, 0], table[:, 1:]
    good = np.isfinite(table).all(axis=1) & (labels >= 0) & (x >= 0).all(axis=1) & (x <= 255).all(axis=1)
    labels, x = labels[good].astype(np.int32), x[good].astype(np.uint8).reshape(-1, 1, 28, 28)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = round(TEST_FRACTION * len(labels))
    for split, rows in (("test", order[:n_test]), ("train", order[n_test:])):
        bounds = [i * len(rows) // SHARDS for i in range(SHARDS + 1)]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            path = os.path.join(out, shard_path(split, i))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            take = np.sort(rows[a:b])
            with h5py.File(path, "w") as f:
                f.create_dataset("x", data=x[take], chunks=(1024, 1, 28, 28))
                f.create_dataset("y", data=labels[take], chunks=(1024,))
    train = x[order[n_test:]] / 255.0
    return float(train.mean()), float(train.std())  # the manifest's mean/std


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--work", default=None, help="scratch folder for the CSV and outputs (default: a temporary one)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    work = tempfile.mkdtemp(prefix="etl-bench-", dir=args.work)
    try:
        csv = os.path.join(work, "data.csv")
        start = time.perf_counter()
        generate_csv(csv, args.rows)
        generate_s = time.perf_counter() - start
        start = time.perf_counter()
        spark = SparkSession.builder.master(f"local[{args.cores}]").appName("etl-benchmark") \
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false") \
            .config("spark.driver.memory", "4g").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        startup_s = time.perf_counter() - start
        seconds = {"spark": [], "single_process": []}
        try:
            for attempt in range(args.repeat):  # interleaved, so drift reaches both alike
                out = os.path.join(work, f"spark-{attempt}")
                start = time.perf_counter()
                run_etl(spark, f"csv:{csv}", out, SHARDS, seed=attempt, test_fraction=TEST_FRACTION,
                        source_options=SourceOptions(feature_shape=(1, 28, 28), feature_dtype="uint8"))
                seconds["spark"].append(time.perf_counter() - start)
                shutil.rmtree(out)
                out = os.path.join(work, f"single-{attempt}")
                start = time.perf_counter()
                convert_single_process(csv, out, seed=attempt)
                seconds["single_process"].append(time.perf_counter() - start)
                shutil.rmtree(out)
        finally:
            spark.stop()
        best = {name: min(times) for name, times in seconds.items()}
        result = {"rows": args.rows, "features": FEATURES, "cores": args.cores, "repeat": args.repeat,
                  "csv_bytes": os.path.getsize(csv), "generate_s": generate_s, "spark_startup_s": startup_s,
                  "seconds": seconds, "rows_per_s": {name: args.rows / s for name, s in best.items()},
                  "spark_vs_single": best["single_process"] / best["spark"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_results(args.out, "etl", result, markdown(result))
    return result


def markdown(result: dict) -> str:
    rows = [[name, f"{result['cores'] if name == 'spark' else 1}", f"{min(result['seconds'][name]):.1f}",
             f"{result['rows_per_s'][name]:.0f}",
             f"{result['rows_per_s'][name] / result['rows_per_s']['single_process']:.2f}x"]
            for name in ("spark", "single_process")]
    return "\n".join([
        f"{result['rows']} rows x {result['features']} features, CSV of {result['csv_bytes'] / 1e9:.2f} GB -> 8 uint8 "
        f"HDF5 shards per split (20% test), best of {result['repeat']}; Spark session start-up "
        f"{result['spark_startup_s']:.1f} s, not counted. Target: Spark >= 0.7x the single process.", "",
        markdown_table(["conversion", "cores", "seconds", "rows/s", "vs single process"], rows, "lrrrr")]) + "\n"


if __name__ == "__main__":
    main()
