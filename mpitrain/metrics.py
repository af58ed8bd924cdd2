"""Metrics windows gathered from every rank, written by rank 0 to `metrics.jsonl`, and progress.

Rank 0 shows a tqdm bar when stderr is a terminal, plain log lines otherwise (batch logs).
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm

from mpitrain.errors import MpitrainError

log = logging.getLogger("mpitrain")


@dataclass
class Window:
    """One rank's sums over the steps since the last record."""

    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0
    first_bad_step: int = -1  # the first step whose loss was NaN or Inf

    def add(self, step: int, loss: float, correct: int, samples: int, seconds: float, bytes_sent: int) -> None:
        if not math.isfinite(loss) and self.first_bad_step < 0:
            self.first_bad_step = step
        self.steps += 1
        self.samples += samples
        self.loss_sum += loss * samples
        self.correct += correct
        self.seconds += seconds
        self.bytes_sent += bytes_sent


class MetricsLog:
    """Collects windows from all ranks (a collective) and appends records to RUN_DIR/metrics.jsonl."""

    def __init__(self, run_dir: str, comm, steps_per_epoch: int, epochs: int):
        self.comm, self.steps_per_epoch, self.epochs = comm, steps_per_epoch, epochs
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.bar = None
        self.use_bar = comm.is_root and sys.stderr.isatty()

    def start_epoch(self, epoch: int, start_step: int) -> None:
        if self.use_bar:
            self.bar = tqdm(total=self.steps_per_epoch, initial=start_step, desc=f"epoch {epoch + 1}/{self.epochs}",
                            unit="step", dynamic_ncols=True)

    def window(self, epoch: int, step: int, window: Window, extra: dict) -> dict:
        """Record the window ending at `step` (0-based, within `epoch`) on every rank's behalf.

        Every rank learns every rank's loss, so a NaN anywhere stops all ranks together.
        """
        windows = self.comm.allgather_obj(window)
        for rank, w in enumerate(windows):
            if w.first_bad_step >= 0:
                raise MpitrainError(f"training diverged: loss is {w.loss_sum / max(w.samples, 1)} on rank {rank} "
                                    f"at epoch {epoch + 1} step {w.first_bad_step + 1}; the last good checkpoint "
                                    f"is kept; try a lower optimizer.lr")
        samples = sum(w.samples for w in windows)
        record = {
            "kind": "window", "epoch": epoch, "step": step + 1,
            "global_step": epoch * self.steps_per_epoch + step + 1,
            "loss": sum(w.loss_sum for w in windows) / samples,
            "accuracy": sum(w.correct for w in windows) / samples,
            "samples_per_s": samples / max(max(w.seconds for w in windows), 1e-12),
            "bytes_sent_per_step": sum(w.bytes_sent for w in windows) / len(windows) / max(window.steps, 1),
            "rank_losses": [w.loss_sum / max(w.samples, 1) for w in windows],
            **extra,
        }
        self.write(record)
        if self.bar is not None:
            self.bar.update(step + 1 - self.bar.n)
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", samples_s=f"{record['samples_per_s']:.0f}")
        elif self.comm.is_root:
            log.info("epoch %d/%d step %d/%d loss %.4f acc %.4f %.0f samples/s", epoch + 1, self.epochs,
                     step + 1, self.steps_per_epoch, record["loss"], record["accuracy"], record["samples_per_s"])
        return record

    def end_epoch(self, record: dict) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.write({"kind": "epoch", **record})
        if self.comm.is_root:
            log.info("epoch %d/%d done: test accuracy %.4f, test loss %.4f", record["epoch"] + 1, self.epochs,
                     record["test_accuracy"], record["test_loss"])

    def write(self, record: dict) -> None:
        if self.comm.is_root:
            with open(self.path, "a") as f:
                f.write(json.dumps({"time": time.time(), **record}) + "\n")
