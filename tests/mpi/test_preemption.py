"""Jobs survive preemption and damaged checkpoints: a signal stops every rank at a step boundary with a
checkpoint, the resumed run ends where an uninterrupted one does (bit for bit), and resume falls back past a
damaged newest checkpoint. The Slurm path (scancel --signal=USR1, requeue) is in tests/system/test_slurm.py."""
import json
import os
import re
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.rundir.metrics_file import read_metrics
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPIEXEC, MPITRAIN, command, mpiexec

LONG = {"train": {"epochs": 12, "batch_size": 16, "seed": 1, "log_every": 20},
        "checkpoint": {"every": 100, "unit": "epoch", "keep": 3}}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    make_dataset(folder / "data", n_train=6000, n_test=200)
    return folder / "data"


def rank_pids(config: str) -> list[int]:
    """The PIDs of the ranks running `mpitrain train CONFIG` (python processes: not the launcher)."""
    out = subprocess.run(["pgrep", "-f", f"python.* .*bin/mpitrain train {config}"], capture_output=True,
                         text=True).stdout
    return [int(pid) for pid in out.split()]


def caught_signals(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("SigCgt")).split()[1], 16)


# Each mode with a learning-rate schedule whose state a resume must carry: where it is in the run (a warm-up and a
# cosine by step), and reduce_on_plateau's counters of the epochs' test losses; sharing with early stopping's
# counters instead (min_delta 100: the best is the first epoch's, so it stops after the fourth, after the resume),
# stopped by SIGUSR1 (a batch system's warning) rather than SIGTERM.
SCHEDULES = {"allreduce": {"type": "cosine", "unit": "step", "warmup": 40, "min_lr": 0.005},
             "averaging": {"type": "reduce_on_plateau", "patience": 0, "factor": 0.5, "threshold": 0.3},
             "sharing": {"type": "constant"}}
EARLY_STOPPING = {"sharing": {"monitor": "loss", "patience": 3, "min_delta": 100.0}}
SIGNALS = {"allreduce": signal.SIGTERM, "averaging": signal.SIGTERM, "sharing": signal.SIGUSR1}


@pytest.mark.parametrize("sync", [{"mode": "allreduce"}, {"mode": "averaging", "frequency": 3},
                                  {"mode": "sharing", "threshold": 2.0e-3}], ids=["allreduce", "averaging", "sharing"])
def test_a_signal_to_one_rank_stops_every_rank_with_a_checkpoint_and_resume_ends_bit_identical(data, tmp_path, sync):
    mode, sent = sync["mode"], SIGNALS[sync["mode"]]
    optimizer = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "schedule": SCHEDULES[mode]}
    sections = {**LONG, "train": {**LONG["train"], **({"early_stopping": EARLY_STOPPING[mode]}
                                                      if mode in EARLY_STOPPING else {})}}
    reference = write_config(tmp_path / "reference.yaml", data, run_dir=str(tmp_path / "reference"), sync=sync,
                             optimizer=optimizer, **sections)
    config = write_config(tmp_path / "exp.yaml", data, run_dir=str(tmp_path / "run"), sync=sync,
                          optimizer=optimizer, **sections)
    job = subprocess.Popen([MPIEXEC, "-n", "2", MPITRAIN, "train", config], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while not (metrics.exists() and '"epoch": 1' in metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = rank_pids(config)
    assert len(pids) == 2 and job.poll() is None, "the job ended before the signal"
    assert all(caught_signals(pid) >> (sent - 1) & 1 for pid in pids)  # a handler is installed
    os.kill(pids[1], sent)
    out, err = job.communicate(timeout=60)
    assert job.returncode == 3, err
    stopped = re.search(rf"mpitrain train: stopped by {sent.name} at epoch (\d+) step (\d+): wrote (\S+); resume with "
                        r"the same command", err)
    assert stopped and "Traceback" not in err, err
    assert [line for line in err.splitlines() if sent.name in line] == [stopped.group(0)]  # one line, rank 0's
    assert os.path.basename(stopped.group(3)) == f"ckpt-{int(stopped.group(1)) - 1:04d}-{int(stopped.group(2)):06d}.h5"
    assert not (tmp_path / "run" / "summary.json").exists()
    if mode != "allreduce":  # stopped mid-epoch: the ranks' own updater states (and more) differ
        assert load_checkpoint(stopped.group(3)).rank_arrays.keys() >= {"updater_state"}

    resumed = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {stopped.group(3)}" in resumed.stderr
    uninterrupted = mpiexec(2, MPITRAIN, "train", reference, timeout=120)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("run", "reference")]
    hashes = [summary["replica_hashes"] for summary in summaries]
    assert hashes[0] == hashes[1] and len(set(hashes[0])) == 1  # each rank's final parameters, bit for bit
    if mode in EARLY_STOPPING:  # the counters came through the resume: it stopped where the reference did
        found, expected = ({key: value for key, value in summary["early_stopping"].items() if key != "best_checkpoint"}
                           for summary in summaries)  # best_checkpoint: each run's own folder
        assert found == expected
        assert summaries[0]["early_stopping"]["stopped_at"] == [4, 0], summaries[0]["early_stopping"]
    run, uninterrupted = ({(w["epoch"], w["step"]): w["lr"] for w in read_metrics(str(tmp_path / name / "metrics.jsonl"))[0]}
                          for name in ("run", "reference"))
    assert all(run[window] == lr for window, lr in uninterrupted.items())  # the same rate at every window's end
    assert len(set(run) - set(uninterrupted)) <= 1  # and the window the signal ended, unless it ended there anyway
    if mode != "sharing":
        assert len(set(uninterrupted.values())) > 2 and min(uninterrupted.values()) < 0.05  # the schedule moved it


def test_ctrl_c_on_mpiexec_stops_every_rank_with_a_checkpoint(data, tmp_path):
    """Ctrl-C: mpiexec sends SIGINT to every rank. Python's own handler raised KeyboardInterrupt in one rank while the
    other waited in a collective for it, and the job hung (seen: 60 s and counting, one rank at 100% CPU); SIGINT is
    a stop signal now, and the job ends as under SIGTERM."""
    config = write_config(tmp_path / "exp.yaml", data, run_dir=str(tmp_path / "run"), **LONG)
    job = subprocess.Popen([MPIEXEC, "-n", "2", MPITRAIN, "train", config], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    metrics, deadline = tmp_path / "run" / "metrics.jsonl", time.monotonic() + 60
    while not (metrics.exists() and '"epoch": 0' in metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.poll() is None, "the job ended before Ctrl-C"
    job.send_signal(signal.SIGINT)
    out, err = job.communicate(timeout=60)
    assert job.returncode == 3, err
    stopped = re.search(r"mpitrain train: stopped by SIGINT at epoch \d+ step \d+: wrote (\S+); resume with the same "
                        r"command", err)
    assert stopped and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert os.path.exists(stopped.group(1))


def trained_with_three_checkpoints(data, tmp_path) -> tuple[str, list]:
    config = write_config(tmp_path / "exp.yaml", data, run_dir=str(tmp_path / "run"),
                          train={"epochs": 3, "batch_size": 64, "seed": 1, "log_every": 50},
                          checkpoint={"every": 1, "unit": "epoch", "keep": 3})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    return config, list_checkpoints(str(tmp_path / "run"))


def truncate(path):
    with open(path, "rb+") as f:
        f.truncate(os.path.getsize(path) // 2)


def flip_bytes_in_params(path):
    with h5py.File(path, "r") as f:
        offset = f["params"].id.get_chunk_info(0).byte_offset  # the parameters' raw bytes in the file
    with open(path, "rb+") as f:
        f.seek(offset + 40)
        value = f.read(4)
        f.seek(offset + 40)
        f.write(bytes(b ^ 0xFF for b in value))


def nan_parameter(path):
    with h5py.File(path, "r+") as f:
        params = f["params"][...]
        params[7] = np.nan
        del f["params"]
        f.create_dataset("params", data=params, fletcher32=True)  # a well-formed file holding a NaN


@pytest.mark.parametrize("damage, problem", [(truncate, "not a readable mpitrain checkpoint"),
                                             (flip_bytes_in_params, "not a readable mpitrain checkpoint"),
                                             (nan_parameter, "holds NaN or Inf")])
def test_a_damaged_newest_checkpoint_is_set_aside_and_resume_uses_the_one_before(data, tmp_path, damage, problem):
    config, checkpoints = trained_with_three_checkpoints(data, tmp_path)
    newest = checkpoints[-1]
    damage(newest)
    damaged = open(newest, "rb").read()
    result = mpiexec(2, MPITRAIN, "train", config, "--set", "train.epochs=4", timeout=120)
    assert result.returncode == 0, result.stderr
    assert re.search(rf"{re.escape(newest)}: .*{problem}.*; kept aside as {re.escape(newest)}.damaged, resuming from "
                     rf"the checkpoint before it", result.stderr), result.stderr
    assert f"resuming from {checkpoints[-2]} at epoch 3 step 0" in result.stderr
    assert open(newest + ".damaged", "rb").read() == damaged  # never deleted, not even by the pruning
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path / "run"))][-1] == "ckpt-0004-000000.h5"
    assert load_checkpoint(list_checkpoints(str(tmp_path / "run"))[-1]).epoch == 4


def test_all_checkpoints_damaged_is_one_error(data, tmp_path):
    config, checkpoints = trained_with_three_checkpoints(data, tmp_path)
    for path in checkpoints:
        truncate(path)
    result = mpiexec(2, MPITRAIN, "train", config, "--set", "train.epochs=4", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "none of its 3 checkpoints can be resumed" in errors[0], result.stderr
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == sorted(os.path.basename(p) + ".damaged"
                                                                          for p in checkpoints)
    assert command(MPITRAIN, "eval", tmp_path / "run").returncode == 2  # nothing left to evaluate, said plainly
