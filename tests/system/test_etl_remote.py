"""The ETL writing to an object store: real Spark (local[2]) and a real SeaweedFS S3 server."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.shards import MANIFEST_NAME, Manifest, read_manifest
from mpitrain.etl.job import plan_etl, run_etl
from mpitrain.testing import launch
from mpitrain.testing.datasets import write_config

BUCKET = "etl-tests"


@pytest.fixture(scope="module", autouse=True)
def s3_env(object_store):
    """The store's AWS_* variables for this module (before its SparkSession starts), and the bucket."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in object_store.env.items():
            patch.setenv(name, value)
        object_store.make_bucket(BUCKET)
        yield object_store.env


@pytest.fixture(scope="module")
def spark(s3_env, spark_sessions):
    """local[2] with the store's variables also in the executors' environment (`spark.executorEnv.*`): the shared
    session's JVM started before they were set."""
    with spark_sessions.own("mpitrain-tests-s3", {f"spark.executorEnv.{name}": value
                                                  for name, value in s3_env.items()}) as session:
        yield session


@pytest.fixture(scope="module")
def remote(spark, object_store):
    """digits: written to s3://BUCKET/digits in 3 shards per split, lz4."""
    manifest = run_etl(spark, "digits:", f"s3://{BUCKET}/digits", shards=3, seed=0, compression="lz4")
    return object_store.filesystem(), manifest


def _manifest(fs, prefix: str, tmp_path) -> Manifest:
    (tmp_path / MANIFEST_NAME).write_bytes(fs.cat_file(f"{prefix}/{MANIFEST_NAME}"))
    return read_manifest(str(tmp_path))


def _objects(fs, prefix: str) -> list[str]:
    return sorted(path.removeprefix(prefix + "/") for path in fs.find(prefix))


def test_shards_and_manifest_land_in_the_bucket(remote, tmp_path):
    fs, manifest = remote
    prefix = f"{BUCKET}/digits"
    assert _manifest(fs, prefix, tmp_path) == manifest
    assert (manifest.compression, manifest.chunk_rows, manifest.checksums) == ("lz4", 1024, "fletcher32")
    paths = [shard.path for split in manifest.splits for shard in manifest.shards(split)]
    assert _objects(fs, prefix) == sorted(paths + [MANIFEST_NAME])
    assert not [path for path in fs.find(BUCKET) if ".etl-tmp-" in path]  # the staging prefix is gone
    manifest_time = fs.info(f"{prefix}/{MANIFEST_NAME}")["LastModified"]
    rows = 0
    for split in manifest.splits:
        for shard in manifest.shards(split):
            data = fs.cat_file(f"{prefix}/{shard.path}")
            assert hashlib.sha256(data).hexdigest() == shard.sha256
            assert fs.info(f"{prefix}/{shard.path}")["LastModified"] <= manifest_time
            with fs.open(f"{prefix}/{shard.path}", "rb") as f, h5py.File(f, "r") as h5:
                assert h5["x"].shape == (shard.rows, 1, 8, 8) and h5["x"].fletcher32
                rows += len(h5["y"][:])
    assert rows == 1797


def test_training_streams_the_lz4_shards_the_etl_wrote_to_the_bucket(remote, s3_env, tmp_path):
    """The ETL writes to the store, 2 ranks train from it (lz4 chunks decoded as they arrive), `eval` scores it."""
    config = write_config(tmp_path / "exp.yaml", f"s3://{BUCKET}/digits", run_dir=str(tmp_path / "run"),
                          model={"layers": [{"type": "dense", "units": 32, "activation": "relu"},
                                            {"type": "dense", "units": 10}]},
                          train={"epochs": 3, "global_batch_size": 32})
    env = {**os.environ, **s3_env}
    result = launch.mpiexec(2, launch.MPITRAIN, "train", config, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.85 and 1.0 <= summary["data_read_per_epoch"] < 1.5
    assert summary["data_bytes_fetched"] > summary["data_bytes_read"] > 0  # compressed chunks, and HDF5's metadata
    scored = launch.mpiexec(2, launch.MPITRAIN, "eval", tmp_path / "run", env=env, timeout=60)
    assert scored.returncode == 0, scored.stderr
    evaluation = json.loads((tmp_path / "run" / "eval-test.json").read_text())
    assert evaluation["accuracy"] == pytest.approx(summary["test_accuracy"])


def test_overwrite_replaces_every_object_and_refuses_without_the_flag(spark, remote, tmp_path):
    fs, _ = remote
    run_etl(spark, "digits:", f"s3://{BUCKET}/again", shards=3, seed=0)
    with pytest.raises(DataError, match=f"{BUCKET}/again: exists; pass --overwrite to replace it"):
        plan_etl("digits:", f"s3://{BUCKET}/again", shards=2)
    manifest = run_etl(spark, "digits:", f"s3://{BUCKET}/again/", shards=2, seed=1, overwrite=True,
                       compression="gzip")
    assert _manifest(fs, f"{BUCKET}/again", tmp_path) == manifest
    assert (manifest.seed, manifest.compression) == (1, "gzip")
    assert _objects(fs, f"{BUCKET}/again") == [MANIFEST_NAME, "test/shard-00000.h5", "test/shard-00001.h5",
                                                "train/shard-00000.h5", "train/shard-00001.h5"]
    assert not [path for path in fs.find(BUCKET) if ".etl-tmp-" in path]


def test_a_file_vocabulary_is_staged_and_committed_beside_the_shards(spark, remote, tmp_path):
    """--vocabulary-files to s3://: the tasks upload the parts to the staging prefix, the commit copies them beside
    the manifest, and a reader of the bucket finds every train value's id in them."""
    import pyarrow as pa

    from mpitrain.data.vocabulary_files import FileVocabulary, file_paths
    from mpitrain.etl.sources import SourceOptions
    from mpitrain.etl.tables import TableOptions
    fs, _ = remote
    lines = ["user,amount,y"] + [f"u{i % 300},{i},{i % 2}" for i in range(3000)]  # each user 10 times
    (tmp_path / "users.csv").write_text("\n".join(lines) + "\n")
    manifest = run_etl(spark, f"csv:{tmp_path / 'users.csv'}", f"s3://{BUCKET}/users", shards=2, seed=0,
                       source_options=SourceOptions(label="y", features=("amount",), categorical=("user",)),
                       tables=TableOptions(max_vocabulary=100, vocabulary_files=True))
    entry = manifest.columns["categorical"][0]
    parts = file_paths([entry])
    assert entry["ids"] == 302 and len(parts) == entry["vocabulary_parts"]
    assert _objects(fs, f"{BUCKET}/users") == sorted([MANIFEST_NAME, *parts, "test/shard-00000.h5",
                                                       "test/shard-00001.h5", "train/shard-00000.h5",
                                                       "train/shard-00001.h5"])
    assert not [path for path in fs.find(BUCKET) if ".etl-tmp-" in path]
    ids = FileVocabulary(entry, f"s3://{BUCKET}/users")(pa.array([f"u{i}" for i in range(300)] + ["u300"]))
    assert sorted(ids[:300]) == list(range(2, 302)) and ids[300] == 1


def test_a_prefix_that_is_not_a_dataset_is_refused_even_with_overwrite(object_store):
    fs = object_store.filesystem()
    fs.pipe_file(f"{BUCKET}/notes/readme.txt", b"keep me")
    with pytest.raises(DataError, match=f"{BUCKET}/notes: exists and is not a dataset .no manifest.json."):
        plan_etl("digits:", f"s3://{BUCKET}/notes", shards=2, overwrite=True)
    assert fs.cat_file(f"{BUCKET}/notes/readme.txt") == b"keep me"


def test_a_missing_bucket_and_a_bucket_root_are_refused(object_store):
    with pytest.raises(DataError, match="bucket 'no-such-bucket' does not exist"):
        plan_etl("digits:", "s3://no-such-bucket/digits", shards=2)
    with pytest.raises(DataError, match=f"s3://{BUCKET}: a bucket's root; expected a prefix inside it"):
        plan_etl("digits:", f"s3://{BUCKET}", shards=2)


def test_a_protocol_without_its_package_is_one_line_before_spark():
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    with pytest.raises(ConfigError, match=r"gs://bucket/ds: .*not installed \(Please install gcsfs"):
        plan_etl("digits:", "gs://bucket/ds", shards=2)


def test_cli_writes_compressed_shards_to_s3(object_store):
    done = launch.command(launch.MPITRAIN, "etl", "--source", "digits:", "--out", f"s3://{BUCKET}/cli",
                          "--shards", "2", "--compression", "zstd", "--master", "local[1]", timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"wrote s3://{BUCKET}/cli: train 1438 rows, test 359 rows; 2 shards per split" in done.stdout
    fs = object_store.filesystem()
    with fs.open(f"{BUCKET}/cli/train/shard-00001.h5", "rb") as f, h5py.File(f, "r") as h5:
        x = h5["x"][:]
    assert x.dtype == np.uint8 and 0 < x.max() <= 16
    done = launch.command(launch.MPITRAIN, "etl", "--source", "digits:", "--out", f"s3://{BUCKET}/cli",
                          "--shards", "2", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == \
        f"mpitrain etl: error: s3://{BUCKET}/cli: exists; pass --overwrite to replace it"


HOLD_STORE = """
import time
from mpitrain.testing.objectstore import ObjectStore
with ObjectStore():
    print("up", flush=True)
    time.sleep(600)
"""


def test_a_test_run_killed_by_sigkill_leaves_no_s3_server_behind():
    """A process holding the test's S3 server is killed by SIGKILL (no `finally` runs): `weed` dies with it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_STORE], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        servers = launch.child_processes(holder.pid)
        assert list(servers.values()) == ["weed"], servers
    finally:
        holder.kill()
        holder.wait()
    assert launch.wait_until_gone(servers, 10) == [], servers
