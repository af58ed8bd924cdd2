"""Reliability under real mpiexec: resume equals an uninterrupted run, rank faults end the job, NaN stops it."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from mpitrain.parallel.sync import parameter_hash
from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPIEXEC, MPITRAIN, RANK_SCRIPTS, command, mpiexec, train_each


def final_hash(run_dir):
    return json.loads((run_dir / "summary.json").read_text())["replica_hashes"][0]


def all_hashes(run_dir):
    """Each rank's hash of its final parameters and statistics (summary.json's `replica_hashes`)."""
    return json.loads((run_dir / "summary.json").read_text())["replica_hashes"]


def run(config, n=2, *overrides, timeout=120):
    return mpiexec(n, MPITRAIN, "train", config, *[f"--set={o}" for o in overrides], timeout=timeout)


CNN = {"layers": [{"type": "conv2d", "filters": 3, "kernel": 3, "padding": "same"}, {"type": "batchnorm"},
                  {"type": "relu"}, {"type": "flatten"}, {"type": "dropout", "rate": 0.3}, {"type": "dense", "units": 3}]}


STEP_CHECKPOINT_CASES = {  # id: (sync, model)
    "allreduce": ({"mode": "allreduce"}, {}), "averaging": ({"mode": "averaging", "frequency": 4}, {}),
    "sharing": ({"mode": "sharing", "threshold": 2.0e-3}, {}),
    "sharing-split": ({"mode": "sharing", "threshold": 2.0e-3, "exchange": "split"}, {}),
    "averaging-cnn-batchnorm-dropout": ({"mode": "averaging", "frequency": 4}, CNN), "none": ({"mode": "none"}, {})}


@pytest.fixture(scope="module")
def step_checkpoints(tmp_path_factory) -> tuple[dict, str]:
    """Each case of STEP_CHECKPOINT_CASES twice on 2 ranks: `straight`, 3 epochs without a checkpoint but at the end;
    `pieces`, 1 epoch with one every 7 steps (mid-averaging at frequency 4), then, as if killed after step 14 of
    epoch 1 (the checkpoint its end wrote removed), resumed from step 14 to 3 epochs. The runs of every case train
    in turn in one job, and the resumes in another (as a Python script would: ranks/train_each.py).
    ({case: (folder, the mid-epoch checkpoint resumed from)}, the resumes' output)."""
    root = tmp_path_factory.mktemp("step-checkpoints")
    make_dataset(root / "data", n_train=600)
    trained, folders = [], {}
    for case, (sync, model) in STEP_CHECKPOINT_CASES.items():
        folders[case] = root / case
        for name, epochs, checkpoint in (("straight", 3, {"unit": "epoch", "every": 100}),
                                         ("pieces", 1, {"unit": "steps", "every": 7, "keep": 10})):
            os.makedirs(folders[case] / name)
            trained.append(write_config(folders[case] / name / "exp.yaml", root / "data", sync=sync,
                                        checkpoint=checkpoint, train={"epochs": epochs}, model=model))
    result = train_each(2, *trained, timeout=600)
    assert result.returncode == 0, result.stderr
    resumed, resumes = {}, []
    for case, folder in folders.items():
        ckpts = list_checkpoints(str(folder / "pieces" / "run"))
        os.remove(ckpts[-1])
        resumed[case] = (folder, ckpts[-2])
        resumes += [str(folder / "pieces" / "exp.yaml"), "--set", "train.epochs=3"]
    result = train_each(2, *resumes, timeout=600)
    assert result.returncode == 0, result.stderr
    return resumed, result.stderr


@pytest.mark.parametrize("case", list(STEP_CHECKPOINT_CASES))
def test_step_checkpoints_leave_training_alone_and_resume_matches_an_uninterrupted_run_bit_for_bit(step_checkpoints,
                                                                                                   case):
    (folder, mid_epoch_path), err = step_checkpoints[0][case], step_checkpoints[1]
    sync = STEP_CHECKPOINT_CASES[case][0]
    assert mid_epoch_path.endswith("ckpt-0000-000014.h5")
    mid_epoch = load_checkpoint(mid_epoch_path)
    assert mid_epoch.ranks == 2
    if sync["mode"] != "allreduce":  # each rank's own state is kept beside the merged one
        assert mid_epoch.rank_arrays and all(stacked.shape[0] == 2 for stacked in mid_epoch.rank_arrays.values())
    assert f"resuming from {mid_epoch_path}" in err, err
    assert "merged state" not in err
    # every rank's final parameters as an uninterrupted run without step checkpoints ends
    assert all_hashes(folder / "pieces" / "run") == all_hashes(folder / "straight" / "run")
    # the last checkpoint holds the model the run evaluated (sharing keeps its pending residual beside it)
    last = load_checkpoint(list_checkpoints(str(folder / "pieces" / "run"))[-1])
    assert parameter_hash(last.params, last.stats) == final_hash(folder / "pieces" / "run")
    assert (abs(last.sync_arrays["residual"]).max() > 0) if sync["mode"] == "sharing" else not last.sync_arrays


@pytest.mark.parametrize("sync", [{"mode": "averaging", "frequency": 3}, {"mode": "sharing", "threshold": 2.0e-3}],
                         ids=["averaging", "sharing"])
def test_a_mid_epoch_checkpoint_resumes_on_another_number_of_ranks_from_the_merged_state(tmp_path, sync):
    make_dataset(tmp_path / "data", n_train=600)
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", sync=sync,
                          checkpoint={"unit": "steps", "every": 5, "keep": 10},
                          train={"epochs": 1, "global_batch_size": 48})  # 2 ranks or 3 take 24 or 16 rows a step
    assert run(config, 2).returncode == 0
    ckpts = list_checkpoints(str(tmp_path / "run"))
    os.remove(ckpts[-1])  # as if stopped after step 10 of epoch 1
    with h5py.File(ckpts[-2]) as f:  # each rank's own state, checksummed, beside the merged one
        assert f.attrs["ranks"] == 2 and f["ranks/1/updater_state"].fletcher32
        assert ("ranks/1/params" in f) == (sync["mode"] == "averaging")
        assert ("ranks/1/sync/residual" in f) == (sync["mode"] == "sharing")
    result = run(config, 3, "train.epochs=2")
    assert result.returncode == 0 and "resuming from" in result.stderr and "step 10" in result.stderr, result.stderr
    assert "this run has 3 ranks, so every rank starts from their merged state" in result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ranks"] == 3 and summary["epochs"] == 2 and len(set(summary["replica_hashes"])) == 1
    assert np.isfinite(summary["test_loss"]) and np.isfinite(load_checkpoint(
        list_checkpoints(str(tmp_path / "run"))[-1]).params).all()


def one_epoch_of_sharing(tmp_path):
    """The config of a finished 1-epoch sharing run on 2 ranks (its checkpoints hold a residual)."""
    make_dataset(tmp_path / "data", n_train=600)
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", sync={"mode": "sharing", "threshold": 2.0e-3},
                          train={"epochs": 1})
    assert run(config, 2).returncode == 0
    return config


def test_sharing_resumes_on_another_number_of_ranks(tmp_path):
    result = run(one_epoch_of_sharing(tmp_path), 4, "train.epochs=2")
    assert result.returncode == 0 and "resuming from" in result.stderr, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ranks"] == 4 and summary["epochs"] == 2 and len(set(summary["replica_hashes"])) == 1


def test_sharing_resumed_by_another_mode_says_its_residual_is_dropped(tmp_path):
    result = run(one_epoch_of_sharing(tmp_path), 2, "train.epochs=2", "sync.mode=allreduce")
    assert result.returncode == 0 and "resuming from" in result.stderr, result.stderr
    assert result.stderr.count("the checkpoint's 'residual' (of another sync mode) is dropped: "
                               "sync.mode allreduce does not keep it") == 1, result.stderr
    assert not load_checkpoint(list_checkpoints(str(tmp_path / "run"))[-1]).sync_arrays


def test_an_exception_mid_epoch_on_rank_1_of_4_ends_the_job(tmp_path):
    make_dataset(tmp_path / "data", n_train=800)
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data")
    started = time.monotonic()
    result = mpiexec(4, sys.executable, os.path.join(RANK_SCRIPTS, "raise_mid_epoch.py"), config, 1, 5, timeout=60)
    assert result.returncode != 0
    assert "[rank 1] RuntimeError: injected fault at step 5" in result.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_killed_rank_ends_the_job_and_resume_finishes(tmp_path):
    make_dataset(tmp_path / "data", n_train=4000, shape=(1, 8, 8))
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", train={"epochs": 500, "batch_size": 16})
    job = subprocess.Popen([MPIEXEC, "-n", "2", MPITRAIN, "train", config], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while len(list_checkpoints(str(tmp_path / "run"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = [int(p) for p in subprocess.run(["pgrep", "-f", f"bin/python .*mpitrain train {config}"],
                                                capture_output=True, text=True).stdout.split()]
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGKILL)
        job.wait(timeout=30)  # no hang: the surviving rank goes with it
    finally:
        job.kill()
    assert job.returncode != 0
    last = list_checkpoints(str(tmp_path / "run"))[-1]
    with h5py.File(last) as f:
        resumed_from = int(f.attrs["epoch"])
    result = mpiexec(2, MPITRAIN, "train", config, "--resume", f"--set=train.epochs={resumed_from + 2}",
                     "--set=resume=never", timeout=120)  # --resume wins over the config's resume key
    assert result.returncode == 0, result.stderr
    assert f"resuming from {last}" in result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # every epoch once: what was logged after the checkpoint, before the kill, is dropped on resume
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == list(range(resumed_from + 2))
    steps = [r["global_step"] for r in records if r["kind"] == "window"]
    assert steps == sorted(set(steps))


def test_a_run_directory_only_rank_0_sees_trains_resumes_and_finishes(tmp_path):
    """run_dir on rank 0's node-local disk, or an NFS client's cached listing of checkpoints/ on another node: rank 1
    runs in a mount namespace of its own, with an empty tmpfs over the folder. Rank 0 alone writes and reads the
    checkpoints; before, rank 1's empty listing raised IndexError once training was complete (exit 1, no
    summary.json)."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("hiding the run directory from rank 1 mounts a tmpfs, which needs root")
        pytest.skip("needs root to mount a tmpfs")
    make_dataset(tmp_path / "data", n_train=320, n_test=64)
    (tmp_path / "local").mkdir()
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", run_dir=str(tmp_path / "local" / "run"),
                          train={"epochs": 1, "batch_size": 16})
    for epochs in (1, 2):  # trains, then resumes
        hidden = f"mount -t tmpfs none {tmp_path / 'local'} && exec {MPITRAIN} train {config} --set=train.epochs={epochs}"
        result = command(MPIEXEC, "-n", 1, MPITRAIN, "train", config, f"--set=train.epochs={epochs}", ":",
                         "-n", 1, "unshare", "-m", "sh", "-c", hidden, timeout=120)
        assert result.returncode == 0, result.stderr
        summary = json.loads((tmp_path / "local" / "run" / "summary.json").read_text())
        assert summary["epochs"] == epochs and summary["final_checkpoint"] == f"ckpt-{epochs:04d}-000000.h5"


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    make_dataset(tmp_path / "data", n_train=480)
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", train={"epochs": 1})
    assert run(config).returncode == 0
    result = run(config, 2, "train.epochs=3", "optimizer.lr=1000")  # the largest lr optimizer.lr allows
    assert result.returncode == 2
    assert "training diverged" in result.stderr and "epoch 2" in result.stderr
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path / "run"))] == ["ckpt-0001-000000.h5"]


@pytest.mark.alone
@pytest.mark.parametrize("where", ["start-up", "the summary"])
def test_the_watchdog_also_covers_start_up_and_the_summary(tmp_path, where):
    """A rank stuck before training (reading a manifest that never comes: an http:// store that takes the connection
    and never answers; a dataset file that is a FIFO is refused at once) or after it (rank 0 writing summary.json
    into a FIFO nobody reads) ends the job with the watchdog's message, naming where."""
    make_dataset(tmp_path / "data", n_train=200)
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel completes the connections; nothing replies
    data = f"http://127.0.0.1:{silent.getsockname()[1]}/data" if where == "start-up" else tmp_path / "data"
    if where == "the summary":
        (tmp_path / "run").mkdir()
        os.mkfifo(tmp_path / "run" / "summary.json.tmp")
    config = write_config(tmp_path / "exp.yaml", data, train={"epochs": 1, "watchdog_s": 3})
    started = time.monotonic()
    with silent:
        result = mpiexec(2, MPITRAIN, "train", config, timeout=60)
    assert result.returncode != 0
    assert "watchdog: no progress for" in result.stderr and f"(train.watchdog_s = 3) at {where}" in result.stderr
    assert time.monotonic() - started < 30


@pytest.mark.alone
def test_watchdog_aborts_a_stuck_job():
    started = time.monotonic()
    result = mpiexec(2, sys.executable, os.path.join(RANK_SCRIPTS, "stuck_rank.py"), timeout=60)
    assert result.returncode != 0
    assert "[rank 1] watchdog: no progress for" in result.stderr and "stuck_rank.py" in result.stderr
    assert time.monotonic() - started < 30
