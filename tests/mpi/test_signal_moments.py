"""SIGUSR1 and SIGTERM at every moment of a job, from main's first line to the report, end every rank with exit 3
and one line: the checkpoint of the step it stopped at, or "nothing to save" before the first step. No MPI banner,
no traceback, nothing written before the signal changed. Each moment is reached by a barrier file
(tests/mpi/ranks/signal_moment.py holds the ranks there until the test has sent the signal), not by a sleep."""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.testing.datasets import make_dataset, make_digits_dataset, write_config
from mpitrain.testing.launch import MPIEXEC, MPITRAIN, RANK_SCRIPTS, mpiexec

# a second signal within 10 ms of the first: no other test's ranks beside these (tests/conftest.py, MachineShare)
pytestmark = pytest.mark.alone

TRAIN = {"epochs": 2, "batch_size": 16, "seed": 1, "log_every": 5}  # 600 rows, 2 ranks: 18 steps per epoch
NOTHING_SAVED = r"stopped by {} before the first step, nothing to save; resume with the same command"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    make_dataset(folder / "data", n_train=600, n_test=200)
    return folder / "data"


@dataclass
class Stopped:
    """What a job signalled at a moment left: its status, output, the ranks' reports and the files before and after."""

    returncode: int
    stdout: str
    stderr: str
    ready: dict
    exits: dict
    before: dict
    after: dict


def checksums(folder: Path) -> dict:
    """sha256 of every file under `folder`, but the barrier files and the run directory's lock."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and "barrier" not in p.parts and p.name != ".lock"}


def wait_for(paths: list[Path], job: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            out, err = job.communicate()
            pytest.fail(f"the ranks never reached the moment (exit {job.returncode}):\n{out}\n{err}")
        time.sleep(0.005)


def signal_at(tmp_path: Path, moment: str, args: list, rank: int, number: int, paused=(0, 1), again: str = "") \
        -> Stopped:
    """Run `mpitrain ARGS` on 2 ranks held at `moment`; send `number` to `rank` there, then let them go. `again`
    sends it a second time: "now" right after the first, within 10 ms; "stopped" when the ranks pause again as the
    stop leaves `train` (the `stopping` moment), where a handler given back to MPI or the default used to kill them."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    job = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, os.path.join(RANK_SCRIPTS, "signal_moment.py"),
                            str(barrier), moment, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for([barrier / f"ready-{r}" for r in paused] + [barrier / f"pid-{r}" for r in (0, 1)], job)
        before = checksums(tmp_path)
        pid = int((barrier / f"pid-{rank}").read_text())
        first = time.monotonic()
        os.kill(pid, number)
        if again == "now":
            os.kill(pid, number)
            assert time.monotonic() - first < 0.01
        (barrier / "go").touch()
        if again == "stopped":
            wait_for([barrier / f"ready-stopped-{r}" for r in paused], job)
            os.kill(pid, number)
            (barrier / "go-stopped").touch()
        out, err = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    return Stopped(job.returncode, out, err,
                   {r: json.loads((barrier / f"ready-{r}").read_text()) for r in paused},
                   {r: (barrier / f"exit-{r}").read_text() if (barrier / f"exit-{r}").exists() else None
                    for r in (0, 1)},
                   before, checksums(tmp_path))


def assert_stopped(result: Stopped, line: str) -> re.Match:
    """Exit 3 from mpiexec and every rank, one line about the signal (matching `line`), no banner or traceback, and
    every file there before the signal unchanged (the run's logs, metrics.jsonl and TensorBoard's events file, only
    appended to). Returns the line's match."""
    everything = result.stdout + result.stderr
    assert result.returncode == 3 and result.exits == {0: "3", 1: "3"}, (result.exits, everything)
    for crash in ("BAD TERMINATION", "Traceback", "Segmentation fault", "EXIT STRING"):
        assert crash not in everything, everything
    about = [text for text in result.stderr.splitlines() if "SIGUSR1" in text or "SIGTERM" in text]
    assert len(about) == 1, result.stderr
    match = re.fullmatch(line, about[0])
    assert match, result.stderr
    for path, digest in result.before.items():
        if path.endswith("metrics.jsonl") or "events.out.tfevents." in path:
            continue
        assert result.after.get(path) == digest, f"{path} changed"
    return match


def assert_checkpoint_of(match: re.Match, epoch: int, step: int) -> None:
    path = match.group("checkpoint")
    assert os.path.basename(path) == f"ckpt-{epoch:04d}-{step:06d}.h5"
    ckpt = load_checkpoint(path)
    assert (ckpt.epoch, ckpt.step) == (epoch, step)


def train_config(tmp_path: Path, data: Path, **sections) -> str:
    return write_config(tmp_path / "exp.yaml", data, run_dir=str(tmp_path / "run"), train=TRAIN, **sections)


@pytest.mark.parametrize("moment, rank, number", [("before-mpi-init", 1, signal.SIGUSR1),
                                                  ("mpi-init", 0, signal.SIGUSR1),
                                                  ("set-up", 0, signal.SIGUSR1),
                                                  ("set-up", 1, signal.SIGTERM)])
def test_a_signal_before_the_first_step_stops_every_rank_with_nothing_to_save(data, tmp_path, moment, rank, number):
    config = train_config(tmp_path, data)
    result = signal_at(tmp_path, moment, ["train", config], rank, number)
    name = signal.Signals(number).name
    assert_stopped(result, "mpitrain train: " + NOTHING_SAVED.format(name))
    assert list_checkpoints(str(tmp_path / "run")) == []
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    started = {"before-mpi-init": False, "mpi-init": True, "set-up": True}[moment]
    assert all(ready["mpi_started"] is started for ready in result.ready.values())
    if moment == "mpi-init":  # MPI's SIGUSR1 handler is installed, so the signal must wait for mpitrain's
        assert all(ready["sigusr1_blocked"] for ready in result.ready.values())


def test_a_signal_in_pretraining_stops_every_rank_keeping_the_finished_layers(tmp_path):
    make_digits_dataset(tmp_path / "digits")
    config = write_config(tmp_path / "exp.yaml", tmp_path / "digits", run_dir=str(tmp_path / "run"), train=TRAIN,
                          data={"normalize": False}, model={"layers": []},
                          pretrain={"layers": [16, 8], "epochs": 1, "sync": {"mode": "averaging"}})
    result = signal_at(tmp_path, "pretraining", ["train", config], 1, signal.SIGTERM)
    first = tmp_path / "run" / "pretrain" / "layer-00.h5"
    assert_stopped(result, rf"mpitrain train: stopped by SIGTERM in pretraining at layer 2 epoch 1 step 4, before "
                           rf"the first step, kept {first}; layer 2 starts again; resume with the same command")
    assert sorted(os.listdir(tmp_path / "run" / "pretrain")) == ["layer-00.h5"]
    assert list_checkpoints(str(tmp_path / "run")) == []
    resumed = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert resumed.returncode == 0 and f"pretrain layer 1/2: loaded {first}" in resumed.stderr, resumed.stderr


@pytest.mark.parametrize("moment, rank, number, again, step",
                         [("first-step", 1, signal.SIGTERM, "", 2),
                          ("mid-epoch", 0, signal.SIGUSR1, "", 7),
                          ("mid-epoch", 1, signal.SIGUSR1, "now", 7),
                          ("stopping", 1, signal.SIGUSR1, "stopped", 7),
                          ("stopping", 0, signal.SIGTERM, "stopped", 7)],
                         ids=["first-step", "mid-epoch", "twice-within-10ms", "again-while-stopping-usr1",
                              "again-while-stopping-term"])
def test_a_signal_at_a_step_stops_every_rank_with_its_checkpoint(data, tmp_path, moment, rank, number, again, step):
    config = train_config(tmp_path, data)
    result = signal_at(tmp_path, moment, ["train", config], rank, number, again=again)
    name = signal.Signals(number).name
    match = assert_stopped(result, rf"mpitrain train: stopped by {name} at epoch 1 step {step}: wrote "
                                   r"(?P<checkpoint>\S+); resume with the same command")
    assert_checkpoint_of(match, 0, step)  # the step after the one it came in: the agreement's latency
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("moment, rank, number, report", [("final-evaluation", 0, signal.SIGTERM, False),
                                                          ("final-evaluation", 1, signal.SIGUSR1, False),
                                                          ("report", 1, signal.SIGTERM, True),
                                                          ("report", 0, signal.SIGUSR1, True)])
def test_a_signal_after_the_last_step_stops_once_the_summary_is_written(data, tmp_path, moment, rank, number, report):
    config = train_config(tmp_path, data, report=report)
    result = signal_at(tmp_path, moment, ["train", config], rank, number,
                       paused=(0,) if moment == "report" else (0, 1))
    name = signal.Signals(number).name
    match = assert_stopped(result, rf"mpitrain train: stopped by {name} after the last step, training complete: the "
                                   rf"final checkpoint is (?P<checkpoint>\S+); wrote summary.json"
                                   rf"{' and the report' if report else ''}; nothing left to resume")
    assert_checkpoint_of(match, 2, 0)
    assert (tmp_path / "run" / "summary.json").exists()
    assert (tmp_path / "run" / "report.png").exists() is report


def test_a_signal_after_the_last_agreement_ends_that_rank_with_exit_3_and_its_own_line(data, tmp_path):
    config = train_config(tmp_path, data)
    result = signal_at(tmp_path, "ended", ["train", config], 1, signal.SIGTERM)
    assert result.returncode == 3 and result.exits == {0: "0", 1: "3"}, result.stderr  # no rank is left to agree with
    assert "Traceback" not in result.stderr and "BAD TERMINATION" not in result.stdout + result.stderr
    assert [text for text in result.stderr.splitlines() if "SIGTERM" in text] == \
        ["mpitrain train: stopped by SIGTERM as rank 1 ended, after its work was done"]
    assert (tmp_path / "run" / "summary.json").exists()


def test_a_signal_during_eval_stops_after_its_output_is_written(data, tmp_path):
    config = train_config(tmp_path, data)
    trained = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert trained.returncode == 0, trained.stderr
    result = signal_at(tmp_path, "eval", ["eval", tmp_path / "run"], 1, signal.SIGTERM)
    assert_stopped(result, "mpitrain eval: stopped by SIGTERM after its work was done: its output above is complete")
    assert "test: accuracy" in result.stdout
    assert (tmp_path / "run" / "eval-test.json").exists()


def test_a_script_gets_stopped_from_train_and_its_own_handlers_back(data, tmp_path):
    config = train_config(tmp_path, data)
    result = signal_at(tmp_path, "mid-epoch", ["script", config], 1, signal.SIGTERM)
    assert result.returncode == 3 and result.exits == {0: "3", 1: "3"}, result.stderr
    assert "Traceback" not in result.stderr and "BAD TERMINATION" not in result.stdout + result.stderr
    for rank in (0, 1):  # the same Stopped on every rank, and train again from the same process resumes
        assert re.search(rf"rank {rank}: Stopped: stopped by SIGTERM at epoch 1 step 7: wrote \S+ckpt-0000-000007.h5; "
                         "resume with the same command; the script's handlers are back; trained again to the end",
                         result.stderr), result.stderr
    assert "own handler" not in result.stderr  # mpitrain's took the signal while train ran
    assert "resuming from" in result.stderr and (tmp_path / "run" / "summary.json").exists()
