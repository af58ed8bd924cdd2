"""Reading rows across shards, batches in the epoch order on any rank count, and clear errors for bad shards."""
import json
import os
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from mpitrain.testing.datasets import flip_a_byte_in_a_chunk, make_dataset, read_split
from mpitrain.data.augment import augment_images
from mpitrain.parallel.backend import create_backend
from mpitrain.data.reader import Batches, DatasetReader, ModelInput, eval_rows_for_rank, window_rows
from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.shards import read_manifest
from mpitrain.base.workspace import Workspace


def ranks(size: int, rank: int = 0):
    """What DatasetReader needs of a communicator: the rank and the number of ranks."""
    return SimpleNamespace(rank=rank, size=size)


def read_all(path, split="train", size=1, rank=0, **options):
    return read_split(path, split, rank, size, **options)


@pytest.mark.parametrize("n, size", [(10, 1), (10, 3), (7, 7), (1000, 4), (5, 2)])
def test_evaluation_ranges_cover_every_row(n, size):
    evaluation = [eval_rows_for_rank(n, r, size) for r in range(size)]
    assert sum(len(r) for r in evaluation) == n and evaluation[-1].stop == n
    assert [r.start for r in evaluation[1:]] == [r.stop for r in evaluation[:-1]]
    assert max(map(len, evaluation)) - min(map(len, evaluation)) <= 1


def test_evaluation_rows_read_across_shard_boundaries_in_order(tmp_path):
    make_dataset(tmp_path, n_train=100, n_test=10, shards=7)
    x, y = read_all(tmp_path)
    with h5py.File(tmp_path / "train" / "shard-00000.h5") as f:
        np.testing.assert_array_equal(x[:len(f["x"])], f["x"][...])
    parts = [read_all(tmp_path, size=3, rank=r) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
    x20, _ = read_all(tmp_path, max_rows=20)
    np.testing.assert_array_equal(x20, x[:20])


def train_batches(path, global_batch, buffer_mb=1.0, seed=3, size=1, rank=0, prefetch=True, **options):
    reader = DatasetReader(str(path), ranks(size, rank))
    rows = reader.train_rows("train", global_batch, buffer_mb, seed, shuffle=True)
    return Batches(rows, reader.manifest, create_backend("numpy"), "float32", seed, rank, prefetch=prefetch, **options)


def test_batches_are_seeded_per_epoch_cover_rows_and_resume_at_a_step(tmp_path):
    make_dataset(tmp_path, n_train=64, n_test=8, shards=2)
    seen_rows = []
    batches = train_batches(tmp_path, 10, record=lambda epoch, step, rows: seen_rows.append(rows))
    epoch0 = copies(batches.epoch(0))
    assert batches.steps_per_epoch == 6 and len(epoch0) == 6
    seen = np.concatenate(seen_rows)
    assert len(set(seen)) == 60 and seen.max() < 64  # no row twice; 4 rows are dropped
    again = copies(train_batches(tmp_path, 10, prefetch=False).epoch(0))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(epoch0, again))
    epoch1 = copies(batches.epoch(1))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(epoch0, epoch1))
    resumed = copies(batches.epoch(1, start_step=4))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(epoch1[4:], resumed))


def test_a_rank_count_changes_who_trains_on_a_row_not_which_rows_form_a_step(tmp_path):
    make_dataset(tmp_path, n_train=300, n_test=8, shards=3)
    one = copies(train_batches(tmp_path, 12, buffer_mb=0.05).epoch(2))
    for size in (2, 3, 4):
        parts = [copies(train_batches(tmp_path, 12, buffer_mb=0.05, size=size, rank=r).epoch(2)) for r in range(size)]
        for step, (x, _) in enumerate(one):
            together = np.concatenate([part[step][0] for part in parts])
            assert sorted(map(bytes, together)) == sorted(map(bytes, x))


def test_normalization_uses_manifest_mean_and_std(tmp_path):
    manifest = make_dataset(tmp_path, n_train=200, n_test=10)
    x, _ = read_all(tmp_path)
    to_input = ModelInput(manifest, create_backend("numpy"), "float32", True, Workspace(np).part("t"))
    np.testing.assert_allclose(to_input(x), (x / 255.0 - manifest.mean) / manifest.std, rtol=1e-5, atol=1e-5)


def test_a_buffer_that_cannot_hold_two_batches_and_a_chunk_is_refused_naming_what_it_needs(tmp_path):
    make_dataset(tmp_path, n_train=300, n_test=8, shards=1)
    with pytest.raises(ConfigError, match=r"data.buffer_mb is 0.001: it holds 43 rows of 24 bytes, fewer than "
                       r"two global batches of 64 rows or one chunk of 300 rows; expected at least 0.007 \(MB\)"):
        train_batches(tmp_path, 64, buffer_mb=0.001)
    with pytest.raises(ConfigError, match="global batch size 10 is not divisible by the 3 ranks"):
        train_batches(tmp_path, 10, size=3)
    assert window_rows(1.0, 100, 64, 1024) == 1 * 2**20 // (2 * 108) // 64 * 64


def corrupt(tmp_path, how):
    make_dataset(tmp_path, n_train=40, n_test=10, shards=2, checksums="" if how == "sha256" else "fletcher32")
    shard = tmp_path / "train" / "shard-00001.h5"
    if how == "missing":
        shard.unlink()
    elif how == "checksum":
        flip_a_byte_in_a_chunk(shard)
    elif how == "sha256":
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
    ("missing", "is missing"), ("sha256", "sha256 .* does not match"),
    ("checksum", r"rows 0..19 could not be read \(.*\); the chunk fails its checksum"),
    ("label", r"label 9 out of range for a class target; expected 0..2"), ("shape", r"dataset 'x' is uint8\[20, 1, 4, 5\]")])
def test_bad_shards_give_clear_errors(tmp_path, how, message):
    shard = corrupt(tmp_path, how)
    manifest = read_manifest(str(tmp_path))
    verify = how in ("missing", "sha256", "checksum")
    assert manifest.rows("train") == 40
    with pytest.raises(DataError, match=message) as error:
        read_all(tmp_path, verify_checksums=verify)
    assert shard in str(error.value)


def test_more_ranks_than_rows_and_missing_split(tmp_path):
    make_dataset(tmp_path, n_train=5, n_test=3, shards=1)
    with pytest.raises(DataError, match="5 rows, fewer than the 8 ranks"):
        read_all(tmp_path, size=8)
    with pytest.raises(DataError, match="no split 'valid'"):
        read_all(tmp_path, split="valid")


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
    with pytest.raises(DataError, match=f"{shard}: not a readable shard"):
        read_all(tmp_path / "a", verify_checksums=False)

    make_dataset(tmp_path / "b", n_train=40, n_test=10, shards=1)
    path = tmp_path / "b" / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(DataError, match="schema_version 2, this mpitrain reads 1"):
        read_manifest(str(tmp_path / "b"))
    path.write_text(json.dumps({**data, "splits": {**data["splits"], "train": {"rows": 0, "shards": []}}}))
    with pytest.raises(DataError, match="split 'train' has no rows"):
        read_all(tmp_path / "b")


def test_nan_features_in_a_float_dataset(tmp_path):
    from mpitrain.data.shards import Manifest, shard_path, write_manifest, write_shard
    x = np.ones((6, 1, 2, 2), np.float32)
    x[4, 0, 1, 0] = np.nan
    shards = [write_shard(str(tmp_path), shard_path("train", 0), x, np.zeros(6, np.int32))]
    write_manifest(str(tmp_path), Manifest((1, 2, 2), "float32", 1.0, 0.0, 0.0, 1.0, 2, {"train": [6, 0]},
                                           {"train": shards}))
    with pytest.raises(DataError, match="shard-00000.h5: features contain NaN or Inf"):
        read_all(tmp_path)


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
    make_dataset(tmp_path, n_train=64, n_test=8, shape=(1, 6, 6))
    plain = copies(train_batches(tmp_path, 16).epoch(1))
    augmented = train_batches(tmp_path, 16, augment={"flip": True, "shift": 1})
    epoch1 = copies(augmented.epoch(1))
    assert all(np.array_equal(y, y_plain) for (_, y), (_, y_plain) in zip(epoch1, plain))
    assert not any(np.array_equal(x, x_plain) for (x, _), (x_plain, _) in zip(epoch1, plain))
    resumed = copies(augmented.epoch(1, start_step=2))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(epoch1[2:], resumed))
    assert not np.array_equal(epoch1[0][0], next(augmented.epoch(2))[0])


@pytest.mark.parametrize("target, bad, message", [
    ("binary", 2.0, "label 2 out of range for a binary target; expected 0 or 1"),
    ("regression", np.inf, "label inf out of range for a regression target; expected a finite number")])
def test_targets_beside_class_labels_read_as_float_columns_and_are_checked(tmp_path, target, bad, message):
    manifest = make_dataset(tmp_path, n_train=40, n_test=10, shards=2, target=target)
    x, y = read_all(tmp_path)
    assert y.dtype == np.float32 and y.shape == (40, *manifest.target_shape) and manifest.outputs == y.shape[1]
    with h5py.File(tmp_path / "train" / "shard-00001.h5", "r+") as f:
        f["y"][3, 0] = bad
    with pytest.raises(DataError, match=message):
        read_all(tmp_path)
