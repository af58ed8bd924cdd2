"""Training from shards on an S3 server (a real SeaweedFS on 127.0.0.1), 2 ranks: reading, a chunk that fails its
checksum, a shard removed mid-epoch; each ends every rank with one line, exit 2, nothing written lost."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from mpitrain.testing.datasets import flip_a_byte_in_a_chunk, make_dataset, write_config
from mpitrain.testing.launch import MPIEXEC, MPITRAIN, command, mpiexec

BUCKET = "training-tests"


@pytest.fixture(scope="module")
def store(object_store):
    object_store.make_bucket(BUCKET)
    return object_store


def upload(store, local, name: str) -> str:
    store.filesystem().put(f"{local}/", f"{BUCKET}/{name}/", recursive=True)
    return f"s3://{BUCKET}/{name}"


def config(tmp_path, url: str, **sections) -> str:
    return write_config(tmp_path / "exp.yaml", url, run_dir=str(tmp_path / "run"), **sections)


def test_training_reads_its_rows_from_the_store_about_once(store, tmp_path):
    make_dataset(tmp_path / "data", n_train=4000, n_test=300, shards=4)
    url = upload(store, tmp_path / "data", "plain")
    result = mpiexec(2, MPITRAIN, "train", config(tmp_path, url, data={"buffer_mb": 0.2}),
                     env={**os.environ, **store.env}, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.8
    assert 1.0 <= summary["data_read_per_epoch"] < 1.2
    stored = sum(os.path.getsize(p) for p in (tmp_path / "data" / "train").glob("*.h5"))
    assert stored <= summary["data_bytes_fetched"] < 2 * 1.2 * stored  # 2 epochs, about once each, metadata beside
    evaluated = mpiexec(2, MPITRAIN, "eval", tmp_path / "run", env={**os.environ, **store.env}, timeout=60)
    assert evaluated.returncode == 0 and "accuracy" in evaluated.stdout + evaluated.stderr, evaluated.stderr
    info = command(MPITRAIN, "info", url, env={**os.environ, **store.env}, timeout=60)
    assert info.returncode == 0 and "all shards present and well-formed, checksums verified" in info.stdout, info.stderr


def test_a_chunk_that_fails_its_checksum_ends_every_rank(store, tmp_path):
    make_dataset(tmp_path / "data", n_train=10000, n_test=300, shards=4)  # 2500 rows a shard: chunks of 1024
    flip_a_byte_in_a_chunk(tmp_path / "data" / "train" / "shard-00002.h5", chunk=1)
    url = upload(store, tmp_path / "data", "damaged")
    result = mpiexec(2, MPITRAIN, "train", config(tmp_path, url), env={**os.environ, **store.env}, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count(f"{url}/train/shard-00002.h5: rows 1") == 1, result.stderr
    assert "the chunk fails its checksum" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_shard_removed_mid_epoch_ends_every_rank_and_keeps_the_checkpoints(store, tmp_path):
    make_dataset(tmp_path / "data", n_train=30000, n_test=300, shards=3, shape=(1, 8, 8))
    url = upload(store, tmp_path / "data", "vanishing")
    path = config(tmp_path, url, data={"buffer_mb": 0.5}, train={"epochs": 4, "batch_size": 16, "log_every": 20},
                  checkpoint={"unit": "epoch", "every": 1, "keep": 5})
    job = subprocess.Popen([MPIEXEC, "-n", "2", MPITRAIN, "train", path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, **store.env})
    checkpoint = tmp_path / "run" / "checkpoints" / "ckpt-0001-000000.h5"
    deadline = time.monotonic() + 60
    while not checkpoint.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists() and job.poll() is None, "epoch 1 should end before the job does"
    store.filesystem().rm(f"{BUCKET}/vanishing/train/shard-00001.h5")
    _, err = job.communicate(timeout=60)
    assert job.returncode == 2, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and f"{url}/train/shard-00001.h5" in errors[0], err
    assert "(seen on rank" in errors[0] and "Traceback" not in err
    assert checkpoint.exists() and not (tmp_path / "run" / "summary.json").exists()
