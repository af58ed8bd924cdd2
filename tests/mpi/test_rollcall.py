"""The watchdog's roll-call (mpitrain/parallel/rollcall.py): a rank stalled on purpose (MPITRAIN_TEST_STALL) in the
data read, in its step, in a collective or in the checkpoint write, on 2 and 4 ranks, ends the job with one line
naming that rank, its host, its phase and step, and where the others wait; each rank's state (its ring of
collectives) and stacks are in RUN_DIR/forensics/."""
import json
import os
import re
import socket
import time

import pytest

from mpitrain.parallel.rollcall import verdict
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec

HOST = socket.gethostname()
WAITING = r"(Allreduce|wait for the posted Allreduces)"  # the gradients' exchange, blocking or its posted buckets


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rollcall")
    make_dataset(folder / "data", n_train=400, n_test=64)
    return folder / "data"


def stalled(tmp_path, dataset, ranks: int, stall: str, backend: str = "numpy", **train) -> tuple[str, str]:
    """A job of `ranks` ranks on `backend` whose rank named in `stall` (PHASE@RANK) stalls: (the watchdog's line, the
    folder)."""
    config = write_config(tmp_path / "exp.yaml", dataset, train={"epochs": 4, "batch_size": 16, "watchdog_s": 3,
                                                                 **train}, backend=backend)
    started = time.monotonic()
    result = mpiexec(ranks, MPITRAIN, "train", config, timeout=90, env={**os.environ, "MPITRAIN_TEST_STALL": stall})
    assert result.returncode != 0 and time.monotonic() - started < 60, result.stderr[-3000:]
    folder = str(tmp_path / "run" / "forensics")
    lines = [line for line in result.stderr.splitlines() if "watchdog: no progress for" in line]
    verdicts = [line for line in lines if f"each rank's collectives and stacks: {folder}" in line]
    assert len(verdicts) == 1, result.stderr[-3000:]  # one line, from one rank; the others say where they were
    assert all(f"its collectives and stacks: {folder}/rank-" in line for line in lines if line not in verdicts)
    return verdicts[0], folder


@pytest.mark.alone
@pytest.mark.parametrize("ranks, stall, expected", [
    (2, "the data read@1", rf"rank 1 on {HOST} is in the data read of epoch 1 step 3 \([\d.]+ s\); rank 0 waits in "
                           rf"the {WAITING} of epoch 1 step 3"),
    (2, "forward, backward and the update@1", rf"rank 1 on {HOST} is in forward, backward and the update of epoch 1 "
                                              rf"step 3 \([\d.]+ s\); rank 0 waits in the {WAITING} of epoch 1 step 3"),
    (2, "Allreduce@0", r"every rank that answered is in the Allreduce of epoch \d step \d+ \([\d.]+ s\): none is "
                       r"elsewhere \(a stuck network or device\?\)"),
    (4, "the data read@2", rf"rank 2 on {HOST} is in the data read of epoch 1 step 3 \([\d.]+ s\); ranks 0-1, 3 wait "
                           rf"in the {WAITING} of epoch 1 step 3"),
    (4, "the checkpoint write@3", rf"rank 3 on {HOST} is in the checkpoint write of epoch 3 \([\d.]+ s\); ranks 0-2 "
                                  r"wait in the [A-Za-z ]+ of epoch 3"),  # the third epoch's checkpoint
], ids=["data read-2", "step-2", "collective-2", "data read-4", "checkpoint write-4"])
def test_a_stalled_rank_is_named_in_one_line_with_where_the_others_wait(tmp_path, dataset, ranks, stall, expected):
    line, folder = stalled(tmp_path, dataset, ranks, stall)
    assert re.search(expected, line), line
    assert "(train.watchdog_s = 3)" in line and f"each rank's collectives and stacks: {folder}" in line
    states = [json.loads(open(os.path.join(folder, f"rank-{r}.json")).read()) for r in range(ranks)]
    assert f": {verdict(states, ranks)}; each" in line  # the verdict of the states in the folder it names
    stuck = int(stall.rsplit("@", 1)[1])
    assert states[stuck]["ring"] and all(s["ring"][-1]["seq"] >= s["ring"][0]["seq"] for s in states)
    with open(states[stuck]["stacks"]) as f:
        assert "rollcall.py" in f.read()  # the stalled rank's stacks show where it sleeps
    assert open(os.path.join(folder, "verdict.txt")).read().strip() == verdict(states, ranks)


def test_a_slow_rank_is_named_a_straggler_in_the_log_the_records_the_summary_and_the_report(tmp_path, dataset):
    config = write_config(tmp_path / "exp.yaml", dataset, train={"epochs": 1, "batch_size": 8, "log_every": 2},
                          report=True)
    result = mpiexec(4, MPITRAIN, "train", config, timeout=90,
                     env={**os.environ, "MPITRAIN_TEST_SLOW": "forward, backward and the update@2:0.02"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(rf"straggler: rank 2 on {HOST} took [\d.]+ ms per step outside MPI, [\d.]+x the median rank's "
                     r"[\d.]+ ms, for 3 metrics windows in a row", result.stderr + result.stdout)
    windows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl") if '"window"' in line]
    assert all(w["ranks_ms_per_step"]["compute"]["slowest"] == 2 for w in windows)
    named = [w["straggler"] for w in windows if "straggler" in w]
    assert [n["rank"] for n in named] == [2] and named[0]["ratio"] > 1.5 and named[0]["busy_ms"] >= 20
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stragglers"] == named
    assert f"Straggler: run (allreduce): rank 2 on {HOST} took" in (tmp_path / "run" / "report.html").read_text()
