"""TensorBoard event files beside metrics.jsonl (`pip install 'mpitrain[tensorboard]'`: tensorboardX).

    tensorboard --logdir runs/              # every run directory is a run; a study: --logdir STUDY/trials
    mpitrain report RUN_DIR --tensorboard   # a finished run's events, written again from its metrics.jsonl

metrics.jsonl stays the source of truth: the events hold the same numbers, record by record (`scalars`).
With tensorboardX installed, rank 0 writes them as training goes (`EventWriter`, from `MetricsLog`); a run
resumed from a checkpoint marks the first step it trains again as TensorBoard's purge step, so the events of
steps the previous job trained past its checkpoint are hidden, as metrics.jsonl drops their records. A study's
trial also records its parameters and objective as TensorBoard hyperparameters (the HPARAMS tab).
"""
from __future__ import annotations

import glob
import json
import os

EVENTS_GLOB = "events.out.tfevents.*"
WINDOW_SCALARS = {"loss": "train/loss", "accuracy": "train/accuracy", "samples_per_s": "speed/samples_per_s",
                  "mpi_ms_per_step": "time/mpi_ms_per_step", "comm_ms_per_step": "time/comm_ms_per_step",
                  "input_wait_ms_per_step": "time/input_wait_ms_per_step",
                  "bytes_sent_per_step": "traffic/bytes_sent_per_step", "sparsity": "sharing/sparsity",
                  "threshold": "sharing/threshold"}
EPOCH_SCALARS = {"train_loss": "epoch/train_loss", "test_accuracy": "epoch/test_accuracy",
                 "test_loss": "epoch/test_loss"}


def available() -> bool:
    """Whether tensorboardX can be imported (the `tensorboard` extra)."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return False
    return True


def scalars(record: dict, steps_per_epoch: int) -> list[tuple[str, float, int]]:
    """(tag, value, step) of a metrics.jsonl record: a window's at its global step, an epoch's at the global
    step of its end (so epoch and window curves share the x axis); numbers only (regression has no accuracy)."""
    if record.get("kind") == "window":
        tags, step = WINDOW_SCALARS, record["global_step"]
    elif record.get("kind") == "epoch":
        tags, step = EPOCH_SCALARS, (record["epoch"] + 1) * steps_per_epoch
    else:
        return []
    return [(tag, float(record[key]), step) for key, tag in tags.items()
            if isinstance(record.get(key), (int, float)) and not isinstance(record.get(key), bool)]


class EventWriter:
    """Rank 0's event file in a run directory; `purge_step` > 0 hides earlier jobs' events from that step on."""

    def __init__(self, run_dir: str, steps_per_epoch: int, purge_step: int = 0):
        from tensorboardX import SummaryWriter
        self.steps_per_epoch = steps_per_epoch
        self.writer = SummaryWriter(logdir=run_dir, purge_step=purge_step or None)

    def write(self, record: dict) -> None:
        for tag, value, step in scalars(record, self.steps_per_epoch):
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def hparams(self, params: dict, metrics: dict) -> None:
        """A study trial's parameters and results (`{"hparam/validation.accuracy": 0.93}`) for TensorBoard's
        HPARAMS tab, in this run's own event file (tensorboardX's add_hparams would make a sub-run)."""
        from tensorboardX.summary import hparams
        for summary in hparams(params, metrics):
            self.writer.file_writer.add_summary(summary)
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, 0)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def write_events(run_dir: str) -> str:
    """Write a run's events again from its metrics.jsonl (its earlier event files removed); the run directory."""
    from mpitrain.errors import MpitrainError
    from mpitrain.rundir.directory import RunDir

    if not available():
        raise MpitrainError("TensorBoard event files need tensorboardX: pip install 'mpitrain[tensorboard]'")
    path = RunDir(run_dir).metrics
    if not os.path.exists(path):
        raise MpitrainError(f"{run_dir}: no metrics.jsonl; expected a run directory written by `mpitrain train`")
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    windows = [r for r in records if r.get("kind") == "window"]
    steps_per_epoch = _steps_per_epoch(windows)
    for old in glob.glob(os.path.join(run_dir, EVENTS_GLOB)):
        os.remove(old)
    writer = EventWriter(run_dir, steps_per_epoch)
    for record in records:
        writer.write(record)
    writer.close()
    return run_dir


def _steps_per_epoch(windows: list[dict]) -> int:
    """A run's steps per epoch from its window records (global_step = epoch x steps per epoch + step): from a
    window after the first epoch, else the first epoch's last window, which ends at its last step."""
    later = [w for w in windows if w["epoch"] > 0]
    if later:
        return (later[0]["global_step"] - later[0]["step"]) // later[0]["epoch"]
    return max((w["step"] for w in windows), default=1)
