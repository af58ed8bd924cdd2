"""The GPU check (benchmarks/gpu_check.py, make gpu-check) on a machine without a GPU: it stops at once saying so,
and its dry run takes every step on numpy and PyTorch's CPU; the datasets it writes without Spark hold the IDX
files' images and labels."""
import json
import os
import sys

import h5py
import numpy as np
import pytest

from mpitrain.data.shards import read_manifest
from mpitrain.etl.idx import IMAGES_MAGIC, LABELS_MAGIC
from mpitrain.parallel.backend import gpu_available
from mpitrain.testing.datasets import make_fashion_dataset, make_idx_folder, write_idx
from mpitrain.testing.launch import REPO, command
from mpitrain.testing.sequences import make_fashion_rows_dataset

CHECK = os.path.join(REPO, "benchmarks", "gpu_check.py")
pytestmark = pytest.mark.skipif(gpu_available(), reason="a GPU is here: make gpu-check runs the check itself")


def test_without_a_gpu_the_check_stops_at_once_saying_so(tmp_path):
    for argv in ([sys.executable, CHECK, "--out", tmp_path / "out"], ["bash", os.path.join(REPO, "benchmarks",
                                                                                       "gpu_check.sh")]):
        done = command(*argv, timeout=60, env={"OUT": str(tmp_path / "out")})
        assert done.returncode == 2, done.stderr
        assert "no GPU here" in done.stderr and "nothing was run" in done.stderr
    assert not (tmp_path / "out" / "gpu_check.json").exists()


def test_the_dry_run_takes_every_step_on_the_cpu_and_reports_them(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "idx").mkdir()
    for prefix, n in (("train", 1200), ("t10k", 300)):  # enough rows for two epochs of the MLP's batches of 256
        write_idx(tmp_path / "idx" / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), np.uint8),
                  IMAGES_MAGIC)
        write_idx(tmp_path / "idx" / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n).astype(np.uint8),
                  LABELS_MAGIC)
    done = command(sys.executable, CHECK, "--dry-run", "--models", "MLP", "--repeat", "1", "--rows", "1200",
                   "--fashion", tmp_path / "idx", "--out", tmp_path / "out", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert result["dry_run"] and result["machine"]["backend"] == "numpy"
    assert [s["step"] for s in result["steps"]] == ["gpu tests", "2 ranks MLP", "1 rank MLP mpitrain 0",
                                                    "1 rank MLP pytorch 0"]
    assert all(s["passed"] for s in result["steps"])
    rows = {r["engine"]: r for r in result["throughput"]}
    assert rows["mpitrain"]["samples_per_s"] > 0 and rows["pytorch"]["vs_torch"] == 1.0
    assert rows["mpitrain"]["host_cpu_ms_per_step"] > 0 and rows["pytorch"]["host_cpu_ms_per_step"] > 0
    assert rows["mpitrain"]["cuda_graphs"] == 0 and " CUDA graphs " in (tmp_path / "out" / "gpu_check.md").read_text()
    assert done.stdout.rstrip().endswith((tmp_path / "out" / "gpu_check.md").read_text().rstrip())  # printed last
    assert sorted(os.listdir(tmp_path / "out" / "logs")) == ["1-rank-mlp-mpitrain-0.log", "1-rank-mlp-pytorch-0.log",
                                                             "2-ranks-mlp.log", "gpu-tests.log", "gpu-tests.xml"]


def test_the_datasets_written_without_spark_hold_the_idx_files_rows(tmp_path):
    idx = make_idx_folder(tmp_path / "idx")
    images = make_fashion_dataset(tmp_path / "images", tmp_path / "idx", limit=50)
    rows = make_fashion_rows_dataset(tmp_path / "rows", tmp_path / "idx", limit=50)
    for split, (x, y) in idx.items():
        n = min(50, len(y))
        for manifest, folder in ((images, "images"), (rows, "rows")):
            with_labels = [h5py.File(tmp_path / folder / s.path)["y"][...] for s in manifest.splits[split]]
            np.testing.assert_array_equal(np.concatenate(with_labels), y[:n])
        pixels = [h5py.File(tmp_path / "images" / s.path)["x"][...] for s in images.splits[split]]
        np.testing.assert_array_equal(np.concatenate(pixels), x[:n, None])
        assert rows.sequences[0]["steps"][split] == 28 * n
    assert read_manifest(str(tmp_path / "images")).feature_shape == (1, 28, 28)
    assert rows.sequences[0]["features"] == 28 and rows.num_classes == images.num_classes == 10
    np.testing.assert_allclose(images.mean, idx["train"][0][:50].mean() / 255)
