"""The machine shared by the tests that run at the same time on two pytest-xdist workers (tests/conftest.py): a
readers-writer lock of two files. An ordinary test holds it shared; a test that times something holds it alone.

    share = MachineShare(run_folder)
    with share.held(alone=False):     # any number of these at once
        ...
    with share.held(alone=True):      # none other: waits for the shared holders to finish
        ...

A waiting `alone` holder keeps the turnstile, so the shared holders that come after it wait until it is done:
without it, two workers that take turns holding it shared would keep it from ever being free. flock(2) locks
belong to an open file, so two threads of a process exclude each other as two processes do.

A worker's tests in turn (`WorkerHolds`): an `alone` test followed by another keeps the machine for it, so the
other workers' tests in progress finish once for the row instead of once per test.

    holds = WorkerHolds(MachineShare(run_folder))
    waited = holds.start(alone=True)           # seconds it waited for the machine
    ...                                        # the test
    holds.end(next_alone=True)                 # kept for the next test
"""
from __future__ import annotations

import contextlib
import fcntl
import time
from pathlib import Path


class MachineShare:
    def __init__(self, folder: Path):
        self.turnstile, self.machine = Path(folder) / "machine.turnstile", Path(folder) / "machine.lock"

    @contextlib.contextmanager
    def held(self, alone: bool):
        """Hold the machine, alone or shared, for the block; waits as long as it takes."""
        with open(self.turnstile, "a") as turnstile, open(self.machine, "a") as machine:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(machine, fcntl.LOCK_UN)


class WorkerHolds:
    """One worker's holds of the machine, test after test: shared for an ordinary test, alone for an `alone` one,
    and kept from an `alone` test into the next when it is `alone` too."""

    def __init__(self, share: MachineShare):
        self.share, self.held, self.alone = share, None, False

    def start(self, alone: bool) -> float:
        """Hold the machine for a test (unless the previous test kept it); the seconds spent waiting for it."""
        started = time.monotonic()
        if self.held is None:
            self.held, self.alone = contextlib.ExitStack(), alone
            self.held.enter_context(self.share.held(alone))
        return time.monotonic() - started

    def end(self, next_alone: bool) -> None:
        """Let the machine go after a test, or keep it when it is held alone and the next test is `alone`."""
        if not (self.alone and next_alone):
            self.held.close()
            self.held = None
