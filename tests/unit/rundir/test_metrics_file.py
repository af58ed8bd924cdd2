"""A run's metrics.jsonl (mpitrain/rundir/metrics_file.py): the records a resumed run keeps (those written after
its checkpoint go, whatever the rank count), and reading it back, checked line by line."""
import errno
import json
import os

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


def test_an_append_to_a_file_system_turned_read_only_is_one_error_and_leaves_the_file(tmp_path, monkeypatch):
    """The run's folder remounted read-only mid-training: the append and any cut of the file are refused. Before, the
    cut-back of a file that had not grown raised the second EROFS, a traceback on rank 0 and MPI_Abort (exit 1)."""
    from mpitrain.rundir import metrics_file

    path = tmp_path / "metrics.jsonl"
    append_record(str(path), {"kind": "epoch", "epoch": 0})
    before = path.read_bytes()

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    monkeypatch.setattr(metrics_file, "open", read_only, raising=False)  # the module's open, not the builtin
    monkeypatch.setattr(os, "truncate", read_only)
    with pytest.raises(MpitrainError, match=r"metrics.jsonl: Read-only file system while appending a record; the "
                                            "file holds the records written before$"):
        append_record(str(path), {"kind": "epoch", "epoch": 1})
    assert path.read_bytes() == before
