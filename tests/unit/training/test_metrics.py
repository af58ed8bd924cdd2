"""metrics.jsonl: the records a resumed run keeps (the run directory drops those written after its checkpoint),
and the time steps waited for their batches."""
import json

import numpy as np

from mpitrain.parallel.backend import create_backend
from mpitrain.rundir.directory import RunDir
from mpitrain.training.metrics import Traffic, Window, append_record, input_wait_ms


def records(tmp_path) -> list:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_resume_drops_records_past_the_checkpoint_and_keeps_other_kinds(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    for epoch in range(3):
        for step in (5, 10):
            append_record(path, {"kind": "window", "epoch": epoch, "step": step, "global_step": epoch * 10 + step})
        append_record(path, {"kind": "epoch", "epoch": epoch})
    append_record(path, {"kind": "pretrain", "layer": 0})
    run = RunDir(str(tmp_path))
    run.drop_records_after(2, 0)  # the checkpoint after epoch 2 was never written: epoch 2 runs again
    assert [r["global_step"] for r in records(tmp_path) if r["kind"] == "window"] == [5, 10, 15, 20]
    assert [r["epoch"] for r in records(tmp_path) if r["kind"] == "epoch"] == [0, 1]
    assert [r["kind"] for r in records(tmp_path)].count("pretrain") == 1
    run.drop_records_after(1, 5)  # mid-epoch checkpoint: step 5 of epoch 1 is kept, later ones go
    assert [r["global_step"] for r in records(tmp_path) if r["kind"] == "window"] == [5, 10, 15]
    assert [r["epoch"] for r in records(tmp_path) if r["kind"] == "epoch"] == [0]


def test_records_are_kept_by_epoch_and_step_whatever_the_rank_count(tmp_path):
    """Two ranks had 10 steps per epoch; the resumed run on four has 5: epoch 0's records stay as written,
    and a line cut short by a killed job goes."""
    path = str(tmp_path / "metrics.jsonl")
    for step in (5, 10):
        append_record(path, {"kind": "window", "epoch": 0, "step": step, "global_step": step})
    append_record(path, {"kind": "epoch", "epoch": 0})
    append_record(path, {"kind": "window", "epoch": 1, "step": 5, "global_step": 15})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "window", "epo')
    RunDir(str(tmp_path)).drop_records_after(1, 0)
    assert [(r["kind"], r["epoch"], r.get("step")) for r in records(tmp_path)] == \
        [("window", 0, 5), ("window", 0, 10), ("epoch", 0, None)]


def test_each_collective_is_timed_once():
    """A clock that ticks one second per reading: every blocking call spends exactly one second inside MPI and
    communicating, so nested timing (allgatherv's own Allgather of sizes) would show as more."""
    from unittest import mock

    import numpy as np
    from mpi4py import MPI

    from mpitrain.parallel.comm import Communicator
    comm = Communicator(MPI.COMM_SELF)
    ticks = iter(range(100))
    with mock.patch("mpitrain.parallel.comm.time.perf_counter", lambda: float(next(ticks))):
        comm.allgatherv(np.arange(3, dtype=np.int32))  # the Allgather of sizes, then the Allgatherv
        assert (comm.mpi_seconds, comm.comm_seconds) == (2.0, 2.0)
        comm.allreduce_(np.ones(4, dtype=np.float32))
        assert (comm.mpi_seconds, comm.comm_seconds) == (3.0, 3.0)
        posted = [comm.iallreduce_(np.ones(4, dtype=np.float32))]  # posted at 6 (1 s inside MPI) ...
        comm.complete(posted)  # ... completed from 8 to 9 (1 s more inside MPI): 3 s from post to end
        assert (comm.mpi_seconds, comm.comm_seconds) == (5.0, 6.0)
        posted = [comm.iallreduce_(np.ones(4, dtype=np.float32))]  # posted at 10 (1 s) ...
        comm.complete(posted, last=np.ones(4, dtype=np.float32))  # ... the last bucket and the wait from 12 to 13
        assert (comm.mpi_seconds, comm.comm_seconds) == (7.0, 9.0)
        comm.complete([], last=np.ones(4, dtype=np.float32))  # a one-bucket cut: a blocking Allreduce, 14 to 15
        assert (comm.mpi_seconds, comm.comm_seconds) == (8.0, 10.0)


def test_the_time_steps_waited_for_their_batch_is_kept_apart_and_summed():
    window = Window()
    window.add(0, np.float32(1.0), np.int64(3), 4, 0.010, Traffic(), 0.002)
    window.add(1, np.float32(2.0), np.int64(1), 4, 0.030, Traffic(), 0.004)
    totals = window.totals(create_backend("numpy"))
    assert (totals.steps, totals.seconds, totals.input_seconds) == (2, 0.040, 0.006)
    assert (totals + totals).input_seconds == 0.012
    assert input_wait_ms([0.006, 0.002], 2) == 2.0  # two ranks' 8 ms over 2 steps each


