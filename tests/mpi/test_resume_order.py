"""A run stopped mid-epoch resumes in the same epoch order on another rank count: exactly the rows left, the same
global batches, the parameters of an uninterrupted run (bit for bit on the same rank count)."""
import json
import os
import shutil

import h5py
import numpy as np
import pytest

from mpitrain.rundir.checkpoint import list_checkpoints
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec

ORDER = {"train": {"global_batch_size": 12, "epochs": 2, "seed": 4, "log_every": 10},
         "data": {"buffer_mb": 0.05},  # windows of a few global batches
         "checkpoint": {"unit": "step", "every": 7, "keep": 100}}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("resume-order") / "data"
    make_dataset(path, n_train=600, n_test=60, shards=3)
    return path


def run(tmp_path, data, name: str, n: int, sections=ORDER, run_dir=None):
    """Train `name` on n ranks, recording each batch's rows; returns (run_dir, {(epoch, step): rows of all ranks})."""
    run_dir = run_dir or tmp_path / name
    config = write_config(tmp_path / f"{name}.yaml", data, run_dir=str(run_dir), **sections)
    rows = tmp_path / f"rows-{name}"
    result = mpiexec(n, MPITRAIN, "train", config, timeout=180, env={**os.environ, "MPITRAIN_DEBUG_ROWS": str(rows)})
    assert result.returncode == 0, result.stderr
    steps = {}
    for path in rows.glob("rows-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault((record["epoch"], record["step"]), []).extend(record["rows"])
    return run_dir, {key: sorted(value) for key, value in steps.items()}


def final_params(run_dir) -> np.ndarray:
    with h5py.File(list_checkpoints(str(run_dir))[-1]) as f:
        return f["params"][...]


def stopped_at(tmp_path, full_run, name: str, step: int):
    """A run directory holding only `full_run`'s checkpoint at epoch 1 step `step`: a run stopped there."""
    run_dir = tmp_path / name
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(full_run / "checkpoints" / f"ckpt-0000-{step:06d}.h5", run_dir / "checkpoints")
    return run_dir


def test_a_mid_epoch_stop_on_2_ranks_resumes_on_3_with_exactly_the_rows_left(data, tmp_path):
    two, two_rows = run(tmp_path, data, "two", 2)
    three, three_rows = run(tmp_path, data, "three", 3)
    assert two_rows == three_rows  # per-rank batches of 6 and of 4: the same global batches
    steps = 600 // 12
    assert set(two_rows) == {(e, k) for e in (0, 1) for k in range(steps)}

    resumed, resumed_rows = run(tmp_path, data, "resumed", 3, run_dir=stopped_at(tmp_path, two, "resumed", 14))
    assert set(resumed_rows) == {(0, k) for k in range(14, steps)} | {(1, k) for k in range(steps)}
    done_before = {row for k in range(14) for row in two_rows[(0, k)]}
    rest = [row for k in range(14, steps) for row in resumed_rows[(0, k)]]
    assert len(rest) == len(set(rest)) and not done_before & set(rest) and len(done_before) + len(rest) == 600
    assert all(resumed_rows[key] == two_rows[key] for key in resumed_rows)
    np.testing.assert_allclose(final_params(resumed), final_params(three), rtol=1e-4, atol=1e-6)

    same, _ = run(tmp_path, data, "same", 2, run_dir=stopped_at(tmp_path, two, "same", 21))
    np.testing.assert_array_equal(final_params(same), final_params(two))  # bit for bit on the same rank count


def test_a_mid_epoch_resume_with_another_global_batch_is_refused(data, tmp_path):
    two, _ = run(tmp_path, data, "two", 2, sections={**ORDER, "train": {**ORDER["train"], "epochs": 1}})
    run_dir = stopped_at(tmp_path, two, "other", 7)
    config = write_config(tmp_path / "other.yaml", data, run_dir=str(run_dir),
                          **{**ORDER, "train": {**ORDER["train"], "global_batch_size": 24}})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("ckpt-0000-000007.h5: stopped at step 7 of epoch 1 with a global batch of 12 rows; "
                               "train.global_batch_size was 12, so this run's is 24 (train.global_batch_size 24); "
                               "the rest of the epoch needs its global batch: resume with train.global_batch_size: "
                               "12") == 1
    assert list_checkpoints(str(run_dir)) == [str(run_dir / "checkpoints" / "ckpt-0000-000007.h5")]
