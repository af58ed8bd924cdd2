"""The Spark ETL job (real Spark, local[2]) and its IDX reader."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.shards import check_shard, read_manifest
from mpitrain.etl.cli import main
from mpitrain.etl.idx import IMAGES_MAGIC, LABELS_MAGIC, find_splits, read_header, read_records
from mpitrain.etl.job import run_etl
from mpitrain.etl.sources import open_source
from mpitrain.testing import launch
from mpitrain.testing.datasets import ROWS, make_idx_folder, read_split, siblings, write_idx
from mpitrain.testing.launch import FASHION, require_fashion_mnist

REPO = Path(launch.REPO)

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)










@pytest.fixture(scope="module")
def idx_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("idx") / "raw"
    return folder, make_idx_folder(folder)


@pytest.fixture(scope="module")
def dataset(spark, idx_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("etl") / "ds"
    manifest = run_etl(spark, f"idx:{idx_data[0]}", str(out), shards=4, seed=0)
    return out, manifest


# --- IDX reader ---

def test_idx_header_and_record_ranges(idx_data):
    folder, data = idx_data
    splits = find_splits(str(folder))
    assert set(splits) == {"train", "test"}
    for split, (images, labels) in splits.items():
        assert (images.count, images.row_shape, images.offset) == (ROWS[split], (28, 28), 16)
        assert (labels.count, labels.row_shape, labels.offset) == (ROWS[split], (), 8)
        np.testing.assert_array_equal(read_records(images, 5, 17), data[split][0][5:17])
        np.testing.assert_array_equal(read_records(labels, 0, ROWS[split]), data[split][1])


def test_bad_magic_names_the_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    write_idx(path, np.zeros((3, 28, 28), np.uint8), LABELS_MAGIC)  # a labels magic on an images file
    with pytest.raises(DataError, match=f"{path}: magic number 0x00000801, expected 0x00000803"):
        read_header(str(path), IMAGES_MAGIC)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_truncated_file_names_the_file(tmp_path, suffix):
    path = tmp_path / f"t10k-images-idx3-ubyte{suffix}"
    write_idx(path, np.zeros((3, 28, 28), np.uint8), IMAGES_MAGIC)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(DataError, match=str(path)):
        read_header(str(path), IMAGES_MAGIC)


def test_image_and_label_counts_must_agree(tmp_path):
    make_idx_folder(tmp_path / "raw")
    labels = tmp_path / "raw" / "t10k-labels-idx1-ubyte"
    write_idx(labels, np.zeros(36, np.uint8), LABELS_MAGIC)
    with pytest.raises(DataError, match=f"{labels}: 36 labels, expected 37"):
        find_splits(str(tmp_path / "raw"))


def test_missing_split_and_unknown_source(tmp_path):
    make_idx_folder(tmp_path / "raw")
    (tmp_path / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="no t10k-labels-idx1-ubyte or t10k-labels-idx1-ubyte.gz"):
        open_source(f"idx:{tmp_path / 'raw'}")
    with pytest.raises(ConfigError, match="expected one of: idx:/folder.*digits:"):
        open_source("tfrecord:/data")


def test_fashion_mnist_headers_parse():
    require_fashion_mnist()
    splits = find_splits(FASHION)
    assert {s: (i.count, i.row_shape, labels.count) for s, (i, labels) in splits.items()} == {
        "train": (60000, (28, 28), 60000), "test": (10000, (28, 28), 10000)}


# --- the Spark job ---

def test_shards_are_complete_balanced_and_verified(dataset, idx_data):
    out, manifest = dataset
    data = idx_data[1]
    assert siblings(out) == ["ds"]  # no temporary folder left
    assert read_manifest(str(out)) == manifest
    assert (manifest.feature_shape, manifest.feature_dtype, manifest.num_classes) == ((1, 28, 28), "uint8", 10)
    assert (manifest.seed, manifest.transforms, manifest.source) == (0, [], f"idx:{idx_data[0]}")
    for split, n in ROWS.items():
        shards = manifest.shards(split)
        assert len(shards) == 4
        assert [s.rows for s in shards] == [(i + 1) * n // 4 - i * n // 4 for i in range(4)]
        assert manifest.rows(split) == n
        for shard in shards:
            assert hashlib.sha256((out / shard.path).read_bytes()).hexdigest() == shard.sha256
            check_shard(str(out), manifest, shard, verify_checksum=True)
        images, labels = data[split]
        assert manifest.label_counts[split] == np.bincount(labels, minlength=10).tolist()
        x, y = read_split(out, split)
        assert x.shape == (n, 1, 28, 28)
        assert sorted(zip(map(bytes, x), y.tolist())) == sorted(zip(map(bytes, images), labels.tolist()))
        assert not np.array_equal(y, labels)  # shuffled
    scaled = data["train"][0].astype(np.float64) / 255
    assert manifest.mean == pytest.approx(scaled.mean(), rel=1e-12)
    assert manifest.std == pytest.approx(scaled.std(), rel=1e-12)


def test_seed_fixes_the_order(spark, dataset, idx_data, tmp_path):
    out, _ = dataset
    run_etl(spark, f"idx:{idx_data[0]}", str(tmp_path / "same"), shards=3, seed=0)
    run_etl(spark, f"idx:{idx_data[0]}", str(tmp_path / "other"), shards=4, seed=1)
    for split in ROWS:
        x, y = read_split(out, split)
        same_x, same_y = read_split(tmp_path / "same", split)  # other shard count, same order
        np.testing.assert_array_equal(x, same_x)
        np.testing.assert_array_equal(y, same_y)
        assert not np.array_equal(x, read_split(tmp_path / "other", split)[0])


def test_order_label_writes_the_rows_sorted_by_label(spark, dataset, idx_data, tmp_path):
    out, _ = dataset
    run_etl(spark, f"idx:{idx_data[0]}", str(tmp_path / "by-label"), shards=3, seed=0, order="label")
    for split in ROWS:
        x, y = read_split(tmp_path / "by-label", split)
        assert (np.diff(y) >= 0).all() and len(set(y.tolist())) > 1
        shuffled_x, shuffled_y = read_split(out, split)
        assert sorted(zip(map(bytes, x), y.tolist())) == sorted(zip(map(bytes, shuffled_x), shuffled_y.tolist()))


def test_bad_label_leaves_nothing_behind(spark, tmp_path):
    make_idx_folder(tmp_path / "raw", labels_override={"test": (20, 12)})
    out = tmp_path / "ds"
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte: label 12 at record 20, expected 0..9"):
        run_etl(spark, f"idx:{tmp_path / 'raw'}", str(out), shards=2)
    assert siblings(out) == []


def test_overwrite_only_when_asked(spark, tmp_path):
    make_idx_folder(tmp_path / "raw")
    make_idx_folder(tmp_path / "bad", labels_override={"train": (50, 12)})
    out = tmp_path / "ds"
    run_etl(spark, f"idx:{tmp_path / 'raw'}", str(out), shards=2, seed=0)
    before = (out / "manifest.json").read_text()
    with pytest.raises(DataError, match="exists; pass --overwrite"):
        run_etl(spark, f"idx:{tmp_path / 'raw'}", str(out), shards=3)
    with pytest.raises(DataError, match="label 12"):
        run_etl(spark, f"idx:{tmp_path / 'bad'}", str(out), shards=3, overwrite=True)
    assert (out / "manifest.json").read_text() == before
    assert siblings(out) == ["ds"]
    run_etl(spark, f"idx:{tmp_path / 'raw'}", str(out), shards=3, seed=0, overwrite=True)
    assert [len(read_manifest(str(out)).shards(s)) for s in ROWS] == [3, 3]
    assert sorted(p.name for p in (out / "train").iterdir()) == [f"shard-0000{i}.h5" for i in range(3)]
    assert siblings(out) == ["ds"]


def test_overwrite_refuses_a_folder_that_is_not_a_dataset(idx_data, tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a dataset folder"):
        run_etl(None, f"idx:{idx_data[0]}", str(tmp_path / "home"), shards=2, overwrite=True)


@pytest.mark.parametrize("shards, expected", [(0, r"an integer in \[1, 1000000\]"),
                                              (38, r"1\.\.37 \(the test split")])
def test_shards_must_fit_the_smallest_split(idx_data, tmp_path, shards, expected):
    with pytest.raises(ConfigError, match=rf"--shards {shards}: expected {expected}"):
        run_etl(None, f"idx:{idx_data[0]}", str(tmp_path / "ds"), shards=shards)
    assert siblings(tmp_path / "ds") == []


def test_digits_source(spark, tmp_path):
    out = tmp_path / "digits"
    manifest = run_etl(spark, "digits:", str(out), shards=3, seed=5, test_fraction=0.25)
    assert (manifest.rows("train"), manifest.rows("test")) == (1797 - 449, 449)
    assert manifest.feature_shape == (1, 8, 8) and manifest.scale == 1 / 16
    x, y = read_split(out, "train")
    assert x.shape == (1348, 1, 8, 8) and x.max() == 16
    assert sum(manifest.label_counts["train"]) + sum(manifest.label_counts["test"]) == 1797
    assert manifest.mean == pytest.approx(x.mean() / 16)


@pytest.mark.parametrize("fraction", [0.0, 1.0, 0.0001])
def test_digits_test_fraction_must_leave_both_splits(fraction):
    with pytest.raises(ConfigError, match=f"--test-fraction {fraction}: gives 0 of 1797"):
        open_source("digits:", test_fraction=fraction)


def test_spark_submit_prepare(idx_data, tmp_path):
    out = tmp_path / "ds"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
               "--conf", "spark.ui.enabled=false", str(REPO / "etl" / "prepare.py"),
               "--source", f"idx:{idx_data[0]}", "--out", str(out), "--shards", "2"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {out}: train 103 rows, test 37 rows; 2 shards per split (Spark master local[2])" in done.stdout
    assert read_manifest(str(out)).rows("train") == 103


@pytest.mark.parametrize("script, arguments", [
    ("prepare.py", ["--source", "idx:/nowhere", "--out", "OUT", "--shards", "2"]),
    ("score.py", ["--model", "/nowhere/run", "--source", "digits:", "--out", "OUT"])])
def test_spark_submit_entry_points_exit_2_on_a_user_error_with_one_line(script, arguments, tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]",
               str(REPO / "etl" / script), *[str(tmp_path / "out") if a == "OUT" else a for a in arguments]]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr  # spark-submit hands the Python process's stderr to its stdout
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(errors) == 1 and "/nowhere" in errors[0], output[-2000:]
    assert not (tmp_path / "out").exists()


def test_cli_refuses_existing_out_before_starting_spark(dataset, idx_data, capsys):
    out = dataset[0]
    assert main(["--source", f"idx:{idx_data[0]}", "--out", str(out), "--shards", "2"]) == 2
    assert capsys.readouterr().err == f"error: {out}: exists; pass --overwrite to replace it\n"


def test_etl_overwrite_through_a_link_keeps_the_link_and_clears_only_dead_jobs_temporaries(etl, tmp_path):
    """`mpitrain etl --overwrite` on a link to a dataset (moved here from tests/mpi/test_misuse.py: the command runs
    in this process, on the session's Spark, as tests/system/conftest.py's `etl` runs it)."""
    from mpitrain.rundir.directory import FileLock
    from mpitrain.testing.datasets import make_digits_dataset
    old = make_digits_dataset(tmp_path / "data_v1")
    (tmp_path / "current").symlink_to("data_v1")
    dead, live = tmp_path / "data_v1.etl-tmp-deadbeef", tmp_path / "data_v1.etl-tmp-11ve0000"
    dead.mkdir()
    (dead / "train").mkdir()  # what a killed job left: its folder, and its lock that nobody holds any more
    (tmp_path / "data_v1.etl-tmp-deadbeef.lock").write_text("host gone pid 1\n")
    live.mkdir()
    holder = FileLock(str(live) + ".lock")
    assert holder.take() is None  # a job that is still running
    try:
        status, _, err = etl("--source", "digits:", "--out", tmp_path / "current", "--shards", "2", "--seed", "5",
                             "--overwrite")
    finally:
        holder.release()
    assert status == 0, err
    assert os.path.islink(tmp_path / "current") and os.readlink(tmp_path / "current") == "data_v1"
    manifest = read_manifest(str(tmp_path / "data_v1"))
    assert manifest.seed == 5 and old.seed == 0
    assert sorted(os.listdir(tmp_path)) == ["current", "data_v1", "data_v1.etl-tmp-11ve0000",
                                            "data_v1.etl-tmp-11ve0000.lock"]


@pytest.fixture(scope="module")
def digits_job(spark, tmp_path_factory):
    """`mpitrain etl` arguments of digits in 2 shards, and the dataset they wrote (in a folder of its own)."""
    folder = tmp_path_factory.mktemp("digits_job")
    args = ["--source", "digits:", "--shards", "2", "--seed", "5", "--overwrite"]
    run_etl(spark, "digits:", str(folder / "digits"), shards=2, seed=5)
    return args, folder / "digits"


@pytest.mark.parametrize("full_at", ["a shard", "the manifest"])
def test_a_full_disk_at_a_shard_or_the_manifest_is_one_line_and_keeps_the_dataset_it_would_replace(
        etl, digits_job, tmp_path, small_disks, full_at):
    """The job replaces a dataset on a real tmpfs made full before it starts (`mpitrain.testing.small_disks`): of
    pages, with one left for the job's lock, so the first shard fails; or of inodes, as many left as the job makes
    before its manifest, so the manifest cannot be created."""
    from mpitrain.testing.small_disks import FILLER, fill, limit_files
    args, dataset = digits_job
    disk = small_disks.mount(tmp_path / "disk", size="4m")
    shutil.copytree(dataset, disk / "digits")  # the dataset the job would replace
    made = sum(1 for _ in (disk / "digits").rglob("*"))  # its splits' folders, shards and manifest
    if full_at == "a shard":
        fill(disk, leave=1)
        expected = r"digits\.etl-tmp-\w+/(train|test)/shard-\d+\.h5: No space left on device while writing it " \
                   r"\(it needs about \d\.\d MB, 0\.0 MB free\); the partial file is removed"
    else:
        limit_files(disk, more=1 + made)  # the lock, the job's folder, its splits' folders and shards
        expected = r"digits\.etl-tmp-\w+/manifest\.json: No space left on device while writing it \(no file can be " \
                   r"created: all \d+ inodes of the file system are used\)$"
    before = {p.relative_to(disk): p.read_bytes() for p in disk.rglob("*") if p.is_file() and p.name != FILLER}
    status, _, err = etl(*args, "--out", disk / "digits")
    assert status == 2 and err.count("error: ") == 1 and "Traceback" not in err, err
    assert re.search(expected, err.strip()), err
    after = {p.relative_to(disk): p.read_bytes() for p in disk.rglob("*") if p.is_file() and p.name != FILLER}
    assert after == before
    assert set(os.listdir(disk)) - {FILLER} == {"digits"}  # no temporary folder or lock left
