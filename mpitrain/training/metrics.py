"""Metrics windows gathered from every rank, written by rank 0 to `metrics.jsonl`, and progress.

Rank 0 shows a tqdm bar when stderr is a terminal, plain log lines otherwise (batch logs).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field, fields

import numpy as np
from tqdm import tqdm

from mpitrain.base.errors import MpitrainError, describe
from mpitrain.rundir import tensorboard
from mpitrain.rundir.directory import RunDir
from mpitrain.rundir.metrics_file import append_record
from mpitrain.training.stragglers import WINDOWS, Stragglers, spread

log = logging.getLogger("mpitrain")


@dataclass(frozen=True)
class Traffic:
    """What a rank's collectives did: bytes sent, host/device copies (and their bytes) made to stage them, seconds
    spent inside MPI, and seconds from the collectives' starts to their ends (larger when overlapped)."""

    bytes_sent: int = 0
    staged_copies: int = 0
    staged_bytes: int = 0
    mpi_seconds: float = 0.0
    comm_seconds: float = 0.0

    @classmethod
    def of(cls, comm) -> Traffic:
        """What `comm` has done so far."""
        return cls(*(getattr(comm, f.name) for f in fields(cls)))

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass
class Totals:
    """One rank's sums over some steps, on the host."""

    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    seconds: float = 0.0
    traffic: Traffic = Traffic()
    first_bad_step: int = -1  # the first step whose loss was NaN or Inf
    step_comm: tuple = ()  # each step's communication seconds, start to end
    input_seconds: float = 0.0  # the time the steps waited for their batch (part of `seconds`)
    host_seconds: float = 0.0  # the training thread's CPU time in the steps (on a GPU: launching its kernels)

    def __add__(self, other: Totals) -> Totals:
        bad = [s for s in (self.first_bad_step, other.first_bad_step) if s >= 0]
        return Totals(self.steps + other.steps, self.samples + other.samples, self.loss_sum + other.loss_sum,
                      self.correct + other.correct, self.seconds + other.seconds, self.traffic + other.traffic,
                      min(bad, default=-1), self.step_comm + other.step_comm, self.input_seconds + other.input_seconds,
                      self.host_seconds + other.host_seconds)


@dataclass
class Window:
    """One rank's steps since the last record.

    Each step's loss and correct count stay on the device as 0-d arrays; `totals` reads them
    all in ONE device -> host copy at the window's end, so no step waits for the host.
    """

    first_step: int = -1
    samples: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    corrects: list = field(default_factory=list)
    seconds: float = 0.0
    traffic: Traffic = Traffic()
    step_comm: list = field(default_factory=list)
    input_seconds: float = 0.0
    host_seconds: float = 0.0

    def add(self, step: int, loss, correct, samples: int, seconds: float, traffic: Traffic,
            input_seconds: float, host_seconds: float) -> None:
        """One step: `seconds` from the end of the step before, of which `input_seconds` waiting for its batch;
        `host_seconds` of the training thread's CPU time over the same span."""
        if self.first_step < 0:
            self.first_step = step
        self.samples.append(samples)
        self.losses.append(loss)
        self.corrects.append(correct)
        self.seconds += seconds
        self.input_seconds += input_seconds
        self.host_seconds += host_seconds
        self.traffic += traffic
        self.step_comm.append(traffic.comm_seconds)

    def totals(self, backend) -> Totals:
        """The window's sums on the host (one counted copy through `backend`)."""
        if not self.losses:
            return Totals(seconds=self.seconds, traffic=self.traffic, input_seconds=self.input_seconds,
                          host_seconds=self.host_seconds)
        xp = backend.xp
        losses, corrects = backend.to_host(xp.stack([xp.stack(self.losses).astype(np.float64),
                                                     xp.stack(self.corrects).astype(np.float64)]))
        bad = ~np.isfinite(losses)
        return Totals(len(losses), sum(self.samples), float(losses @ np.asarray(self.samples, dtype=np.float64)),
                      int(corrects.sum()), self.seconds, self.traffic,
                      self.first_step + int(np.argmax(bad)) if bad.any() else -1, tuple(self.step_comm),
                      self.input_seconds, self.host_seconds)


class MetricsLog:
    """Collects windows from all ranks (a collective) and appends records to RUN_DIR/metrics.jsonl.

    Which earlier records a resumed run keeps is decided by the checkpointer (`mpitrain.rundir.metrics_file`).

    Communication time per step comes two ways: `mpi_ms_per_step`, the ranks' mean time inside
    MPI (what communication cost them, waiting for slower ranks included), and
    `comm_ms_per_step`, per step the shortest time any rank's communication took from its start
    to its end (the last rank to arrive waits for no one: the network's part), averaged over
    the steps. With overlapped `allreduce` the second starts at the first bucket's post, so part
    of it ran behind backward, and `mpi_ms_per_step` is the part that did not.
    """

    def __init__(self, run_dir: str, comm, steps_per_epoch: int, epochs: int, straggler_factor: float = 1.5):
        self.comm, self.steps_per_epoch, self.epochs = comm, steps_per_epoch, epochs
        self.straggler_factor, self.stragglers = straggler_factor, None  # Stragglers, from the first window
        self.comm_seconds, self.comm_steps = 0.0, 0  # the sums behind comm_ms_per_step
        self.path = RunDir(run_dir).metrics
        self.bar = None
        self.use_bar = comm.is_root and sys.stderr.isatty()
        self.events = None  # rank 0's TensorBoard writer, when the tensorboard package is installed

    def start_epoch(self, epoch: int, start_step: int) -> None:
        if self.comm.is_root and self.events is None and tensorboard.available():  # the first epoch this job trains
            with self._optional_events():
                self.events = tensorboard.EventWriter(os.path.dirname(self.path), self.steps_per_epoch,
                                                      purge_step=epoch * self.steps_per_epoch + start_step)
        if self.use_bar:
            self.bar = tqdm(total=self.steps_per_epoch, initial=start_step, desc=f"epoch {epoch + 1}/{self.epochs}",
                            unit="step", dynamic_ncols=True)

    def window(self, epoch: int, step: int, window: Totals, extra: dict) -> dict:
        """Record the window ending at `step` (0-based, within `epoch`) on every rank's behalf.

        Every rank learns every rank's loss, so a NaN anywhere stops all ranks together.
        """
        windows, hosts = zip(*self.comm.allgather_obj((window, self.comm.calls.host)))
        for rank, w in enumerate(windows):
            if w.first_bad_step >= 0:
                raise MpitrainError(f"training diverged: loss is {w.loss_sum / max(w.samples, 1)} on rank {rank} "
                                    f"at epoch {epoch + 1} step {w.first_bad_step + 1}; the last good checkpoint "
                                    f"is kept; try a lower optimizer.lr")
        samples = sum(w.samples for w in windows)
        fastest = [min(step) for step in zip(*(w.step_comm for w in windows))]
        self.comm_seconds += sum(fastest)
        self.comm_steps += len(fastest)
        record = {
            "kind": "window", "epoch": epoch, "step": step + 1,
            "global_step": epoch * self.steps_per_epoch + step + 1,
            "loss": sum(w.loss_sum for w in windows) / samples,
            "accuracy": sum(w.correct for w in windows) / samples,
            "samples": samples,
            "samples_per_s": samples / max(max(w.seconds for w in windows), 1e-12),
            **per_step([w.traffic for w in windows], window.steps),
            "input_wait_ms_per_step": mean_ms_per_step([w.input_seconds for w in windows], window.steps),
            "host_cpu_ms_per_step": mean_ms_per_step([w.host_seconds for w in windows], window.steps),
            "comm_ms_per_step": 1e3 * sum(fastest) / max(len(fastest), 1),
            "rank_losses": [w.loss_sum / max(w.samples, 1) for w in windows],
            **self._ranks(windows, hosts),
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

    def _ranks(self, windows: list[Totals], hosts: list[str]) -> dict:
        """With several ranks, each one's compute, input wait and time inside MPI per step over the ranks
        (`ranks_ms_per_step`: min, median, max and the slowest rank), and a rank named a straggler in this window
        (`straggler`, logged on rank 0; mpitrain/training/stragglers.py)."""
        if len(windows) < 2:
            return {}
        steps = [max(w.steps, 1) for w in windows]
        inside = [1e3 * w.traffic.mpi_seconds / n for w, n in zip(windows, steps)]
        wait = [1e3 * w.input_seconds / n for w, n in zip(windows, steps)]
        busy = [1e3 * w.seconds / n - mpi for w, n, mpi in zip(windows, steps, inside)]
        found = {"ranks_ms_per_step": {"compute": spread([b - i for b, i in zip(busy, wait)]),
                                       "input_wait": spread(wait), "mpi": spread(inside)}}
        self.stragglers = self.stragglers or Stragglers(self.straggler_factor, list(hosts))
        named = self.stragglers.observe(busy)
        if named:
            found["straggler"] = named
            if self.comm.is_root:
                log.warning("straggler: rank %d on %s took %.1f ms per step outside MPI, %.1fx the median rank's "
                            "%.1f ms, for %d metrics windows in a row", named["rank"], named["host"],
                            named["busy_ms"], named["ratio"], named["median_ms"], WINDOWS)
        return found

    @property
    def comm_ms_per_step(self) -> float:
        """`comm_ms_per_step` over every window recorded so far (see the class docstring)."""
        return 1e3 * self.comm_seconds / max(self.comm_steps, 1)

    def end_epoch(self, record: dict) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.write({"kind": "epoch", **record})
        if self.comm.is_root:
            log.info("epoch %d/%d done: test accuracy %s, test loss %.4f", record["epoch"] + 1, self.epochs,
                     figure(record["test_accuracy"]), record["test_loss"])

    def write(self, record: dict) -> None:
        """Rank 0 appends `record` to metrics.jsonl. A collective: a write that fails (a full disk) is an error
        on every rank."""
        with self.comm.agreed_errors():
            if self.comm.is_root:
                append_record(self.path, {"time": time.time(), **record})
                if self.events is not None:
                    with self._optional_events():
                        self.events.write(record)

    def close(self) -> None:
        """End rank 0's TensorBoard event file (the records are in it already)."""
        if self.events is not None:
            with self._optional_events():
                self.events.close()
            self.events = None

    @contextlib.contextmanager
    def _optional_events(self):
        """Rank 0's TensorBoard events are an optional copy of the records: a file system that refuses them (a full
        disk) stops them for the rest of the job with one warning, and training goes on. metrics.jsonl, which
        resuming, the report and `mpitrain report --tensorboard` read, keeps every record, and a write of it that
        fails ends the job."""
        try:
            yield
        except OSError as e:
            self.events = None
            log.warning("%s: %s while writing TensorBoard's events; they stop here for this job (metrics.jsonl keeps "
                        "every record; `mpitrain report %s --tensorboard` writes them again)",
                        os.path.dirname(self.path), describe(e), os.path.dirname(self.path))


def mean_ms_per_step(seconds: list[float], steps: int) -> float:
    """The ranks' mean time per step, in ms, of their `seconds` over `steps` steps each (the time spent waiting for
    the next batch, or the training thread's CPU time)."""
    return 1e3 * sum(seconds) / (len(seconds) * max(steps, 1))


def figure(value: float | None) -> str:
    """A score for a log line: four decimals, or "n/a" where the target has none (regression's accuracy)."""
    return "n/a" if value is None else f"{value:.4f}"


def per_step(traffic: list[Traffic], steps: int) -> dict:
    """The ranks' mean traffic per step: bytes sent (and the least and most any rank sent: sharing's messages
    differ by rank), host/device copies (and bytes) made for staging, and milliseconds spent inside MPI."""
    n = len(traffic) * max(steps, 1)
    return {"bytes_sent_per_step": sum(t.bytes_sent for t in traffic) / n,
            "bytes_sent_per_step_min": min(t.bytes_sent for t in traffic) / max(steps, 1),
            "bytes_sent_per_step_max": max(t.bytes_sent for t in traffic) / max(steps, 1),
            "staged_copies_per_step": sum(t.staged_copies for t in traffic) / n,
            "staged_bytes_per_step": sum(t.staged_bytes for t in traffic) / n,
            "mpi_ms_per_step": 1e3 * sum(t.mpi_seconds for t in traffic) / n}
