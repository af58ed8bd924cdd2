"""`mpitrain tune`: studies run as ordinary MPI jobs (real `mpiexec`) on scikit-learn's digits with a validation
split. Every trial is accounted for, workers never share a trial, a grid point runs once, a pruned trial stops
on every rank at the decision's epoch, a SIGKILLed worker's trial is failed and its parameters run again, a
study continues to its budget, best.yaml trains to its trial's objective exactly, and each trial's TensorBoard
events hold its metrics and its hyperparameters."""
import csv
import json
import os
import signal
import subprocess
import time

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mpitrain.rundir.checkpoint import list_checkpoints
from mpitrain.testing.datasets import make_digits_dataset, write_config
from mpitrain.testing.launch import MPIEXEC, MPITRAIN, command, mpiexec

DIGITS_MLP = {"layers": [{"type": "dense", "units": 16, "activation": "relu"}, {"type": "dense", "units": 10}]}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    make_digits_dataset(folder / "data", validation_fraction=0.2)
    return folder / "data"


def write_study(tmp_path, digits, space, epochs=1, **keys) -> str:
    write_config(tmp_path / "base.yaml", digits, model=DIGITS_MLP,
                 train={"epochs": epochs, "batch_size": 64, "seed": 1, "log_every": 10})
    study = {"base": str(tmp_path / "base.yaml"), "objective": {"metric": "validation.accuracy"}, "space": space,
             **keys}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    return str(tmp_path / "study.yaml")


def trials(folder) -> list[dict]:
    with open(os.path.join(folder, "trials.csv")) as f:
        return list(csv.DictReader(f))


def tune(study: str, workers: int, ranks: int, timeout: float = 400):
    return command(MPITRAIN, "tune", study, "--workers", workers, "--ranks", ranks, timeout=timeout)


def test_a_tpe_study_of_6_trials_on_2_workers_of_2_ranks_and_its_best_config_reproduces(digits, tmp_path):
    study = write_study(tmp_path, digits, {"optimizer.lr": {"float": [0.005, 0.5], "log": True},
                                           "model.layers.0.units": {"int": [4, 32]},
                                           "sync.mode": {"choice": ["allreduce", "averaging"]}},
                        trials=6, sampler="tpe", pruner="median")
    done = tune(study, workers=2, ranks=2)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "study"
    rows = trials(folder)
    assert len(rows) == 6 and {row["state"] for row in rows} <= {"complete", "pruned"}, rows
    assert len({row["run_dir"] for row in rows}) == 6  # no trial run twice, none shared
    assert len({(row["optimizer.lr"], row["model.layers.0.units"]) for row in rows}) == 6
    assert not [name for name in os.listdir(folder) if name.endswith(".lock")]  # no lock left behind
    assert {"history.png", "importances.png", "parallel.png", "best.yaml", "report.png", "report.html"} \
        <= set(os.listdir(folder))
    assert (folder / "report.html").read_text().count("<tr><td>trial-") == 6  # the trials side by side
    assert "6 of 6 trials (" in done.stdout
    for row in rows:  # every trial is an ordinary run directory, trained on 2 ranks
        assert {"config.yaml", "metrics.jsonl", "checkpoints"} <= set(os.listdir(row["run_dir"]))

    best = max((row for row in rows if row["state"] == "complete"), key=lambda row: float(row["objective"]))
    events = EventAccumulator(best["run_dir"])  # rank 0 wrote TensorBoard events beside metrics.jsonl
    events.Reload()
    records = [json.loads(line) for line in open(os.path.join(best["run_dir"], "metrics.jsonl"))]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == \
        [(r["global_step"], pytest.approx(r["loss"])) for r in records if r["kind"] == "window"]
    assert [e.value for e in events.Scalars("hparam/validation.accuracy")] == [pytest.approx(float(best["objective"]))]
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")

    retrained = mpiexec(2, MPITRAIN, "train", str(folder / "best.yaml"), timeout=120)
    assert retrained.returncode == 0, retrained.stderr
    summary = json.loads((folder / "best" / "summary.json").read_text())
    assert summary["test_accuracy"] == float(best["objective"])  # the validation split's, bit for bit
    status = command(MPITRAIN, "tune", str(folder), "--status")
    assert status.returncode == 0 and f"best: trial {best['trial']}," in status.stdout


def test_a_2x3_grid_on_3_workers_runs_each_point_exactly_once_and_again_runs_nothing(digits, tmp_path):
    study = write_study(tmp_path, digits, {"optimizer.lr": {"choice": [0.01, 0.1]},
                                           "model.layers.0.units": {"choice": [4, 8, 16]}}, sampler="grid",
                        pruner="none")
    done = tune(study, workers=3, ranks=1)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = trials(tmp_path / "study")
    points = {(float(row["optimizer.lr"]), int(row["model.layers.0.units"])) for row in rows}
    assert len(rows) == 6 and points == {(lr, units) for lr in (0.01, 0.1) for units in (4, 8, 16)}
    assert {row["state"] for row in rows} == {"complete"}
    again = tune(study, workers=3, ranks=1)
    assert again.returncode == 0 and len(trials(tmp_path / "study")) == 6

    drawn = sorted(name for name in os.listdir(tmp_path / "study") if name.endswith((".png", ".html")))
    assert drawn == ["history.png", "importances.png", "parallel.png", "report.html", "report.png"]  # by `tune`
    for name in drawn:
        os.remove(tmp_path / "study" / name)
    quiet = mpiexec(1, MPITRAIN, "tune-worker", study, "--no-plots", timeout=120)  # as `tune` starts its workers
    assert quiet.returncode == 0 and "this worker ran 0 trials" in quiet.stdout, quiet.stderr[-3000:]
    assert not [name for name in os.listdir(tmp_path / "study") if name.endswith((".png", ".html"))]


def test_a_pruned_trial_stops_on_every_rank_after_the_epoch_of_the_decision(digits, tmp_path):
    study = write_study(tmp_path, digits, {"optimizer.lr": {"choice": [0.1, 1.0e-6]}}, epochs=3, sampler="grid",
                        pruner={"type": "median", "n_startup_trials": 1, "n_warmup_steps": 0})
    done = mpiexec(2, MPITRAIN, "tune-worker", study, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = trials(tmp_path / "study")
    assert [row["state"] for row in rows] == ["complete", "pruned"], rows
    assert "trial 1 pruned after epoch 1 on rank 0" in done.stderr
    assert "trial 1 pruned after epoch 1 on rank 1" in done.stderr
    records = [json.loads(line) for line in open(os.path.join(rows[1]["run_dir"], "metrics.jsonl"))]
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [0]  # no step of epoch 2 was recorded
    assert max(r["epoch"] for r in records) == 0
    assert not os.path.exists(os.path.join(rows[1]["run_dir"], "summary.json"))


@pytest.mark.alone
def test_a_sigkilled_worker_s_trial_is_failed_and_its_parameters_run_again(digits, tmp_path):
    study = write_study(tmp_path, digits, {"optimizer.lr": {"float": [0.01, 0.1]}}, epochs=4, trials=2,
                        sampler="random", pruner="none", heartbeat_s=3)
    # the worker to kill evaluates slowly (rank 0 sleeps 2 s at each epoch's evaluation, before the epoch's record
    # and checkpoint), so it is still in its second epoch when killed; the workers after it train at full speed
    worker = subprocess.Popen([MPIEXEC, "-n", "2", MPITRAIN, "tune-worker", study], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True,
                              env={**os.environ, "MPITRAIN_TEST_SLOW": "the evaluation@0:2"})
    trial = tmp_path / "study" / "trials" / "trial-0000"
    deadline = time.monotonic() + 120
    # the epoch's record comes before its checkpoint (mpitrain/training/loop.py's _end_epoch): wait for both
    while not (list_checkpoints(str(trial)) and '"kind": "epoch"' in (trial / "metrics.jsonl").read_text()) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker.poll() is None, "the worker ended before it was killed"
    assert len(list_checkpoints(str(trial))) == 1, "the worker went past its first epoch"
    os.killpg(worker.pid, signal.SIGKILL)  # mpiexec, its proxy and both ranks, as the OOM killer or a lost node
    worker.wait()
    time.sleep(3.5)  # the heartbeat goes stale

    done = tune(study, workers=1, ranks=2)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = trials(tmp_path / "study")
    assert [row["state"] for row in rows] == ["fail", "complete", "complete"], rows
    assert "no heartbeat" in rows[0]["failure"]
    retry = next(row for row in rows[1:] if row["optimizer.lr"] == rows[0]["optimizer.lr"])
    assert retry["run_dir"] == rows[0]["run_dir"]  # the retry resumes the killed attempt's checkpoints
    assert "resuming from" in done.stderr


def test_sigterm_to_tune_stops_the_trial_with_a_checkpoint_and_the_same_command_resumes_it(digits, tmp_path):
    study = write_study(tmp_path, digits, {"optimizer.lr": {"float": [0.01, 0.1]}}, epochs=30, trials=1,
                        sampler="random", pruner="none")
    job = subprocess.Popen([MPITRAIN, "tune", study, "--workers", "1", "--ranks", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "study" / "trials" / "trial-0000" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and '"kind": "epoch"' in metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    job.send_signal(signal.SIGTERM)  # as scancel or a preemption would: it goes on to every worker
    out, err = job.communicate(timeout=120)
    assert job.returncode == 3, err[-3000:]
    assert "mpitrain tune-worker: stopped by SIGTERM" in err
    rows = trials(tmp_path / "study")
    assert [row["state"] for row in rows] == ["fail", "waiting"], rows
    assert rows[0]["failure"] == "stopped by a signal; retried from its checkpoint; retried as trial 1"

    again = tune(study, workers=1, ranks=2)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {rows[0]['run_dir']}/checkpoints/" in again.stderr
    rows = trials(tmp_path / "study")
    assert [row["state"] for row in rows] == ["fail", "complete"] and rows[1]["run_dir"] == rows[0]["run_dir"]
    assert "1 of 1 trials (1 complete); 1 failed attempt retried" in again.stdout


def test_a_study_stopped_after_3_trials_continues_to_exactly_6_without_repeating(digits, tmp_path):
    space = {"optimizer.lr": {"float": [0.01, 0.3], "log": True}}
    study = write_study(tmp_path, digits, space, trials=3, sampler="random", pruner="none")
    first = tune(study, workers=1, ranks=1)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = trials(tmp_path / "study")
    assert len(rows) == 3
    finished = {row["run_dir"]: os.stat(os.path.join(row["run_dir"], "summary.json")).st_mtime_ns for row in rows}

    study = write_study(tmp_path, digits, space, trials=6, sampler="random", pruner="none")
    second = tune(study, workers=2, ranks=1)
    assert second.returncode == 0, second.stderr[-3000:]
    rows = trials(tmp_path / "study")
    assert len(rows) == 6 and {row["state"] for row in rows} == {"complete"}
    assert {run_dir: os.stat(os.path.join(run_dir, "summary.json")).st_mtime_ns for run_dir in finished} == finished

    other = write_study(tmp_path, digits, {"optimizer.lr": {"float": [0.01, 0.2]}}, trials=6, sampler="random",
                        pruner="none")
    refused = tune(other, workers=1, ranks=1)
    assert refused.returncode == 2 and "space differs from the study in" in refused.stderr
    study = write_study(tmp_path, digits, space, trials=6, sampler="random", pruner="none")
    write_config(tmp_path / "base.yaml", digits, model=DIGITS_MLP, train={"epochs": 2, "batch_size": 64, "seed": 1})
    refused = tune(study, workers=1, ranks=1)
    assert refused.returncode == 2 and "base.yaml: changed since the study in" in refused.stderr
    assert len(trials(tmp_path / "study")) == 6
