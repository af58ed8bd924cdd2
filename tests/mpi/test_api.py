"""The Python API's parts given to a second run in one process: a reader (closed by the first run), a model (trained
by it) and a `sharing` synchronizer (its threshold adapted by it) start the second run as fresh ones start it."""
import json
import os
import sys

import numpy as np

from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.testing.datasets import make_dataset
from mpitrain.testing.launch import mpiexec

RANK_SCRIPTS = os.path.join(os.path.dirname(__file__), "ranks")
# what a run's summary says that does not depend on the clock
FIGURES = ("test_accuracy", "test_loss", "replica_hashes", "bytes_sent_per_step", "n_params", "evaluation", "epochs")


def windows(run_dir) -> list:
    """The metrics windows of a run, without their clock: step, loss, tau, sparsity, bytes."""
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return [(r["global_step"], r["loss"], r["tau"], r["sparsity"], r["bytes_sent_per_step"]) for r in records
            if r["kind"] == "window"]


def test_parts_given_to_a_second_run_start_it_as_fresh_parts_do(tmp_path):
    make_dataset(tmp_path / "data", n_train=320, n_test=64)
    result = mpiexec(2, sys.executable, os.path.join(RANK_SCRIPTS, "api_reuse.py"), tmp_path / "data", tmp_path,
                     timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    summaries = json.loads(result.stdout.strip().splitlines()[-1])
    fresh, first, second = (summaries[run] for run in ("fresh", "first", "second"))
    assert {key: second[key] for key in FIGURES} == {key: fresh[key] for key in FIGURES}
    assert windows(tmp_path / "second") == windows(tmp_path / "fresh") == windows(tmp_path / "first")
    assert len({w[2] for w in windows(tmp_path / "fresh")}) > 1  # tau adapted: a first run's state to inherit
    last = {run: load_checkpoint(list_checkpoints(str(tmp_path / run))[-1]) for run in ("fresh", "second")}
    assert np.array_equal(last["second"].params, last["fresh"].params)
    assert last["second"].sync_numbers == last["fresh"].sync_numbers
