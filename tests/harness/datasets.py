"""Small datasets for tests and benchmarks, written with the real shard writer (no Spark), a
small MLP config for them, and IDX files as Debian's Fashion-MNIST ships them."""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from mpitrain.data.encoding import ID_DTYPE
from mpitrain.data.shards import Manifest, shard_path, write_manifest, write_shard
from mpitrain.etl.idx import IMAGES_MAGIC, LABELS_MAGIC


def make_dataset(path, n_train=600, n_test=200, shards=3, num_classes=3, shape=(1, 4, 4), seed=0,
                 checksums="fletcher32", target="class") -> Manifest:
    """Write a learnable dataset: uint8 features around a class-specific mean pattern. Its shards carry Fletcher-32
    checksums per chunk, as the ETL writes them; `checksums=""` makes the manifest say they do not (an older
    dataset's: readers then check the whole file's sha256). `target` other than class turns the class into y:
    binary, "is it class 0"; multilabel, "is it class 0" and "is it class 1"; regression, two numbers of unlike
    scales from v = class / (classes - 1) plus a tenth of the row's mean pixel / 255: 200 + 100 v (a target in
    raw units, hundreds, as a user's often is) and 1 - v, with their train mean and std in the manifest as the ETL
    records them."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(40, 215, size=(num_classes, *shape))
    splits, counts, statistics = {}, {}, {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, num_classes, size=n).astype(np.int32)
        x = np.clip(centers[y] + rng.normal(0, 30, size=(n, *shape)), 0, 255).astype(np.uint8)
        y = _target_of(target, y, x)
        bounds = [i * n // shards for i in range(shards + 1)]
        splits[split] = [write_shard(str(path), shard_path(split, i), x[a:b], y[a:b])
                         for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        counts[split] = np.bincount(y, minlength=num_classes).tolist() if target == "class" else []
        if split == "train" and target == "regression":  # the ETL's target statistics
            statistics = {"target_mean": y.mean(axis=0, dtype=np.float64).tolist(),
                          "target_std": y.std(axis=0, dtype=np.float64).tolist()}
    scaled = x / 255.0
    manifest = Manifest(feature_shape=tuple(shape), feature_dtype="uint8", scale=1 / 255, offset=0.0,
                        mean=float(scaled.mean()), std=float(scaled.std()), num_classes=num_classes,
                        label_counts=counts, splits=splits, source="synthetic", seed=seed, checksums=checksums,
                        target=target, target_names=TARGET_NAMES[target], **statistics)
    write_manifest(str(path), manifest)
    return manifest


TARGET_NAMES = {"class": [], "binary": ["is_0"], "multilabel": ["is_0", "is_1"], "regression": ["value", "rest"]}


def _target_of(target: str, labels: np.ndarray, x: np.ndarray) -> np.ndarray:
    """make_dataset's y for `target`, from the class labels and the features."""
    if target == "class":
        return labels
    if target in ("binary", "multilabel"):
        return np.stack([labels == c for c in range(len(TARGET_NAMES[target]))], axis=1).astype(np.float32)
    value = labels / max(labels.max(initial=1), 1) + 0.1 * x.reshape(len(x), -1).mean(axis=1) / 255.0
    return np.stack([200.0 + 100.0 * value, 1.0 - value], axis=1).astype(np.float32)


def flip_a_byte_in_a_chunk(shard, dataset: str = "x", chunk: int = 0) -> None:
    """Damage one byte of a chunk of `dataset` in the shard file, as a disk or a network might: HDF5's Fletcher-32
    check fails when that chunk is read."""
    import h5py
    with h5py.File(shard, "r") as f:
        info = f[dataset].id.get_chunk_info(chunk)
    with open(shard, "rb+") as f:
        f.seek(info.byte_offset + info.size // 2)
        value = f.read(1)
        f.seek(info.byte_offset + info.size // 2)
        f.write(bytes([value[0] ^ 0xFF]))


def make_digits_dataset(path, shards=2, seed=0, test_fraction=0.2, validation_fraction=0.0) -> Manifest:
    """scikit-learn's digits (8x8, values 0..16, scale 1/16) in a seeded train/test split, written without Spark;
    `validation_fraction` of all rows also go to a `validation` split (the ETL's --validation-fraction)."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    n_test, n_validation = round(test_fraction * len(order)), round(validation_fraction * len(order))
    x_all = digits.images.astype(np.uint8).reshape(-1, 1, 8, 8)
    y_all = digits.target.astype(np.int32)
    splits, counts = {}, {}
    parts = {"train": order[n_test + n_validation:], "test": order[:n_test],
             "validation": order[n_test:n_test + n_validation]}
    for split, rows in ((split, rows) for split, rows in parts.items() if len(rows)):
        x, y = x_all[rows], y_all[rows]
        bounds = [i * len(rows) // shards for i in range(shards + 1)]
        splits[split] = [write_shard(str(path), shard_path(split, i), x[a:b], y[a:b])
                         for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        counts[split] = np.bincount(y, minlength=10).tolist()
    scaled = x_all[parts["train"]] / 16
    manifest = Manifest(feature_shape=(1, 8, 8), feature_dtype="uint8", scale=1 / 16, offset=0.0,
                        mean=float(scaled.mean()), std=float(scaled.std()), num_classes=10,
                        label_counts=counts, splits=splits, source="digits:", seed=seed)
    write_manifest(str(path), manifest)
    return manifest


def make_fashion_dataset(path, idx_folder: str, limit: int | None = None, shards: int = 4) -> Manifest:
    """Fashion-MNIST's images from an IDX folder as the ETL's `--source idx:` writes them, but without Spark (the GPU
    machine has none: benchmarks/gpu_check.py): each split's first `limit` images or all, in file order, unshuffled.
    """
    from mpitrain.etl.idx import find_splits, read_records
    splits, counts, train = {}, {}, None
    for split, (images, labels) in find_splits(idx_folder).items():
        count = images.count if limit is None else min(limit, images.count)
        x, y = read_records(images, 0, count)[:, None], read_records(labels, 0, count).astype(np.int32)
        bounds = [i * count // shards for i in range(shards + 1)]
        splits[split] = [write_shard(str(path), shard_path(split, i), x[a:b], y[a:b])
                         for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        counts[split] = np.bincount(y, minlength=10).tolist()
        train = x / 255.0 if split == "train" else train
    manifest = Manifest(feature_shape=train.shape[1:], feature_dtype="uint8", scale=1 / 255, offset=0.0,
                        mean=float(train.mean()), std=float(train.std()), num_classes=10, label_counts=counts,
                        splits=splits, source=f"idx:{idx_folder}", seed=0)
    write_manifest(str(path), manifest)
    return manifest


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
        "report": False,  # drawing costs a second or two; tests/mpi/test_report.py turns it on
    }
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return str(path)



ROWS = {"train": 103, "test": 37}


PREFIX = {"train": "train", "test": "t10k"}


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    data = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def make_idx_folder(folder: Path, seed: int = 0, labels_override: dict | None = None) -> dict:
    """Random 28x28 IDX data (train gzipped, test plain); returns {split: (images, labels)}."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    data = {}
    for split, n in ROWS.items():
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        labels[:10] = np.arange(10, dtype=np.uint8)  # every class present
        if labels_override and split in labels_override:
            labels[labels_override[split][0]] = labels_override[split][1]
        suffix = ".gz" if split == "train" else ""
        write_idx(folder / f"{PREFIX[split]}-images-idx3-ubyte{suffix}", images, IMAGES_MAGIC)
        write_idx(folder / f"{PREFIX[split]}-labels-idx1-ubyte{suffix}", labels, LABELS_MAGIC)
        data[split] = (images, labels)
    return data


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name))



def read_split(dataset_dir, split: str = "train", rank: int = 0, ranks: int = 1, **options):
    """Rank `rank` of `ranks`'s evaluation share of `split` (all of it on one rank), read whole: (x, y); a table's x
    with categorical columns an `Inputs` of its numbers and ids."""
    from mpitrain.data.reader import DatasetReader
    from mpitrain.data.sequences import Inputs
    rows = DatasetReader(str(dataset_dir), SimpleNamespace(rank=rank, size=ranks), **options).eval_rows(split)
    parts = [(x.copy(), y.copy()) for x, y in rows.batches(1000)]
    y = np.concatenate([p[1] for p in parts])
    if isinstance(parts[0][0], Inputs):
        return Inputs(np.concatenate([p[0].x for p in parts]),
                      {name: np.concatenate([p[0].columns[name] for p in parts]) for name in parts[0][0].columns}), y
    return np.concatenate([p[0] for p in parts]), y


class Clicks:
    """A synthetic click-through table with a known probability per row: categorical columns of `ids` values each,
    drawn Zipf-like (value k with weight 1/(k+1)), and `numeric` standard normal columns. The logit is -1.5 plus a
    per-value effect of each categorical column plus a fixed linear term of the numbers. A value's effect is
    normal (sd 0.7) shrunk by c/(c+50) for a value expected c times in 10^6 rows: rare values matter little, so
    the true probabilities can be learned from a table of millions of rows (an effect seen twice cannot, and would
    cap any model's AUC below theirs). The effects are fixed; `draw(n, seed)` draws rows."""

    def __init__(self, ids=(100, 10000), numeric: int = 3):
        self.ids, self.numeric = tuple(ids), numeric
        self.frequencies = [(w := 1 / np.arange(1, k + 1)) / w.sum() for k in ids]
        self.effects = [np.random.default_rng(1000 + j).normal(0, 0.7, size=k) * (1e6 * p) / (1e6 * p + 50)
                        for j, (k, p) in enumerate(zip(ids, self.frequencies))]
        self.weights = np.random.default_rng(2000).normal(0, 0.5, size=numeric)

    def probability(self, numbers: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """The true click probability of rows of `numbers` (n, numeric) and value codes (n, columns)."""
        logit = -1.5 + sum(effect[codes[:, j]] for j, effect in enumerate(self.effects)) + numbers @ self.weights
        return 1 / (1 + np.exp(-logit))

    def draw(self, n: int, seed: int = 0):
        """(numbers float32 (n, numeric), codes int64 (n, columns), clicks float32 (n, 1), probabilities (n,))."""
        rng = np.random.default_rng(seed)
        codes = np.column_stack([rng.choice(k, size=n, p=p) for k, p in zip(self.ids, self.frequencies)])
        numbers = rng.normal(size=(n, self.numeric)).astype(np.float32)
        probability = self.probability(numbers, codes)
        clicks = (rng.random(n) < probability).astype(np.float32)[:, None]
        return numbers, codes, clicks, probability


def make_click_dataset(path, n_train=20000, n_test=5000, ids=(100, 10000), numeric=3, shards=2, seed=0) -> dict:
    """`Clicks` rows written as a table dataset (numeric columns in x, ids 0..k-1 per categorical column in ids, a
    binary target) without the ETL; returns the test rows' true probabilities and clicks."""
    numbers, codes, clicks, probability = Clicks(ids, numeric).draw(n_train + n_test, seed)
    x = numbers.astype(np.float32)
    splits = {}
    for split, (a, b) in (("train", (0, n_train)), ("test", (n_train, n_train + n_test))):
        bounds = np.linspace(a, b, shards + 1).astype(int)
        splits[split] = [write_shard(str(path), shard_path(split, i), x[lo:hi], clicks[lo:hi], ids=codes[lo:hi])
                         for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]
    columns = {"numeric": [{"name": f"n{j}"} for j in range(numeric)],
               "categorical": [{"name": f"c{j}", "ids": k} for j, k in enumerate(ids)]}
    write_manifest(str(path), Manifest(
        feature_shape=(x.shape[1],), feature_dtype="float32", scale=1.0, offset=0.0, mean=0.0, std=1.0,
        num_classes=2, label_counts={}, splits=splits, source="synthetic clicks", seed=seed,
        checksums="fletcher32", target="binary", target_names=["click"], columns=columns, id_dtype=ID_DTYPE))
    return {"probability": probability[n_train:], "clicks": clicks[n_train:, 0]}
