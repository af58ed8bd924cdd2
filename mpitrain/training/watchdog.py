"""A per-rank watchdog: when no training step finishes for `seconds`, say which rank is stuck where, and abort.

A rank can wait forever without failing: a collective whose peer is stuck in a file
system call, a hung device. Waiting in vain until the batch system's wall-clock limit
wastes the whole allocation, so the watchdog dumps every thread's stack and ends the job.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time

from mpitrain.base.files import write_file
from mpitrain.parallel.rollcall import verdict

FORENSICS = "forensics"  # RUN_DIR/forensics/: each rank's state and stacks, and the verdict, when the watchdog fires


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
    """A daemon thread that calls `abort()` when `beat()` was not called for `seconds`.

    Given the rank's `calls` (its `RollCall`), the job's `ranks` and a run directory, it holds a roll-call first:
    it writes the rank's state (its phase, the collective it is in, its ring of collectives) and stacks into
    RUN_DIR/forensics/, waits a few seconds for the other ranks' (their watchdogs fire at about the same time),
    and the lowest rank that wrote one prints the `verdict`, one line naming the rank that is not where the others
    are (every other rank prints where it was and its file). Without them, or before the run directory exists, it
    prints its own stacks."""

    def __init__(self, seconds: float, rank: int, abort, poll: float = 1.0, calls=None, ranks: int = 1,
                 run_dir: str = ""):
        super().__init__(poll, "mpitrain-watchdog")
        self.seconds, self.rank, self.abort = seconds, rank, abort
        self.calls, self.ranks, self.run_dir = calls, ranks, run_dir
        self.grace = min(max(2.0, seconds / 2), 15.0)  # how long a rank waits for the others' states
        self.where = "starting"
        self.last = time.monotonic()
        self.started = time.time()  # states older than this job's are another job's

    def beat(self, where: str) -> None:
        """Record progress; `where` names what the rank does next (for the message if it gets stuck)."""
        self.where = where
        self.last = time.monotonic()

    def tick(self) -> bool:
        idle = time.monotonic() - self.last
        if idle <= self.seconds:
            return False
        said = f"[rank {self.rank}] watchdog: no progress for {idle:.0f} s (train.watchdog_s = {self.seconds:g}) " \
               f"at {self.where}"
        folder = os.path.join(self.run_dir, FORENSICS) if self.run_dir and os.path.isdir(self.run_dir) else ""
        try:
            called = self.calls is not None and bool(folder) and self._roll_call(folder, said)
        except Exception as e:  # noqa: BLE001  (whatever the roll-call meets, the job must still end)
            sys.stderr.write(f"[rank {self.rank}] watchdog: the roll-call failed ({type(e).__name__}: {e})\n")
            called = False
        if not called:
            sys.stderr.write(f"{said}; stacks:\n")
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        time.sleep(1.0)  # let the launcher forward the message before the abort tears it down
        self.abort()
        return True

    def _roll_call(self, folder: str, said: str) -> bool:
        """Write this rank's state and stacks, wait for the other ranks', and print the verdict if this is the lowest
        rank that wrote one; False when this rank's could not be written."""
        try:
            os.makedirs(folder, exist_ok=True)
            stacks = os.path.join(folder, f"rank-{self.rank}.stacks.txt")
            with open(stacks, "w") as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
            state = {**self.calls.state(self.where), "stacks": stacks}
            write_file(os.path.join(folder, f"rank-{self.rank}.json"), lambda f: json.dump(state, f, indent=1))
        except OSError as e:
            sys.stderr.write(f"[rank {self.rank}] watchdog: could not write its roll-call into {folder} ({e})\n")
            return False
        deadline = time.monotonic() + self.grace
        states = _states(folder, self.started)
        while len(states) < self.ranks and time.monotonic() < deadline:
            time.sleep(0.2)
            states = _states(folder, self.started)
        if min((s["rank"] for s in states), default=self.rank) == self.rank:
            line = verdict(states, self.ranks)
            write_file(os.path.join(folder, "verdict.txt"), lambda f: f.write(line + "\n"))
            sys.stderr.write(f"{said}: {line}; each rank's collectives and stacks: {folder}\n")
        else:  # its own line (a node cut off shows it in its own logs); the lowest rank's verdict and abort follow
            sys.stderr.write(f"{said}; its collectives and stacks: {os.path.join(folder, f'rank-{self.rank}.json')}\n")
            sys.stderr.flush()
            time.sleep(self.grace)
        return True


def _states(folder: str, since: float) -> list[dict]:
    """The ranks' states written into `folder` since `since` (wall time, a second's leeway: another node's clock)."""
    found = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.startswith("rank-") and name.endswith(".json") and os.path.getmtime(path) >= since - 1.0:
            try:
                with open(path) as f:
                    found.append(json.load(f))
            except (OSError, ValueError):  # being written: the next look reads it
                continue
    return found
