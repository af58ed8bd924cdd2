"""A per-rank watchdog: when no training step finishes for `seconds`, say where the rank is stuck and abort.

A rank can wait forever without failing: a collective whose peer is stuck in a file
system call, a hung device. Waiting in vain until the batch system's wall-clock limit
wastes the whole allocation, so the watchdog dumps every thread's stack and ends the job.
"""
from __future__ import annotations

import faulthandler
import sys
import threading
import time


class Periodic:
    """A daemon thread calling `tick()` every `interval` seconds while the `with` block runs, until the block ends or
    `tick` returns True (the watchdog's abort; a study trial's heartbeat, `mpitrain.tune.storage.Heartbeat`)."""

    def __init__(self, interval: float, name: str):
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> bool | None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            if self.tick():
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()


class Watchdog(Periodic):
    """A daemon thread that calls `abort()` when `beat()` was not called for `seconds`."""

    def __init__(self, seconds: float, rank: int, abort, poll: float = 1.0):
        super().__init__(poll, "mpitrain-watchdog")
        self.seconds, self.rank, self.abort = seconds, rank, abort
        self.where = "starting"
        self.last = time.monotonic()

    def beat(self, where: str) -> None:
        """Record progress; `where` names what the rank does next (for the message if it gets stuck)."""
        self.where = where
        self.last = time.monotonic()

    def tick(self) -> bool:
        idle = time.monotonic() - self.last
        if idle <= self.seconds:
            return False
        sys.stderr.write(f"[rank {self.rank}] watchdog: no progress for {idle:.0f} s "
                         f"(train.watchdog_s = {self.seconds:g}) at {self.where}; stacks:\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        time.sleep(1.0)  # let the launcher forward the stacks before the abort tears it down
        self.abort()
        return True
