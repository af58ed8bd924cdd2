"""ETL sources CSV, Parquet and image folders, transforms, split carving and bad records (real Spark, local[2])."""
from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.shards import read_manifest
from mpitrain.etl.job import run_etl
from mpitrain.etl.shuffle import plan_placement, row_keys
from mpitrain.etl.sources import SourceOptions
from mpitrain.etl.transforms import FeatureStats, TransformOptions, Transforms
from mpitrain.testing import launch
from mpitrain.testing.datasets import read_split, siblings

REPO = Path(launch.REPO)


def all_rows(out: Path) -> list[tuple[bytes, int]]:
    """Every (feature bytes, label) of every split, sorted: the dataset as a multiset."""
    rows = []
    for split in read_manifest(str(out)).splits:
        x, y = read_split(out, split)
        rows += zip(map(bytes, x), y.tolist())
    return sorted(rows)


def expected_rows(x: np.ndarray, y: np.ndarray) -> list[tuple[bytes, int]]:
    return sorted(zip(map(bytes, x), y.tolist()))


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, header: bool, label_at: int, extra_lines=()) -> None:
    names = [f"f{j}" for j in range(x.shape[1])]
    names.insert(label_at, "class")
    lines = [",".join(names)] if header else []
    for features, label in zip(x, y):
        values = [f"{v:.9g}" for v in features]
        values.insert(label_at, str(label))
        lines.append(",".join(values))
    path.write_text("\n".join([*lines, *extra_lines]) + "\n")


# --- placement: stratified carving and exact positions, no Spark ---

def test_placement_carves_stratified_and_places_every_row_once():
    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 4, size) for size in (50, 0, 73, 31)]
    counts = np.array([np.bincount(y, minlength=4) for y in parts])
    placement = plan_placement(["test", "validation", "train"], [0.2, 0.25], counts)
    placed = [placement.place(i, y) for i, y in enumerate(parts)]
    outputs = np.concatenate([o for o, _ in placed])
    positions = np.concatenate([p for _, p in placed])
    labels = np.concatenate(parts)
    total = counts.sum(axis=0)
    assert placement.rows == [round(0.2 * 154), round(0.25 * (154 - 31)), 154 - 31 - 31]
    for o, fraction, left in ((0, 0.2, total), (1, 0.25, total - np.bincount(labels[outputs == 0], minlength=4))):
        per_class = np.bincount(labels[outputs == o], minlength=4)
        assert np.all(np.abs(per_class - fraction * left) < 1)  # stratified: each class within one row
    for o, rows in enumerate(placement.rows):
        assert sorted(positions[outputs == o].tolist()) == list(range(rows))


def test_row_keys_depend_on_content_and_seed_only():
    x = np.random.default_rng(0).integers(0, 256, (20, 3, 5), dtype=np.uint8)  # 15 bytes: padded words
    y = np.arange(20) % 3
    keys = row_keys(x, y, seed=1)
    np.testing.assert_array_equal(row_keys(x[::-1], y[::-1], seed=1), keys[::-1])
    assert len(set(keys.tolist())) == 20
    assert not np.array_equal(row_keys(x, y, seed=2), keys)
    y2 = y.copy()
    y2[4] += 1
    assert (row_keys(x, y2, seed=1) != keys).tolist() == [i == 4 for i in range(20)]


def test_stochastic_binarize_is_seeded_and_follows_the_values():
    values = np.linspace(0, 1, 64)[None, :].repeat(2000, axis=0)
    stats = FeatureStats.of(values)
    keys = row_keys(values, np.zeros(2000, np.int64), seed=0) + np.arange(2000, dtype=np.uint64)
    binarize = Transforms(TransformOptions(binarize="stochastic"), 7, "float32", 1.0, 0.0, stats)
    bits = binarize.apply(values.astype(np.float32), keys)
    assert bits.dtype == np.uint8 and set(np.unique(bits).tolist()) == {0, 1}
    np.testing.assert_array_equal(binarize.apply(values.astype(np.float32), keys), bits)
    other = Transforms(TransformOptions(binarize="stochastic"), 8, "float32", 1.0, 0.0, stats)
    assert not np.array_equal(other.apply(values.astype(np.float32), keys), bits)
    np.testing.assert_allclose(bits.mean(axis=0), values[0], atol=0.05)  # 2000 draws per feature


def test_binarize_and_standardize_exclude_each_other():
    with pytest.raises(ConfigError, match="--binarize and --standardize"):
        TransformOptions(binarize="threshold", standardize=True)


# --- CSV ---

@pytest.fixture(scope="module")
def csv_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("csv")
    rng = np.random.default_rng(1)
    data = {}
    for split, n in (("train", 120), ("test", 40)):
        x = rng.normal(1.0, 2.0, (n, 6)).astype(np.float32)
        y = np.arange(n) % 3
        write_csv(folder / f"{split}.csv", x, y, header=True, label_at=2)
        data[split] = (x, y)
    return folder, data


def test_csv_label_by_name_with_test_file_and_scale(spark, csv_data, tmp_path):
    folder, data = csv_data
    out = tmp_path / "ds"
    manifest = run_etl(spark, f"csv:{folder / 'train.csv'}", str(out), shards=3, seed=4, transforms=TransformOptions(scale=True),
                       source_options=SourceOptions(test=str(folder / "test.csv"), label="class",
                                                    feature_shape=(2, 3)))
    assert (manifest.feature_shape, manifest.feature_dtype, manifest.num_classes) == ((2, 3), "float32", 3)
    assert [manifest.rows(s) for s in ("train", "test")] == [120, 40]
    assert manifest.label_counts == {"train": [40, 40, 40], "test": [14, 13, 13]}
    for split, (x, y) in data.items():
        got_x, got_y = read_split(out, split)
        assert expected_rows(got_x.reshape(-1, 6), got_y) == expected_rows(x, y)  # stored unchanged
    low, high = float(data["train"][0].min()), float(data["train"][0].max())
    assert manifest.transforms == [{"name": "scale", "min": low, "max": high}]
    assert manifest.scale * low + manifest.offset == pytest.approx(0, abs=1e-12)
    assert manifest.scale * high + manifest.offset == pytest.approx(1)


def test_csv_bad_records_fail_the_job_and_leave_nothing(spark, tmp_path):
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20) % 2
    path = tmp_path / "rows.csv"
    write_csv(path, x, y, header=False, label_at=0,
              extra_lines=["1,2", "0,abc,3", "1,,4", "-1,5,6", "0,7,nan"])
    out = tmp_path / "ds"
    with pytest.raises(DataError) as failed:
        run_etl(spark, f"csv:{path}", str(out), shards=2, test_fraction=0.25,
                source_options=SourceOptions(header=False))
    message = str(failed.value)
    assert message.startswith(f"csv:{path}: 5 of 25 records are bad, more than --max-bad-fraction 0 allows")
    assert "malformed line '1,2', expected 3 numbers" in message
    assert siblings(out) == []


def test_csv_bad_records_below_the_limit_are_dropped_and_reported(spark, tmp_path, caplog):
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20) % 2
    path = tmp_path / "rows.csv"
    write_csv(path, x, y, header=False, label_at=0, extra_lines=["1,2", "-1,5,6"])
    out = tmp_path / "ds"
    with caplog.at_level(logging.WARNING, logger="mpitrain.etl.job"):
        manifest = run_etl(spark, f"csv:{path}", str(out), shards=2, test_fraction=0.25, max_bad_fraction=0.1,
                           source_options=SourceOptions(header=False, feature_dtype="uint8"))
    assert manifest.bad_records == 2 and manifest.feature_dtype == "uint8"
    assert "2 of 22 records are bad" in caplog.text and "label -1.0 at record '-1,5,6', expected" in caplog.text
    assert all_rows(out) == expected_rows(x.astype(np.uint8), y)
    assert manifest.label_counts["test"] == [3, 2] or manifest.label_counts["test"] == [2, 3]
    assert manifest.rows("test") == 5


def test_csv_unknown_label_column_fails_before_spark_starts(csv_data, tmp_path):
    folder, _ = csv_data
    with pytest.raises(ConfigError, match=r"--label kind: no column 'kind' in csv:.*\['f0', 'f1', 'class'"):
        run_etl(None, f"csv:{folder / 'train.csv'}", str(tmp_path / "ds"), shards=2,
                source_options=SourceOptions(label="kind"))
    assert siblings(tmp_path / "ds") == []


def test_a_source_whose_records_spark_finds_none_of_says_no_data_rows(spark, tmp_path):
    """A header-only CSV that only Spark can read (a Hadoop codec: no look before Spark, unlike plain CSV files,
    tests/unit/etl/test_messages.py) reaches the job with 0 records: "no data rows", not "0 classes"."""
    import bz2
    path = tmp_path / "head.csv.bz2"
    path.write_bytes(bz2.compress(b"label,a,b\n"))
    with pytest.raises(DataError, match=rf"^csv:{path}: no data rows; expected records to write$"):
        run_etl(spark, f"csv:{path}", str(tmp_path / "ds"), shards=1)
    assert siblings(tmp_path / "ds") == []


# --- Parquet ---

def test_parquet_array_column_chosen_by_name(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (60, 16), dtype=np.uint8)
    labels = np.arange(60) % 4
    rows = [list(map(int, p)) for p in pixels]
    rows[7] = rows[7][:15]  # a short array: a bad record
    table = pa.table({"id": np.arange(60), "pixels": pa.array(rows, pa.list_(pa.uint8())),
                      "brightness": pixels.mean(axis=1), "digit": labels})
    pq.write_table(table.slice(0, 30), tmp_path / "part-0.parquet")
    pq.write_table(table.slice(30), tmp_path / "part-1.parquet")
    out = tmp_path / "ds"
    manifest = run_etl(spark, f"parquet:{tmp_path}/*.parquet", str(out), shards=2, test_fraction=0.25,
                       validation_fraction=0.2, max_bad_fraction=0.05,
                       source_options=SourceOptions(label="digit", features=("pixels",), feature_shape=(1, 4, 4),
                                                    feature_dtype="uint8"))
    assert (manifest.feature_shape, manifest.feature_dtype, manifest.bad_records) == ((1, 4, 4), "uint8", 1)
    assert list(manifest.splits) == ["train", "validation", "test"]
    assert [manifest.rows(s) for s in manifest.splits] == [35, 9, 15]  # 59: 15 test, 9 of the 44 left
    keep = np.arange(60) != 7
    assert all_rows(out) == expected_rows(pixels[keep].reshape(-1, 1, 4, 4), labels[keep])
    assert [t["name"] for t in manifest.transforms] == ["split", "split"]


# --- image folders ---

def test_image_folders_resized_rgb_with_a_test_folder(spark, tmp_path):
    from PIL import Image
    colors = {"cat": (200, 10, 10), "dog": (10, 200, 10), "eel": (10, 10, 200)}
    for split, count in (("train", 6), ("test", 2)):
        for name, color in colors.items():
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                fmt = "png" if i % 2 else "jpg"
                Image.new("RGB", (10 + i, 7), color).save(tmp_path / split / name / f"{i}.{fmt}", quality=100)
    (tmp_path / "train" / "dog" / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "ds"
    manifest = run_etl(spark, f"images:{tmp_path / 'train'}", str(out), shards=2, max_bad_fraction=0.1,
                       transforms=TransformOptions(one_hot=True),
                       source_options=SourceOptions(test=str(tmp_path / "test"), image_size=(5, 4), color="rgb"))
    assert (manifest.feature_shape, manifest.class_names, manifest.bad_records) == ((3, 5, 4), ["cat", "dog", "eel"], 1)
    assert manifest.label_counts == {"train": [6, 6, 6], "test": [2, 2, 2]}
    for split in ("train", "test"):
        x, y = read_split(out, split)
        expected = np.array(list(colors.values()))[y]  # a one-colour image stays that colour when resized
        assert np.all(np.abs(x.astype(int) - expected[:, :, None, None]) <= 3)
        with h5py.File(out / manifest.shards(split)[0].path) as f:
            np.testing.assert_array_equal(f["y_onehot"][:].argmax(axis=1), f["y"][:])
    gray = run_etl(spark, f"images:{tmp_path / 'train'}", str(tmp_path / "gray"), shards=1, max_bad_fraction=0.1,
                   test_fraction=0.5, source_options=SourceOptions(image_size=(3, 3)))
    assert gray.feature_shape == (1, 3, 3) and sum(gray.rows(s) for s in gray.splits) == 18


def test_image_folder_needs_a_size(tmp_path):
    (tmp_path / "images" / "a").mkdir(parents=True)
    (tmp_path / "images" / "b").mkdir()
    with pytest.raises(ConfigError, match="--image-size"):
        run_etl(None, f"images:{tmp_path / 'images'}", str(tmp_path / "ds"), shards=1)


# --- transforms on the digits source ---

def test_standardize_validation_split_and_one_hot(spark, tmp_path):
    from sklearn.datasets import load_digits
    digits = load_digits()
    out = tmp_path / "ds"
    manifest = run_etl(spark, "digits:", str(out), shards=2, seed=3, test_fraction=0.2, validation_fraction=0.1,
                       transforms=TransformOptions(standardize=True, one_hot=True))
    assert [manifest.rows(s) for s in manifest.splits] == [1294, 144, 359]
    assert manifest.feature_dtype == "float32" and (manifest.scale, manifest.offset) == (1.0, 0.0)
    everything = np.bincount(digits.target, minlength=10)
    for split, fraction in (("test", 0.2), ("validation", 0.1 * 0.8)):
        assert np.all(np.abs(np.array(manifest.label_counts[split]) - fraction * everything) < 1.5)
    x, y = read_split(out, "train")
    entry = manifest.transforms[-2]
    assert entry["name"] == "standardize" and len(entry["mean"]) == 64
    varying = x.reshape(len(x), -1).std(axis=0) > 0
    np.testing.assert_allclose(x.reshape(len(x), -1).mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(x.reshape(len(x), -1).std(axis=0)[varying], 1, rtol=1e-4)
    restored = np.round((x.reshape(len(x), -1) * np.array(entry["std"]) + np.array(entry["mean"])) * 16)
    original = {bytes(row) for row in digits.images.reshape(-1, 64).astype(np.uint8)}
    assert all(bytes(row) in original for row in restored.astype(np.uint8))
    with h5py.File(out / manifest.shards("validation")[1].path) as f:
        np.testing.assert_array_equal(f["y_onehot"][:].argmax(axis=1), f["y"][:])
        assert f["y_onehot"].shape == (72, 10)


def test_threshold_binarize(spark, tmp_path):
    from sklearn.datasets import load_digits
    out = tmp_path / "ds"
    manifest = run_etl(spark, "digits:", str(out), shards=2, transforms=TransformOptions(binarize="threshold",
                                                                                          threshold=0.4))
    assert (manifest.feature_dtype, manifest.scale, manifest.offset) == ("uint8", 1.0, 0.0)
    assert manifest.transforms[-1] == {"name": "binarize", "mode": "threshold", "threshold": 0.4}
    ones = sum(read_split(out, split)[0].sum(dtype=np.int64) for split in manifest.splits)
    assert ones == int((load_digits().images / 16 >= 0.4).sum())


# --- the command line's transforms (spark-submit itself: tests/system/test_etl.py's test_spark_submit_prepare) ---

def test_etl_csv_with_transforms(etl, csv_data, tmp_path):
    """A folder of CSV files with a validation split, scale and stochastic binarization, through `mpitrain etl`'s
    command line on the session's Spark (the same arguments and job as `spark-submit etl/prepare.py`, whose start is
    test_etl.py's)."""
    folder, data = csv_data
    out = tmp_path / "ds"
    status, printed, err = etl("--source", f"csv:{folder}/*.csv", "--out", out, "--shards", "2", "--label", "2",
                               "--validation-fraction", "0.25", "--scale", "--binarize", "stochastic", "--seed", "9")
    assert status == 0, err[-3000:]
    assert f"wrote {out}: train 96 rows, validation 32 rows, test 32 rows" in printed
    manifest = read_manifest(str(out))
    assert [t["name"] for t in manifest.transforms] == ["split", "split", "scale", "binarize"]
    assert manifest.transforms[-1] == {"name": "binarize", "mode": "stochastic", "seed": 9}
    x, _ = read_split(out, "train")
    assert x.dtype == np.uint8 and 0.2 < x.mean() < 0.8


def test_etl_csv_part_of_malformed_lines_is_counted_as_bad_records(etl, tmp_path):
    """A folder's part with a column short is bad records: exit 2 and one error line naming the first, no dataset,
    no temporary folder (moved here from tests/mpi/test_misuse.py: the command runs in this process, on the session's
    Spark, as tests/system/conftest.py's `etl` runs it)."""
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "part-0.csv").write_text("label,a,b,c\n" + "".join(f"{i % 3},{i},{i},{i}\n" for i in range(90)))
    (tmp_path / "csv" / "part-1.csv").write_text("label,a,b,c\n" + "".join(f"{i % 3},{i},{i}\n" for i in range(30)))
    started = time.monotonic()
    status, _, err = etl("--source", f"csv:{tmp_path / 'csv'}", "--out", tmp_path / "out", "--shards", "2")
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert status == 2 and "Traceback" not in err and len(errors) == 1, err
    assert time.monotonic() - started < 60  # a quick exit, as every misuse case
    assert re.search(r"30 of 120 records are bad, more than --max-bad-fraction 0 allows; the first: .*"
                     r"malformed line '0,0,0', expected 4 numbers", errors[0]), err
    assert sorted(os.listdir(tmp_path)) == ["csv"]  # no dataset, no temporary folder
