"""Preemption, time limits and Ctrl-C: SIGUSR1, SIGTERM or SIGINT, on any rank and at any moment of `mpitrain train`,
ends every rank with exit status 3 and one line: the checkpoint of the step training stopped at, or, before the first
step, "stopped by SIGNAL before the first step, nothing to save".

    #SBATCH --signal=USR1@120      # Slurm sends SIGUSR1 two minutes before the time limit
    scancel --signal=USR1 JOBID    # or ask for it by hand; a preempting scheduler sends SIGTERM
    Ctrl-C on mpiexec              # it sends SIGINT to every rank (a second Ctrl-C: mpiexec aborts them)

    hold_stop_signals()                        # the command line: its first line, before mpi4py is imported
    with signals_blocked_while_mpi_starts():   # MPI_Init installs the MPI library's own SIGUSR1 handler
        comm = Communicator()
    with StopSignals(comm) as stop:            # every rank, around the whole of `train`
        set up; stop.agree_now()               # one blocking agreement before the first step
        for step in ...:
            ...train and sync...
            if stop.agreed():                  # a collective, once per step
                checkpoint; raise Stopped(...)
        final evaluation, summary, report; stop.agree_now()

A signal only sets a flag in the rank that got it (the handler does nothing else: no logging, no MPI), so a
second signal, at any moment, changes nothing. Ranks that got different signals agree on the strongest, in the order
of SIGNALS: SIGTERM (the job is to end) over SIGINT (the user ends it) over SIGUSR1 (requeue it). Python's own SIGINT
handler raised KeyboardInterrupt in whatever the rank was doing, and left the others waiting in a collective for it:
Ctrl-C on `mpiexec` hung the job. The flag counts at three kinds of agreement point, each a
collective every rank reaches, so a rank that got a signal never leaves the others waiting:

- **Before the first step** (`agree_now`): one blocking Allreduce (MAX) after set-up (the dataset, the
  model, resuming, config.yaml). A signal from the process's start until then stops every rank with "nothing to
  save" (a resumed run keeps the checkpoint it resumed from). Set-up is not interrupted half way: it is short,
  and stopping inside it would need an agreement in each of its parts.
- **At each step** (`agreed`): a non-blocking Allreduce (MAX) of the flag, waited for a step later, when it has
  long arrived; every rank learns of a signal in the same step, at most two steps after it came, for one tiny
  message per step, and the ranks checkpoint that step. A deep belief net's pretraining steps agree the same
  way; they stop with the finished layers kept (`pretrain/layer-LL.h5`), the interrupted one to start again.
- **After the last step** (`agree_now` again): the last epoch's end (its evaluation and the final checkpoint), the
  summary and the report run to their end, then one blocking Allreduce. A signal in that time (or in the last two
  steps, whose per-step agreement no later step reads) ends every rank with exit 3, naming the final checkpoint
  and the summary that were written: the training's result is complete, and the stop costs seconds. Stopping in
  the middle of the evaluation would save nothing and leave the run without its summary.

**Where the handlers are.** The command line (`mpitrain.cli.main`) installs them in its first line, before
mpi4py is imported, and keeps them until the process ends: `hold_stop_signals`. Before that line the interpreter
is starting and the signals' default applies (the process ends); that is the earliest point mpitrain controls.
MPI_Init installs a SIGUSR1 handler of its own (MPICH's passes the signal on to a handler installed before it,
but a signal that came with only MPI's handler in place was lost, and one in the middle of MPI_Init crashed the
rank): `signals_blocked_while_mpi_starts` blocks both signals in the starting thread while MPI starts, puts
mpitrain's handlers back over the library's, then unblocks them, so a signal that came meanwhile is delivered to
mpitrain's, whatever the MPI library does. The threads MPI starts inherit the blocked mask.

**From Python** (`mpitrain.train` in a script), mpitrain does not take the process's signals for longer than a
call: `StopSignals` installs the handlers while `train` runs and puts the caller's back when it returns (also
when it raises `Stopped`). A signal outside `train` is the caller's to handle. A script that wants the command
line's whole-process rule calls `hold_stop_signals()` first (then `train` leaves the handlers as they are).
`mpitrain eval` and `predict` hold them too: they finish their (bounded) work and then, after one agreement,
exit 3 saying their output was written before the stop. The commands without ranks to agree (etl, score, export,
report, info) give the signals their defaults back once the command is known (`release_stop_signals`): a signal
ends them as it ends any program.

The process ends with exit status 3 on every rank (`Stopped`, caught by the command line). A signal that comes
after the last agreement point, in the last instants before `main` returns, ends that rank with exit 3 as well
(`signal_received` in `mpitrain.cli.main`); only the interpreter's own exit (MPI_Finalize) lies after that.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from contextlib import contextmanager

import numpy as np

from mpitrain.base.errors import DataError, MpitrainError

SIGNALS = (signal.SIGUSR1, signal.SIGINT, signal.SIGTERM)  # the stop signals, weakest first (the agreement's order)
READ_FAILED = 1 << 16  # above every signal's place in SIGNALS: a rank could not read its rows


class Stopped(MpitrainError):
    """Training stopped early at a signal's request: exit status 3 on every rank, with the line saying what was
    saved (a checkpoint to resume, or nothing before the first step)."""

    exit_status = 3


class _Flag:
    """This process's stop request: the first stop signal it got (0: none), and whether the handlers are held for
    the whole process (the command line) or only while `train` runs (a script)."""

    received = 0
    held = False


def _handle(number, frame) -> None:
    if not _Flag.received:
        _Flag.received = number


def _install() -> dict:
    """mpitrain's flag-setting handlers for the stop signals; returns the previous ones."""
    return {number: signal.signal(number, _handle) for number in SIGNALS}


def hold_stop_signals() -> None:
    """Install mpitrain's handlers for the rest of the process (the command line's first line, and again once MPI
    has started). Not a collective."""
    _install()
    _Flag.held = True


def release_stop_signals() -> None:
    """For commands that have no stop agreement (etl, score, export, report, info): the signals' defaults back, and
    a signal that came while mpitrain held them delivered now, so it ends the process as it would have."""
    for number in SIGNALS:
        signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
    _Flag.held = False
    if _Flag.received:
        signal.raise_signal(_Flag.received)


def signal_received() -> str | None:
    """The name of the first stop signal this process got, or None (this rank only: not a collective)."""
    return signal.Signals(_Flag.received).name if _Flag.received else None


@contextmanager
def signals_blocked_while_mpi_starts():
    """Block the stop signals while the block starts MPI, then put mpitrain's handlers back over the MPI
    library's and unblock them: a signal that came meanwhile is delivered to mpitrain's handler. Not a
    collective."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
        hold_stop_signals()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class StopSignals:
    """The stop signals while `train` runs, and the agreements on them (collectives on `comm`); see the module
    docstring. Held handlers (the command line's) are left as they are; otherwise they are installed for the
    block, with a fresh flag, and the previous ones come back at its end."""

    def __init__(self, comm):
        self.comm = comm
        self.outgoing = np.zeros(1, dtype=np.int32)  # what this rank posted: its signal, or READ_FAILED
        self.agreed_signal = np.zeros(1, dtype=np.int32)
        self.pending = None  # the Allreduce posted at the last step
        self.previous = {}
        self.read_failure: str | None = None  # this rank's read error, in the agreement until every rank knows

    def __enter__(self):
        if not _Flag.held:
            _Flag.received = 0
            self.previous = _install()
        return self

    def __exit__(self, *exc):
        self._complete()
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def _complete(self) -> None:
        if self.pending is not None:  # every rank posted one at its last step: complete them alike
            self.pending.Wait()
            self.pending = None

    def fail(self, message: str) -> None:
        """This rank could not read its rows (`message`): the agreement carries that to every rank, which then
        raise it together (`agreed`). Meanwhile this rank trains on a stand-in batch, so no collective waits."""
        if self.read_failure is None:
            self.read_failure = message

    def _signal_name(self) -> str | None:
        """The agreed value as a signal name (None: no signal); a read failure is raised on every rank."""
        if self.agreed_signal[0] == READ_FAILED:
            self.comm.raise_first_failure(self.read_failure, DataError)
        return SIGNALS[int(self.agreed_signal[0]) - 1].name if self.agreed_signal[0] else None

    def _post(self):
        """Post this rank's word: READ_FAILED, or its signal's place in SIGNALS counted from 1 (0: none)."""
        self.outgoing[0] = READ_FAILED if self.read_failure is not None else \
            SIGNALS.index(_Flag.received) + 1 if _Flag.received else 0
        return self.comm.iallreduce_max(self.outgoing, self.agreed_signal)

    def agreed(self) -> str | None:
        """The name of the signal some rank got, once every rank knows it, else None; a rank's read failure, once
        every rank knows it, is a DataError raised on every rank with that rank's message. A collective: every
        rank calls it once per step, and all of them see the same answer in the same step."""
        if self.pending is not None:
            self._complete()
            name = self._signal_name()
            if name:
                return name
        self.pending = self._post()
        return None

    def agree_now(self) -> str | None:
        """`agreed`, but waiting for the answer: the signal any rank got until now, on every rank. A blocking
        collective (the agreement before the first step and after the last)."""
        self._complete()
        self._post().Wait()
        return self._signal_name()


def requeue(setting, signal_name: str, is_root: bool, resumes: str = "it resumes from this checkpoint") -> str:
    """After a stop, on rank 0 (`is_root`; the other ranks' lines are not printed, and they ask nothing): ask Slurm
    to requeue this job when `train.requeue` says so (auto, true or false; auto: inside a Slurm job) and the
    signal was SIGUSR1, the time limit's warning. SIGTERM is `scancel` (the user wants the job to end) or
    preemption (Slurm requeues it itself when its PreemptMode says so): it is never requeued here. Returns what
    happened, for the stop's message (`resumes`: what the requeued job does)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not is_root or setting is False or (setting == "auto" and not job) or signal_name != "SIGUSR1":
        return "resume with the same command"
    if not job:
        return "train.requeue is true, but this is no Slurm job: resume with the same command"
    if shutil.which("scontrol") is None:
        return "scontrol is not on the PATH, so the job was not requeued: resubmit it"
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if result.returncode:
        return f"scontrol requeue {job} failed ({result.stderr.strip()}): resubmit the job"
    return f"Slurm job {job} requeued: {resumes}"
