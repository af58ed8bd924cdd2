"""TensorBoard event files hold metrics.jsonl's numbers: `mpitrain report RUN_DIR --tensorboard` writes them again
for a finished run, read back here with tensorboard's own EventAccumulator."""
import glob
import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mpitrain.cli import main
from mpitrain.rundir.tensorboard import EPOCH_SCALARS, WINDOW_SCALARS, scalars

STEPS = 7  # steps per epoch


def write_run(folder):
    records = []
    for epoch in range(2):
        for step in (4, 7):
            records.append({"kind": "window", "epoch": epoch, "step": step, "global_step": epoch * STEPS + step,
                            "loss": 1.0 / (epoch * STEPS + step), "accuracy": 0.1 * step, "samples": 64,
                            "samples_per_s": 100.0 + step, "bytes_sent_per_step": 8.0, "mpi_ms_per_step": 0.5,
                            "comm_ms_per_step": 0.7, "input_wait_ms_per_step": 0.1, "rank_losses": [1.0, 1.0],
                            "lr": 0.1 * 0.5 ** epoch})
        records.append({"kind": "epoch", "epoch": epoch, "train_loss": 0.5 - epoch / 10, "test_accuracy": 0.8 + epoch
                        / 100, "test_loss": 0.4, "replica_hashes": []})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "config.yaml").write_text("sync: {mode: allreduce}\n")
    return records


def read_events(folder) -> dict:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_report_writes_a_finished_run_s_scalars_as_tensorboard_events(tmp_path, capsys):
    records = write_run(tmp_path)
    (tmp_path / "events.out.tfevents.0.old").write_bytes(b"")  # an earlier job's events are replaced
    assert main(["report", str(tmp_path), "--tensorboard"]) == 0
    assert "wrote TensorBoard events in" in capsys.readouterr().out
    assert not (tmp_path / "events.out.tfevents.0.old").exists() and len(glob.glob(str(tmp_path / "events*"))) == 1
    found = read_events(tmp_path)
    assert set(found) == set(WINDOW_SCALARS.values()) - {"sharing/sparsity", "sharing/threshold"} | \
        set(EPOCH_SCALARS.values())
    windows = [r for r in records if r["kind"] == "window"]
    assert found["train/loss"] == [(w["global_step"], pytest.approx(w["loss"])) for w in windows]
    assert found["time/mpi_ms_per_step"] == [(w["global_step"], pytest.approx(0.5)) for w in windows]
    assert found["epoch/test_accuracy"] == [(STEPS, pytest.approx(0.8)), (2 * STEPS, pytest.approx(0.81))]
    assert found["train/lr"] == [(w["global_step"], pytest.approx(w["lr"])) for w in windows]


def test_a_sharing_window_gives_its_threshold_and_sparsity():
    found = dict((tag, value) for tag, value, _ in scalars({"kind": "window", "global_step": 3, "tau": 1e-3,
                                                            "sparsity": 0.01, "exchange": "allgather"}, 5))
    assert found == {"sharing/threshold": pytest.approx(1e-3), "sharing/sparsity": pytest.approx(0.01)}


def test_only_numbers_become_scalars():
    assert scalars({"kind": "epoch", "epoch": 0, "train_loss": 1.0, "test_accuracy": None, "test_loss": 2.0}, 5) \
        == [("epoch/train_loss", 1.0, 5), ("epoch/test_loss", 2.0, 5)]
    assert scalars({"kind": "pretrain", "epoch": 0}, 5) == []


def test_a_resumed_run_hides_the_events_its_stopped_job_logged_past_the_checkpoint(tmp_path):
    from mpitrain.rundir.tensorboard import EventWriter

    def window(step, loss):
        return {"kind": "window", "epoch": 0, "step": step, "global_step": step, "loss": loss}

    first = EventWriter(str(tmp_path), STEPS)
    for step in range(1, 8):  # the stopped job trained to step 7, its checkpoint is at step 4
        first.write(window(step, 1.0))
    first.close()
    resumed = EventWriter(str(tmp_path), STEPS, purge_step=5)
    for step in range(5, 8):
        resumed.write(window(step, 2.0))
    resumed.close()
    assert read_events(tmp_path)["train/loss"] == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 2.0), (6, 2.0),
                                                   (7, 2.0)]
