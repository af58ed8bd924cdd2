"""Rows per rank, reading across shards, shuffling, and clear errors for bad shards."""
import json
import os

import h5py
import numpy as np
import pytest

from mpitrain.testing.datasets import make_dataset
from mpitrain.data.augment import augment_images
from mpitrain.parallel.backend import create_backend
from mpitrain.data.reader import Batches, eval_rows_for_rank, load_rank_rows, read_rows, rows_for_rank
from mpitrain.errors import DataError
from mpitrain.data.shards import read_manifest


@pytest.mark.parametrize("n, size", [(10, 1), (10, 3), (7, 7), (1000, 4), (5, 2)])
def test_rank_ranges(n, size):
    train = [rows_for_rank(n, r, size) for r in range(size)]
    assert len({len(r) for r in train}) == 1 and len(train[0]) == n // size
    assert [r.start for r in train[1:]] == [r.stop for r in train[:-1]]
    evaluation = [eval_rows_for_rank(n, r, size) for r in range(size)]
    assert sum(len(r) for r in evaluation) == n and evaluation[-1].stop == n
    assert max(map(len, evaluation)) - min(map(len, evaluation)) <= 1


def test_rows_read_across_shard_boundaries(tmp_path):
    make_dataset(tmp_path, n_train=100, n_test=10, shards=7)
    manifest = read_manifest(str(tmp_path))
    everything = read_rows(str(tmp_path), manifest, "train", range(0, 100), True)
    part = read_rows(str(tmp_path), manifest, "train", range(13, 58), True)
    np.testing.assert_array_equal(part.x, everything.x[13:58])
    np.testing.assert_array_equal(part.y, everything.y[13:58])


def test_batches_are_seeded_per_epoch_and_cover_rows(tmp_path):
    make_dataset(tmp_path, n_train=64, n_test=8, shards=2)
    manifest = read_manifest(str(tmp_path))
    rows = load_rank_rows(str(tmp_path), manifest, "train", 0, 1, training=True)
    rows.y = np.arange(64, dtype=np.int32)  # label = row index, to see which rows each batch holds
    backend = create_backend("numpy")
    batches = Batches(rows, manifest, 10, backend, "float32", seed=3, rank=0)
    epoch0 = [y.copy() for _, y in batches.epoch(0)]  # copies: a batch's buffers are reused
    assert batches.steps_per_epoch == 6 and len(epoch0) == 6
    seen = np.concatenate(epoch0)
    assert len(set(seen)) == 60  # no row twice; the 4 left over are dropped
    again = [y.copy() for _, y in Batches(rows, manifest, 10, backend, "float32", seed=3, rank=0, prefetch=False).epoch(0)]
    assert all((a == b).all() for a, b in zip(epoch0, again))
    epoch1 = [y.copy() for _, y in batches.epoch(1)]
    assert not all((a == b).all() for a, b in zip(epoch0, epoch1))
    resumed = [y.copy() for _, y in batches.epoch(1, start_step=4)]
    assert all((a == b).all() for a, b in zip(epoch1[4:], resumed))


def test_normalization_uses_manifest_mean_and_std(tmp_path):
    manifest = make_dataset(tmp_path, n_train=200, n_test=10)
    rows = load_rank_rows(str(tmp_path), manifest, "train", 0, 1, training=True)
    batches = Batches(rows, manifest, 200, create_backend("numpy"), "float32", 0, 0)
    x = batches.to_model_input(rows.x)
    np.testing.assert_allclose(x, (rows.x / 255.0 - manifest.mean) / manifest.std, rtol=1e-5, atol=1e-5)


def corrupt(tmp_path, how):
    make_dataset(tmp_path, n_train=40, n_test=10, shards=2)
    shard = tmp_path / "train" / "shard-00001.h5"
    if how == "missing":
        shard.unlink()
    elif how == "checksum":
        with h5py.File(shard, "r+") as f:
            f["x"][0] = 0
    elif how == "label":
        with h5py.File(shard, "r+") as f:
            f["y"][3] = 9
    elif how == "shape":
        with h5py.File(shard, "r+") as f:
            del f["x"]
            f["x"] = np.zeros((20, 1, 4, 5), np.uint8)
    return str(shard)


@pytest.mark.parametrize("how, message", [
    ("missing", "is missing"), ("checksum", "sha256 .* does not match"),
    ("label", r"label 9 out of range; expected 0..2"), ("shape", r"dataset 'x' is uint8\[20, 1, 4, 5\]")])
def test_bad_shards_give_clear_errors(tmp_path, how, message):
    shard = corrupt(tmp_path, how)
    manifest = read_manifest(str(tmp_path))
    verify = how != "label" and how != "shape"
    with pytest.raises(DataError, match=message) as error:
        load_rank_rows(str(tmp_path), manifest, "train", 0, 1, training=True, verify_checksums=verify)
    assert shard in str(error.value)


def test_more_ranks_than_rows_and_missing_split(tmp_path):
    manifest = make_dataset(tmp_path, n_train=5, n_test=3, shards=1)
    with pytest.raises(DataError, match="5 rows, fewer than the 8 ranks"):
        load_rank_rows(str(tmp_path), manifest, "train", 0, 8, training=True)
    with pytest.raises(DataError, match="no split 'valid'"):
        load_rank_rows(str(tmp_path), manifest, "valid", 0, 1, training=True)


def test_manifest_errors_name_file_and_key(tmp_path):
    make_dataset(tmp_path, n_train=5, n_test=3, shards=1)
    path = tmp_path / "manifest.json"
    data = json.loads(path.read_text())
    data["feature_dtype"] = "int16"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"manifest.json: feature_dtype 'int16'"):
        read_manifest(str(tmp_path))
    data["feature_dtype"] = "uint8"
    del data["num_classes"]
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"missing key 'num_classes'"):
        read_manifest(str(tmp_path))
    with pytest.raises(DataError, match="no such file"):
        read_manifest(os.path.join(str(tmp_path), "nowhere"))


def test_truncated_shard_newer_schema_nan_features_and_empty_split(tmp_path):
    make_dataset(tmp_path / "a", n_train=40, n_test=10, shards=2)
    shard = tmp_path / "a" / "train" / "shard-00000.h5"
    shard.write_bytes(shard.read_bytes()[:1000])
    manifest = read_manifest(str(tmp_path / "a"))
    with pytest.raises(DataError, match=f"{shard}: not a readable shard"):
        load_rank_rows(str(tmp_path / "a"), manifest, "train", 0, 1, training=True, verify_checksums=False)

    make_dataset(tmp_path / "b", n_train=40, n_test=10, shards=1)
    path = tmp_path / "b" / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(DataError, match="schema_version 2, this mpitrain reads 1"):
        read_manifest(str(tmp_path / "b"))
    path.write_text(json.dumps({**data, "splits": {**data["splits"], "train": {"rows": 0, "shards": []}}}))
    with pytest.raises(DataError, match="split 'train' has no rows"):
        load_rank_rows(str(tmp_path / "b"), read_manifest(str(tmp_path / "b")), "train", 0, 1, training=True)


def test_nan_features_in_a_float_dataset(tmp_path):
    from mpitrain.data.shards import Manifest, shard_path, write_manifest, write_shard
    x = np.ones((6, 1, 2, 2), np.float32)
    x[4, 0, 1, 0] = np.nan
    shards = [write_shard(str(tmp_path), shard_path("train", 0), x, np.zeros(6, np.int32))]
    write_manifest(str(tmp_path), Manifest((1, 2, 2), "float32", 1.0, 0.0, 0.0, 1.0, 2, {"train": [6, 0]},
                                           {"train": shards}))
    with pytest.raises(DataError, match="shard-00000.h5: features contain NaN or Inf"):
        load_rank_rows(str(tmp_path), read_manifest(str(tmp_path)), "train", 0, 1, training=True)


def shifted(image: np.ndarray, down: int, right: int) -> np.ndarray:
    """`image` (C, H, W) moved by (down, right) pixels, the uncovered border 0."""
    out = np.zeros_like(image)
    height, width = image.shape[1:]
    out[:, max(down, 0):height + min(down, 0), max(right, 0):width + min(right, 0)] = \
        image[:, max(-down, 0):height - max(down, 0), max(-right, 0):width - max(right, 0)]
    return out


def test_augment_flips_and_shifts_each_whole_image():
    rng = np.random.default_rng(0)
    x = np.zeros((300, 2, 9, 7), dtype=np.uint8)
    x[:, :, 2:-2, 2:-2] = rng.integers(1, 256, size=(300, 2, 5, 3))  # a 2-pixel zero border: nothing falls off
    out = augment_images(x, (3, 1, 0, 5), flip=True, shift=2)
    assert out.shape == x.shape and out.dtype == x.dtype
    found = []
    for image, original in zip(out, x):
        matches = [(mirror, down, right) for mirror in (False, True) for down in range(-2, 3)
                   for right in range(-2, 3)
                   if np.array_equal(image, shifted(original[..., ::-1] if mirror else original, down, right))]
        assert len(matches) == 1, "each output is one flip + shift of its own input"
        found.append(matches[0])
    mirrors, downs, rights = zip(*found)
    assert 100 < sum(mirrors) < 200 and set(downs) == set(rights) == set(range(-2, 3))
    np.testing.assert_array_equal(out, augment_images(x, (3, 1, 0, 5), flip=True, shift=2))
    assert not np.array_equal(out, augment_images(x, (3, 1, 0, 6), flip=True, shift=2))
    np.testing.assert_array_equal(augment_images(x, (0,), flip=False, shift=0), x)


def copies(batches) -> list:
    """(x, y) of every batch, copied (the pipeline reuses its buffers two steps later)."""
    return [(x.copy(), y.copy()) for x, y in batches]


def test_augmented_batches_are_keyed_by_epoch_and_step(tmp_path):
    manifest = make_dataset(tmp_path, n_train=64, n_test=8, shape=(1, 6, 6))
    rows = load_rank_rows(str(tmp_path), manifest, "train", 0, 1, training=True)
    backend = create_backend("numpy")
    plain = copies(Batches(rows, manifest, 16, backend, "float32", seed=3, rank=0).epoch(1))
    augmented = Batches(rows, manifest, 16, backend, "float32", seed=3, rank=0, augment={"flip": True, "shift": 1})
    epoch1 = copies(augmented.epoch(1))
    assert all(np.array_equal(y, y_plain) for (_, y), (_, y_plain) in zip(epoch1, plain))
    assert not any(np.array_equal(x, x_plain) for (x, _), (x_plain, _) in zip(epoch1, plain))
    resumed = copies(augmented.epoch(1, start_step=2))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(epoch1[2:], resumed))
    assert not np.array_equal(epoch1[0][0], next(augmented.epoch(2))[0])
