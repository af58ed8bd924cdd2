"""Early stopping under real `mpiexec -n 2` (train.early_stopping): every rank stops at the same evaluation point,
by epoch or by step, with the final checkpoint there and the best kept as checkpoints/best.h5 (which eval, predict and
export take, and `checkpoint.keep` never deletes); summary.json says why and where; the same command again finds the
run finished. (The counters' resume is in tests/unit/training/test_early_stopping.py.)"""
import json

import h5py
import pytest

from mpitrain.rundir.checkpoint import list_checkpoints
from mpitrain.rundir.directory import RunDir
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec

# 320 rows, 16 per rank: 10 steps per epoch. min_delta 100: only the first evaluation counts as an improvement.
TRAIN = {"epochs": 10, "batch_size": 16, "seed": 1, "log_every": 5}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("early")
    make_dataset(folder / "data", n_train=320, n_test=64)
    return folder / "data"


def summary(run_dir) -> dict:
    return json.loads(open(RunDir(str(run_dir)).summary).read())


def test_by_epoch_every_rank_stops_after_patience_and_eval_takes_the_best(data, tmp_path):
    config = write_config(tmp_path / "exp.yaml", data, run_dir=str(tmp_path / "run"),
                          train={**TRAIN, "early_stopping": {"monitor": "loss", "patience": 2, "min_delta": 100.0}},
                          checkpoint={"every": 1, "unit": "epoch", "keep": 1})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "early stopping: loss" in result.stderr and "stopping: no improvement in 2 evaluations" in result.stderr
    found = summary(tmp_path / "run")
    stopped = found["early_stopping"]
    assert stopped["stopped_early"] and stopped["best_at"] == [1, 0] and stopped["stopped_at"] == [3, 0]
    assert len(set(found["replica_hashes"])) == 1  # both ranks stopped at the same step with one model
    epochs = [json.loads(line)["epoch"] for line in open(tmp_path / "run" / "metrics.jsonl") if '"kind": "epoch"' in line]
    assert epochs == [0, 1, 2]
    files = RunDir(str(tmp_path / "run"))
    assert [p.rsplit("/", 1)[1] for p in list_checkpoints(str(tmp_path / "run"))] == ["ckpt-0003-000000.h5"]
    with h5py.File(files.best_checkpoint, "r") as f:  # keep: 1 deleted the epoch-1 checkpoint, not the best
        assert (int(f.attrs["epoch"]), int(f.attrs["step"])) == (1, 0)

    best = mpiexec(2, MPITRAIN, "eval", str(tmp_path / "run"), "--split", "test", timeout=120)
    latest = mpiexec(2, MPITRAIN, "eval", str(tmp_path / "run"), "--split", "test", "--checkpoint", "latest",
                     timeout=120)
    assert best.returncode == latest.returncode == 0, best.stderr + latest.stderr
    assert "best.h5" in best.stdout and "ckpt-0003-000000.h5" in latest.stdout

    again = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert again.returncode == 0 and "is finished: early stopping ended it after 3 epochs" in again.stderr
    assert summary(tmp_path / "run") == found


def test_by_step_every_rank_stops_mid_epoch_at_the_same_step(data, tmp_path):
    config = write_config(tmp_path / "exp.yaml", data, run_dir=str(tmp_path / "run"),
                          train={**TRAIN, "early_stopping": {"monitor": "accuracy", "patience": 1, "min_delta": 100.0,
                                                             "unit": "step", "every": 7}})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    stopped = summary(tmp_path / "run")["early_stopping"]
    assert stopped["best_at"] == [0, 7] and stopped["stopped_at"] == [1, 4]  # run steps 7 and 14: epoch 1, step 4
    assert [p.rsplit("/", 1)[1] for p in list_checkpoints(str(tmp_path / "run"))][-1] == "ckpt-0001-000004.h5"
    assert len(set(summary(tmp_path / "run")["replica_hashes"])) == 1
