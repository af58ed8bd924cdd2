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
"""
from __future__ import annotations

import contextlib
import fcntl
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
