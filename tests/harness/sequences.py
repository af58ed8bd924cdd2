"""Ragged sequences with a known rule, for tests and benchmarks: as Parquet records (what the ETL reads) or written
straight into shards with the real shard writer (no Spark); and IDX images as sequences of their rows, in Parquet.

Several inputs (`mixed_inputs`, `make_mixed_dataset`): two sequence columns of other lengths and widths beside fixed
features, the class a rule of all three, which only a graph model reading every input can learn.

A class per step (sequence labelling, `tagged_sequences`): step t's class is whether the running sum of the first
feature up to t is positive, which only a model that carries the sum along the sequence can tell.

The rule needs memory across time: a sequence is noise of 10-200 steps of `features` numbers, with one of `classes`
motifs (a fixed pattern of `MOTIF_STEPS` steps) placed at a random step; the class is which motif. A model must
find the motif wherever it lies and however long the sequence is: an LSTM carries it in its state to the end, a
1-D convolution with global max pooling detects it where it is.
"""
from __future__ import annotations

import numpy as np

from mpitrain.data.encoding import HASH, ID_DTYPE
from mpitrain.data.sequences import Ragged, SequenceBatch, token_ids
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


def tagged_sequences(n: int, seed: int = 0, features: int = 2, lengths=(10, 200)) -> tuple[list, list]:
    """`n` sequences (float32 (steps, features)) and each one's classes per step (int32 (steps,))."""
    rng = np.random.default_rng(seed)
    sequences = [rng.normal(0, 1, (int(rng.integers(lengths[0], lengths[1] + 1)), features)).astype(np.float32)
                 for _ in range(n)]
    return sequences, [(np.cumsum(s[:, 0]) > 0).astype(np.int32) for s in sequences]


def token_sequences(n: int, seed: int = 0, ids: int = 40, classes: int = 3, lengths=(5, 50)) -> tuple[list, np.ndarray]:
    """`n` sequences of token ids (float32 (steps, 1); filler ids `classes`..ids-1) each holding one keyword id (0..
    classes-1) somewhere, and their classes: which keyword."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n).astype(np.int32)
    sequences = []
    for label in labels:
        tokens = rng.integers(classes, ids, int(rng.integers(lengths[0], lengths[1] + 1)))
        tokens[rng.integers(0, len(tokens))] = label
        sequences.append(tokens.astype(np.float32)[:, None])
    return sequences, labels


def ragged(sequences: list[np.ndarray], dtype=np.float32) -> Ragged:
    """A list of (steps, F) arrays as one `Ragged` of `dtype` values (a bag's: ids)."""
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int64)
    return Ragged(np.concatenate(sequences).astype(dtype), offsets)


def write_parquet(path, sequences: list[np.ndarray], labels, column: str = "readings", integer: bool = False) -> None:
    """The sequences as Parquet records: `label` (a class per record, or a list of classes per step) and `column`,
    a list of steps (a list of numbers per step, or one number per step when there is one feature: integers with
    `integer`, as token ids)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    steps = [(s[:, 0].astype(np.int64) if integer else s[:, 0]).tolist() if s.shape[1] == 1 else s.tolist()
             for s in sequences]
    label = pa.array(labels, pa.int32()) if isinstance(labels, np.ndarray) else [list(map(int, c)) for c in labels]
    pq.write_table(pa.table({"label": label, column: steps}), str(path))


RULES = ("motifs", "tagged", "tokens")


def mixed_inputs(n: int, seed: int = 0, lengths=((10, 120), (5, 60))) -> tuple[np.ndarray, dict, np.ndarray]:
    """`n` rows of two sequence columns beside two fixed features, and their classes (4), by a rule that needs every
    input: which of two motifs `readings` (2 features, `lengths[0]` steps) holds, times 2, plus which of two motifs
    `events` (1 feature, `lengths[1]` steps) holds, flipped where the first fixed feature is negative. Returns
    (x float32 (n, 2), {column: sequences}, classes int32)."""
    readings, high = motif_sequences(n, seed, classes=2, features=2, lengths=lengths[0])
    events, low = motif_sequences(n, seed + 1000, classes=2, features=1, lengths=lengths[1])
    x = np.random.default_rng(seed + 2000).normal(size=(n, 2)).astype(np.float32)
    return x, {"readings": readings, "events": events}, (2 * high + (low ^ (x[:, 0] < 0))).astype(np.int32)


class BagClicks:
    """A click table with a bag column `recent` (a user's recent ids: `lengths` of them, drawn Zipf-like from `ids`,
    value k with weight 1/(k+1)) beside two standard normal numbers, its clicks drawn from a known probability:
    logit -1 + 3 x the mean of the bag's ids' effects (fixed, normal, sd 0.7) + 0.8 n0 - 0.5 n1. The effects are
    fixed; `draw(n, seed)` draws rows, `probability` recomputes a row's (the Bayes-optimal score)."""

    def __init__(self, ids: int = 500, lengths=(1, 12)):
        self.ids, self.lengths = ids, tuple(lengths)
        self.effects = np.random.default_rng(4321).normal(0, 0.7, ids)
        self.weights = np.array([0.8, -0.5])
        frequencies = 1 / np.arange(1, ids + 1)
        self.frequencies = frequencies / frequencies.sum()

    def probability(self, numbers: np.ndarray, bags: list) -> np.ndarray:
        """The click probability of rows of `numbers` (n, 2) and `bags` (each an array of ids)."""
        mean_effect = np.array([self.effects[np.asarray(bag, np.int64)].mean() if len(bag) else 0.0 for bag in bags])
        return 1 / (1 + np.exp(-(-1 + 3 * mean_effect + numbers @ self.weights)))

    def draw(self, n: int, seed: int = 0) -> tuple[np.ndarray, list, np.ndarray, np.ndarray]:
        """(numbers float32 (n, 2), bags (int64 arrays), clicks int32 (n,), probabilities (n,))."""
        rng = np.random.default_rng(seed)
        counts = rng.integers(self.lengths[0], self.lengths[1] + 1, n)
        bags = np.split(rng.choice(self.ids, size=int(counts.sum()), p=self.frequencies), np.cumsum(counts)[:-1])
        numbers = rng.normal(size=(n, 2)).astype(np.float32)
        probability = self.probability(numbers.astype(np.float64), bags)
        return numbers, bags, (rng.random(n) < probability).astype(np.int32), probability


def make_bag_dataset(path, n_train: int = 4000, n_test: int = 1000, shards: int = 2, seed: int = 0,
                     ids: int = 500, lengths=(0, 12), categorical: dict[str, int] | None = None) -> Manifest:
    """A click table of `BagClicks` rows (2 classes: no click, click), written as the ETL writes one: the bag column
    `recent` of ids (`lengths` of them, empty bags by default) beside two fixed numbers and the `categorical`
    columns ({name: ids}, uniform ids of no effect on the clicks)."""
    def rows(n: int, seed: int):
        numbers, bags, clicks, _ = BagClicks(ids, lengths).draw(n, seed)
        return numbers, {"recent": [bag.astype(np.float32)[:, None] for bag in bags]}, clicks
    return write_sequence_dataset(path, rows, n_train, n_test, shards, seed, 2, {"recent": lengths[1]},
                                  bags=("recent",), categorical=categorical)


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


def make_fashion_rows_dataset(path, idx_folder: str, limit: int | None = None, shards: int = 2) -> Manifest:
    """Fashion-MNIST's images as sequences of their rows (28 steps of 28 numbers, pixel / 255), the dataset
    `mpitrain etl --sequence rows` makes of `write_image_rows_parquet`'s records, written without Spark (the GPU
    machine has none): each split's first `limit` images or all."""
    from mpitrain.etl.idx import find_splits, read_records
    splits = find_splits(idx_folder)

    def rows(split: str):
        images, labels = splits[split]
        count = images.count if limit is None else min(limit, images.count)
        pixels = read_records(images, 0, count).astype(np.float32) / 255
        return np.empty((count, 0), np.float32), {"rows": list(pixels)}, read_records(labels, 0, count).astype(np.int32)
    by_split = {"train": rows("train"), "test": rows("test")}
    n_train, n_test = (len(by_split[split][2]) for split in ("train", "test"))
    return write_sequence_dataset(path, lambda n, seed: by_split["train" if seed % 2 == 0 else "test"], n_train,
                                  n_test, shards, 0, 10, {"rows": 28})


def make_sequence_dataset(path, n_train: int = 600, n_test: int = 200, shards: int = 2, seed: int = 0,
                          classes: int = 4, features: int = 2, lengths=(10, 200), column: str = "readings",
                          rule: str = "motifs") -> Manifest:
    """A dataset of one sequence column, written as the ETL writes one, by `rule` (one of RULES): `motif_sequences`;
    `tagged`: `tagged_sequences`, a class per step in the step target `tags` (2 classes); `tokens`:
    `token_sequences` (40 ids, 3 classes: the manifest's column has `ids`), stored as integers (int32), as the ETL
    stores a Parquet list of integers."""
    classes = {"tagged": 2, "tokens": 3}.get(rule, classes)

    def rows(n: int, seed: int):
        if rule == "tagged":
            sequences, tags = tagged_sequences(n, seed, features, lengths)
            return np.empty((n, 0), np.float32), {column: sequences, "tags": [t[:, None] for t in tags]}, \
                np.array([t.max() for t in tags], np.int32)
        if rule == "tokens":
            sequences, labels = token_sequences(n, seed, classes=classes, lengths=lengths)
        else:
            sequences, labels = motif_sequences(n, seed, classes, features, lengths)
        return np.empty((n, 0), np.float32), {column: sequences}, labels
    return write_sequence_dataset(path, rows, n_train, n_test, shards, seed, classes, {column: lengths[1]},
                                  "tags" if rule == "tagged" else "", integers=(column,) if rule == "tokens" else ())


def make_mixed_dataset(path, n_train: int = 600, n_test: int = 200, shards: int = 2, seed: int = 0,
                       lengths=((10, 120), (5, 60))) -> Manifest:
    """A dataset of two sequence columns, `readings` and `events`, beside two fixed features (`mixed_inputs`), written
    as the ETL writes one: a graph model's."""
    return write_sequence_dataset(path, lambda n, seed: mixed_inputs(n, seed, lengths), n_train, n_test, shards,
                                  seed, 4, {"readings": lengths[0][1], "events": lengths[1][1]})


def write_sequence_dataset(path, rows, n_train: int, n_test: int, shards: int, seed: int, classes: int,
                           max_lengths: dict[str, int], step_target: str = "", bags: tuple[str, ...] = (),
                           integers: tuple[str, ...] = (), categorical: dict[str, int] | None = None) -> Manifest:
    """Write the splits `rows(n, seed)` gives ((x (n, k), {column: sequences (steps, F)}, classes (n,)), the
    sequence columns `max_lengths` names and the `step_target`'s classes) into `shards` shards each, and the
    manifest, with the real shard writer; the columns `bags` names are bag columns of ids (empty bags allowed), those
    `integers` names columns of integers (token ids); both stored as int32. `categorical` ({name: ids}) adds
    categorical columns of uniform ids beside x's numbers (then named n0, n1, ...)."""
    splits, counts, steps, found = {}, {}, {name: {} for name in max_lengths}, {name: [] for name in max_lengths}
    categorical = categorical or {}
    for split, n, salt in (("train", n_train, 0), ("test", n_test, 1)):
        x, columns, labels = rows(n, seed * 2 + salt)
        codes = np.stack([np.random.default_rng((seed, salt, j)).integers(0, k, n) for j, k in
                          enumerate(categorical.values())], axis=1) if categorical else None
        bounds = [i * n // shards for i in range(shards + 1)]
        splits[split] = [write_shard(str(path), shard_path(split, i), x[a:b], labels[a:b],
                                     sequences={name: ragged(sequences[a:b],
                                                             ID_DTYPE if name in bags + integers else np.float32)
                                                for name, sequences in columns.items()},
                                     ids=None if codes is None else codes[a:b])
                         for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        counts[split] = np.bincount(labels, minlength=classes).tolist()
        for name in max_lengths:
            steps[name][split] = sum(map(len, columns[name]))
            found[name] += columns[name]
    manifest = Manifest(feature_shape=(x.shape[1],), feature_dtype="float32", scale=1.0, offset=0.0, mean=0.0,
                        std=1.0, num_classes=classes, label_counts=counts, splits=splits, source="synthetic",
                        seed=seed, checksums="fletcher32",
                        sequences=[{**column_entry(name, found[name], max_lengths[name], steps[name], name in bags),
                                    **({"integer": True} if name in integers else {})} for name in max_lengths],
                        step_target=step_target, id_dtype=ID_DTYPE if bags + integers or categorical else "",
                        columns={"numeric": [{"name": f"n{j}"} for j in range(x.shape[1])],
                                 "categorical": [{"name": name, "ids": k} for name, k in categorical.items()]}
                        if categorical else {})
    write_manifest(str(path), manifest)
    return manifest


def padded_batch(sequences: list[np.ndarray], classes: list[np.ndarray], steps: int, dtype="float64"):
    """Sequences (steps, F) and their classes per step as a model's batch: a SequenceBatch padded with NaN to `steps`
    steps (padding may hold anything) and the classes (B, steps) int32, -1 at padding."""
    values = np.full((len(sequences), steps, sequences[0].shape[1]), np.nan, dtype)
    y = np.full((len(sequences), steps), -1, np.int32)
    for row, (sequence, tags) in enumerate(zip(sequences, classes)):
        values[row, :len(sequence)], y[row, :len(tags)] = sequence, tags
    return SequenceBatch(values, np.array([len(s) for s in sequences], np.int64)), y


def column_entry(name: str, sequences: list[np.ndarray], max_length: int, steps: dict, bag: bool = False) -> dict:
    """The manifest's entry of a sequence column, as the ETL writes it: `ids` for non-negative integers of one
    feature (token ids); a `bag` column's as the ETL writes a hashed one (`--bag COL --hash-buckets COL:ids-1`)."""
    entry = {"name": name, "features": sequences[0].shape[1], "max_length": max_length, "steps": steps,
             "longest": max(map(len, sequences)), "shortest": min(map(len, sequences))}
    ids = token_ids(np.concatenate(sequences))
    if ids:
        entry["ids"] = ids
    if bag:
        entry.update(bag=True, hash_buckets=ids - 1, hash=HASH)  # ids 1..ids-1 as buckets, 0 missing
    return entry


def write_uea_parquet(path, problem: str, split: str, column: str = "channels") -> int:
    """Split `split` (TRAIN, TEST) of a UEA/UCR problem shipped inside the sktime package (`BasicMotions`: its
    `sktime/datasets/data/PROBLEM/PROBLEM_SPLIT.ts`, read by sktime's own `load_from_tsfile`) as Parquet records of
    `label` (the class name) and `column` (a sequence: per step the channels' values). Nothing is downloaded.
    Returns the records written."""
    import importlib.util
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq
    from sktime.datasets import load_from_tsfile

    root = importlib.util.find_spec("sktime").submodule_search_locations[0]
    x, labels = load_from_tsfile(os.path.join(root, "datasets", "data", problem, f"{problem}_{split}.ts"),
                                 return_data_type="numpy3D")
    count, channels, steps = x.shape
    values = np.ascontiguousarray(x.transpose(0, 2, 1), dtype=np.float32).reshape(-1)  # (rows, steps, channels)
    per_step = pa.ListArray.from_arrays(pa.array(np.arange(count * steps + 1, dtype=np.int32) * channels),
                                        pa.array(values, pa.float32()))
    rows = pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32) * steps), per_step)
    pq.write_table(pa.table({"label": pa.array([str(label) for label in labels]), column: rows}), str(path))
    return count
