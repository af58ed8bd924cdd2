"""A run's `metrics.jsonl`, and its one owner: rank 0 appends records to it as training goes (`append_record`, from
`mpitrain.training.metrics`), a resumed run trims what it will write again (`drop_records_after`, `keep_records`,
from the checkpointer), and reports, benchmarks and TensorBoard read it (`read_metrics`, `read_records`). Every
change to the file is whole or none: an append that fails is cut back, a trim is a rewrite (`write_file`).

A record is one JSON object a line: a metrics window (`kind: window`), an epoch (`epoch`), a pretraining epoch of a
layer (`pretrain`); `RECORD_KEYS` are the keys each must have.
"""
from __future__ import annotations

import json
import logging
import os

from mpitrain.base.errors import MpitrainError, describe
from mpitrain.base.files import write_file

log = logging.getLogger("mpitrain")
RECORD_KEYS = {"window": ("global_step", "samples_per_s", "bytes_sent_per_step"),
               "epoch": ("epoch", "train_loss", "test_loss", "test_accuracy"),
               "pretrain": ("layer", "epoch", "reconstruction_error")}
EXPECTED = "one JSON object per line, as `mpitrain train` writes"


def append_record(path: str, record: dict) -> None:
    """Append one JSON line to the metrics file `path`; when the write fails, the file is cut back to what
    it held, so no partial line stays behind."""
    size = os.path.getsize(path) if os.path.exists(path) else 0
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        if os.path.exists(path) and os.path.getsize(path) != size:  # not where nothing was written (a read-only
            os.truncate(path, size)                                 # file system refuses the cut too)
        raise MpitrainError(f"{path}: {describe(e)} while appending a record; the file holds the records "
                            "written before") from None


def keep_records(path: str, keep) -> None:
    """Rewrite the metrics file `path` (if any) with only the records for which `keep(record)` holds.

    Whole or not at all (`mpitrain.base.files.write_file`: when that fails the original stays). A line that
    is not JSON (the last one of a job killed while writing it) is dropped.
    """
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()
    kept = [line if line.endswith("\n") else line + "\n" for line in lines if _keeps(line, keep)]
    if kept == lines:
        return  # nothing to drop: the file stays as it is
    write_file(path, lambda f: f.writelines(kept), size=sum(map(len, kept)))  # when it fails, the file stays as it was


def drop_records_after(path: str, epoch: int, step: int) -> None:
    """Drop the records a run resumed at step `step` of epoch `epoch` writes again: windows past that step and
    epoch records from `epoch` on. Records are matched by (epoch, step within it), so resuming on another rank
    count (other steps per epoch) keeps the earlier ones as they were."""
    keep_records(path, lambda r: r.get("kind") not in ("window", "epoch")
                 or (r["kind"] == "window" and (r["epoch"], r["step"]) <= (epoch, step))
                 or (r["kind"] == "epoch" and r["epoch"] < epoch))


def read_records(path: str) -> list[dict]:
    """Every record of a metrics.jsonl as it is: what TensorBoard's events are written from."""
    return [record for _, record in _checked_lines(path)]


def read_metrics(path: str) -> tuple[list[dict], list[dict]]:
    """(window records, epoch records) of a metrics.jsonl, checked line by line."""
    records = {kind: [] for kind in RECORD_KEYS}
    for number, record in _checked_lines(path):
        keys = RECORD_KEYS.get(record.get("kind")) if isinstance(record, dict) else None
        if keys is None or any(key not in record for key in keys):
            raise MpitrainError(f"{path}: line {number} is not a window, epoch or pretrain record; expected {EXPECTED} "
                                f"with these keys: {RECORD_KEYS}")
        records[record["kind"]].append(record)
    if not records["epoch"]:
        raise MpitrainError(f"{path}: no epoch record; expected at least one finished epoch")
    return records["window"], records["epoch"]


def _checked_lines(path: str) -> list[tuple[int, object]]:
    """(line number, record) of each line of a metrics file, blank lines skipped. A last line cut short, with no
    newline after it (a job killed while writing it, which the next `train` drops too), is left out with a warning;
    any other line that is not JSON is a MpitrainError naming it."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise MpitrainError(f"{path}: cannot read ({e.strerror}); expected the metrics file of a run") from None
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError:
            if number == len(lines) and not text.endswith("\n"):
                log.warning("%s: its last line is cut short (a job that ended while writing it): left out", path)
                continue
            raise MpitrainError(f"{path}: line {number} is not valid JSON (truncated or corrupt?); "
                                f"expected {EXPECTED}") from None
    return records


def _keeps(line: str, keep) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and keep(record)
