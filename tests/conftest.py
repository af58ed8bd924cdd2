"""Shared fixtures: small datasets written with the real shard writer, and an mpiexec launcher."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from mpitrain.shard_format import Manifest, shard_path, write_manifest, write_shard

# pip's MPICH runs over UCX; on some hosts UCX's network address exchange fails at MPI_Init now
# and then ("failed to unpack address, invalid bandwidth 0.00", pmodels/mpich#7417). The tests
# run on one node: shared memory is all they need. Exported, so Slurm jobs inherit it too.
os.environ.setdefault("UCX_TLS", "self,sm")
VENV_BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(VENV_BIN, "mpiexec")
MPITRAIN = os.path.join(VENV_BIN, "mpitrain")
FASHION = "/usr/share/datasets/fashion-mnist"


def make_dataset(path, n_train=600, n_test=200, shards=3, num_classes=3, shape=(1, 4, 4), seed=0) -> Manifest:
    """Write a learnable dataset: uint8 features around a class-specific mean pattern."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(40, 215, size=(num_classes, *shape))
    splits, counts = {}, {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, num_classes, size=n).astype(np.int32)
        x = np.clip(centers[y] + rng.normal(0, 30, size=(n, *shape)), 0, 255).astype(np.uint8)
        bounds = [i * n // shards for i in range(shards + 1)]
        splits[split] = [write_shard(str(path), shard_path(split, i), x[a:b], y[a:b])
                         for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        counts[split] = np.bincount(y, minlength=num_classes).tolist()
    scaled = x / 255.0
    manifest = Manifest(feature_shape=tuple(shape), feature_dtype="uint8", scale=1 / 255, offset=0.0,
                        mean=float(scaled.mean()), std=float(scaled.std()), num_classes=num_classes,
                        label_counts=counts, splits=splits, source="synthetic", seed=seed)
    write_manifest(str(path), manifest)
    return manifest


@pytest.fixture(scope="module")
def spark():
    """One local[2] SparkSession per test module (starting one takes seconds)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = SparkSession.builder.master("local[2]").appName("mpitrain-tests") \
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def make_digits_dataset(path, shards=2, seed=0, test_fraction=0.2) -> Manifest:
    """scikit-learn's digits (8x8, values 0..16, scale 1/16) in a seeded train/test split, written without Spark."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    n_test = round(test_fraction * len(order))
    x_all = digits.images.astype(np.uint8).reshape(-1, 1, 8, 8)
    y_all = digits.target.astype(np.int32)
    splits, counts = {}, {}
    for split, rows in (("train", order[n_test:]), ("test", order[:n_test])):
        x, y = x_all[rows], y_all[rows]
        bounds = [i * len(rows) // shards for i in range(shards + 1)]
        splits[split] = [write_shard(str(path), shard_path(split, i), x[a:b], y[a:b])
                         for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        counts[split] = np.bincount(y, minlength=10).tolist()
    scaled = x_all[order[n_test:]] / 16
    manifest = Manifest(feature_shape=(1, 8, 8), feature_dtype="uint8", scale=1 / 16, offset=0.0,
                        mean=float(scaled.mean()), std=float(scaled.std()), num_classes=10,
                        label_counts=counts, splits=splits, source="digits:", seed=seed)
    write_manifest(str(path), manifest)
    return manifest


@pytest.fixture
def dataset(tmp_path):
    make_dataset(tmp_path / "data")
    return tmp_path / "data"


def write_config(path, dataset_dir, **sections) -> str:
    """A small MLP config for `dataset_dir`; keyword arguments replace or extend sections."""
    import yaml
    config = {
        "data": {"path": str(dataset_dir)},
        "model": {"layers": [{"type": "dense", "units": 16, "activation": "relu"}, {"type": "dense", "units": 3}]},
        "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9},
        "train": {"epochs": 2, "batch_size": 16, "seed": 1, "log_every": 10},
        "sync": {"mode": "allreduce"},
        "run_dir": str(os.path.join(os.path.dirname(path), "run")),
        "report": False,  # drawing costs a second or two; tests/test_report.py turns it on
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return str(path)


def command(*args, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """Run a command with a timeout, so a hang fails the test instead of stalling CI."""
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
               "PYSPARK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=timeout, env=run_env)


def mpiexec(n: int, *args, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """Run `mpiexec -n N ARGS...` with a timeout."""
    return command(MPIEXEC, "-n", n, *args, timeout=timeout, env=env)


def require_fashion_mnist() -> None:
    """Skip without Debian's dataset-fashion-mnist; under CI=true its absence is a failure."""
    if not os.path.isdir(FASHION):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{FASHION} is missing; CI needs Debian's dataset-fashion-mnist (make fashion-mnist)")
        pytest.skip(f"{FASHION} not installed")
