"""Preemption and time limits: SIGUSR1 or SIGTERM on any rank stops the whole job at a step boundary, with a
checkpoint at that step.

    #SBATCH --signal=USR1@120      # Slurm sends SIGUSR1 two minutes before the time limit
    scancel --signal=USR1 JOBID    # or ask for it by hand; a preempting scheduler sends SIGTERM

    with StopSignals(comm) as stop:            # every rank, around the training steps
        for step in ...:
            ...train and sync...
            if stop.agreed():                  # a collective, once per step
                checkpoint; raise Stopped(...)

A signal only sets a flag in the rank that got it. The ranks agree on it without waiting:
each step posts a non-blocking Allreduce (MAX) of its flag and waits for the one posted the
step before, which has long arrived, so every rank learns of a signal in the same step, at
most two steps after it came, and the step costs one tiny message. The handlers are
installed when training starts, after MPI's start-up: the MPI library installs a SIGUSR1
handler of its own in every rank, which would otherwise catch the signal and let training go
on. A second signal changes nothing; a checkpoint that hangs is still caught by the watchdog.
The previous handlers come back when the block ends (pretraining and the final evaluation
keep the default: a SIGTERM there ends the process).
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess

import numpy as np

from mpitrain.errors import DataError, MpitrainError

log = logging.getLogger("mpitrain")
SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
READ_FAILED = 1 << 16  # above every signal number: a rank could not read its rows


class Stopped(MpitrainError):
    """Training stopped early at a signal's request, a checkpoint written: resume to continue (exit status 3)."""

    exit_status = 3


class StopSignals:
    """SIGUSR1/SIGTERM handlers that set a flag, and the per-step agreement on it; see the module docstring."""

    def __init__(self, comm):
        self.comm = comm
        self.received = np.zeros(1, dtype=np.int32)  # the signal this rank got first (0: none)
        self.agreed_signal = np.zeros(1, dtype=np.int32)
        self.pending = None  # the Allreduce posted at the last step
        self.previous = {}
        self.read_failure: str | None = None  # this rank's read error, in the agreement until every rank knows

    def __enter__(self):
        for number in SIGNALS:
            self.previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        if self.pending is not None:  # every rank posted one at its last step: complete them alike
            self.pending.Wait()
            self.pending = None
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def _handle(self, number, frame) -> None:
        if not self.received[0]:
            self.received[0] = number
            log.warning("got %s: training stops with a checkpoint at the next step boundary",
                        signal.Signals(number).name)

    def fail(self, message: str) -> None:
        """This rank could not read its rows (`message`): the agreement carries that to every rank, which then
        raise it together (`agreed`). Meanwhile this rank trains on a stand-in batch, so no collective waits."""
        if self.read_failure is None:
            self.read_failure = message
            self.received[0] = READ_FAILED

    def agreed(self) -> str | None:
        """The name of the signal some rank got, once every rank knows it, else None; a rank's read failure, once
        every rank knows it, is a DataError raised on every rank with that rank's message. A collective: every
        rank calls it once per step, and all of them see the same answer in the same step."""
        if self.pending is not None:
            self.pending.Wait()
            self.pending = None
            if self.agreed_signal[0] == READ_FAILED:
                self.comm.raise_first_failure(self.read_failure, DataError)
            if self.agreed_signal[0]:
                return signal.Signals(int(self.agreed_signal[0])).name
        self.pending = self.comm.iallreduce_max(self.received, self.agreed_signal)
        return None


def requeue(setting, signal_name: str) -> str:
    """After the stop's checkpoint (rank 0): ask Slurm to requeue this job when `train.requeue` says so (auto,
    true or false; auto: inside a Slurm job) and the signal was SIGUSR1, the time limit's warning. SIGTERM
    is `scancel` (the user wants the job to end) or preemption (Slurm requeues it itself when its
    PreemptMode says so): it is never requeued here. Returns what happened, for the stop's message."""
    job = os.environ.get("SLURM_JOB_ID")
    if setting is False or (setting == "auto" and not job) or signal_name != "SIGUSR1":
        return "resume with the same command"
    if not job:
        return "train.requeue is true, but this is no Slurm job: resume with the same command"
    if shutil.which("scontrol") is None:
        return "scontrol is not on the PATH, so the job was not requeued: resubmit it"
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if result.returncode:
        return f"scontrol requeue {job} failed ({result.stderr.strip()}): resubmit the job"
    return f"Slurm job {job} requeued: it resumes from this checkpoint"
