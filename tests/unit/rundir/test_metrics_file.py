"""A run's metrics.jsonl (mpitrain/rundir/metrics_file.py): the records a resumed run keeps (those written after
its checkpoint go, whatever the rank count), and reading it back, checked line by line."""
import json

import pytest

from mpitrain.base.errors import MpitrainError
from mpitrain.rundir.metrics_file import append_record, drop_records_after, read_metrics, read_records


def records(tmp_path) -> list:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_resume_drops_records_past_the_checkpoint_and_keeps_other_kinds(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    for epoch in range(3):
        for step in (5, 10):
            append_record(path, {"kind": "window", "epoch": epoch, "step": step, "global_step": epoch * 10 + step})
        append_record(path, {"kind": "epoch", "epoch": epoch})
    append_record(path, {"kind": "pretrain", "layer": 0})
    drop_records_after(path, 2, 0)  # the checkpoint after epoch 2 was never written: epoch 2 runs again
    assert [r["global_step"] for r in records(tmp_path) if r["kind"] == "window"] == [5, 10, 15, 20]
    assert [r["epoch"] for r in records(tmp_path) if r["kind"] == "epoch"] == [0, 1]
    assert [r["kind"] for r in records(tmp_path)].count("pretrain") == 1
    drop_records_after(path, 1, 5)  # mid-epoch checkpoint: step 5 of epoch 1 is kept, later ones go
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
    drop_records_after(path, 1, 0)
    assert [(r["kind"], r["epoch"], r.get("step")) for r in records(tmp_path)] == \
        [("window", 0, 5), ("window", 0, 10), ("epoch", 0, None)]


def test_read_metrics_checks_every_line_and_read_records_gives_them_as_written(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    window = {"kind": "window", "epoch": 0, "step": 5, "global_step": 5, "samples_per_s": 1.0, "bytes_sent_per_step": 8}
    epoch = {"kind": "epoch", "epoch": 0, "train_loss": 1.0, "test_loss": 1.1, "test_accuracy": 0.5}
    append_record(path, window)
    append_record(path, epoch)
    assert read_metrics(path) == ([window], [epoch])
    assert read_records(path) == [window, epoch]
    append_record(path, {"kind": "window", "epoch": 1})
    with pytest.raises(MpitrainError, match=r"metrics\.jsonl: line 3 is not a window, epoch or pretrain record"):
        read_metrics(path)
