"""Ragged sequences with a known rule, for tests and benchmarks: as Parquet records (what the ETL reads) or written
straight into shards with the real shard writer (no Spark); and IDX images as sequences of their rows, in Parquet.

The rule needs memory across time: a sequence is noise of 10-200 steps of `features` numbers, with one of `classes`
motifs (a fixed pattern of `MOTIF_STEPS` steps) placed at a random step; the class is which motif. A model must
find the motif wherever it lies and however long the sequence is: an LSTM carries it in its state to the end, a
1-D convolution with global max pooling detects it where it is.
"""
from __future__ import annotations

import numpy as np

from mpitrain.data.sequences import Ragged
from mpitrain.data.shards import Manifest, shard_path, write_manifest, write_shard

MOTIF_STEPS = 4


def motif_sequences(n: int, seed: int = 0, classes: int = 4, features: int = 2, lengths=(10, 200),
                    noise: float = 0.5) -> tuple[list[np.ndarray], np.ndarray]:
    """`n` sequences (float32 arrays (steps, features)) and their classes (int32)."""
    motifs = np.random.default_rng(12345).choice([-2.0, 2.0], size=(classes, MOTIF_STEPS, features))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n).astype(np.int32)
    sequences = []
    for label in labels:
        steps = int(rng.integers(lengths[0], lengths[1] + 1))
        values = rng.normal(0, noise, (steps, features))
        at = int(rng.integers(0, steps - MOTIF_STEPS + 1))
        values[at:at + MOTIF_STEPS] += motifs[label]
        sequences.append(values.astype(np.float32))
    return sequences, labels


def ragged(sequences: list[np.ndarray]) -> Ragged:
    """A list of (steps, F) arrays as one `Ragged`."""
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int64)
    return Ragged(np.concatenate(sequences).astype(np.float32), offsets)


def write_parquet(path, sequences: list[np.ndarray], labels: np.ndarray, column: str = "readings") -> None:
    """The sequences as Parquet records: `label` and `column`, a list of steps (a list of numbers per step, or one
    number per step when there is one feature)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    steps = [s[:, 0].tolist() if s.shape[1] == 1 else s.tolist() for s in sequences]
    pq.write_table(pa.table({"label": pa.array(labels, pa.int32()), column: steps}), str(path))


def write_image_rows_parquet(path, idx_folder: str, split: str, limit: int | None = None,
                             column: str = "rows") -> int:
    """Split `split` (train, test) of an IDX folder (Fashion-MNIST) as Parquet records of `label` and `column`: each
    image a sequence of its pixel rows (28 steps of 28 numbers, pixel / 255); its first `limit` images or all.
    Returns the records written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mpitrain.etl.idx import find_splits, read_records
    images, labels = find_splits(idx_folder)[split]
    count = images.count if limit is None else min(limit, images.count)
    pixels = read_records(images, 0, count).astype(np.float32) / 255
    height, width = pixels.shape[1:]
    steps = pa.ListArray.from_arrays(pa.array(np.arange(count * height + 1, dtype=np.int32) * width),
                                     pa.array(pixels.reshape(-1), pa.float32()))
    rows = pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32) * height), steps)
    pq.write_table(pa.table({"label": pa.array(read_records(labels, 0, count), pa.int32()), column: rows}), str(path))
    return count


def make_sequence_dataset(path, n_train: int = 600, n_test: int = 200, shards: int = 2, seed: int = 0,
                          classes: int = 4, features: int = 2, lengths=(10, 200), column: str = "readings") -> Manifest:
    """A dataset of one sequence column (`motif_sequences`), written as the ETL writes one."""
    splits, counts, steps, longest = {}, {}, {}, 0
    for split, n, salt in (("train", n_train, 0), ("test", n_test, 1)):
        sequences, labels = motif_sequences(n, seed * 2 + salt, classes, features, lengths)
        bounds = [i * n // shards for i in range(shards + 1)]
        splits[split] = [write_shard(str(path), shard_path(split, i), np.empty((b - a, 0), np.float32), labels[a:b],
                                     sequences={column: ragged(sequences[a:b])})
                         for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        counts[split] = np.bincount(labels, minlength=classes).tolist()
        steps[split] = sum(map(len, sequences))
        longest = max(longest, max(map(len, sequences)))
    manifest = Manifest(feature_shape=(0,), feature_dtype="float32", scale=1.0, offset=0.0, mean=0.0, std=1.0,
                        num_classes=classes, label_counts=counts, splits=splits, source="synthetic", seed=seed,
                        checksums="fletcher32", sequences=[{"name": column, "features": features,
                                                            "max_length": lengths[1], "longest": longest,
                                                            "steps": steps}])
    write_manifest(str(path), manifest)
    return manifest
