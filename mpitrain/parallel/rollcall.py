"""Where a rank is: its phase of training and a ring of its last collectives, for the watchdog's roll-call.

    calls = RollCall(rank, host)
    calls.at(DATA_READ)                      # the loop: the phase this rank enters
    slot = calls.enter(ALLREDUCE, nbytes)    # the communicator, around each collective
    calls.leave(slot)
    calls.state(where)                       # {rank, host, phase, collective in progress, the ring}: a JSON-able dict
    verdict(states, ranks)                   # one line: which rank is not where the others are

When a job stops making progress, the rank that is elsewhere is the one to look at: "rank 3 on node07 is in the
data read of epoch 2 step 1,204 (12.4 s); ranks 0-2, 4-7 wait in the Allreduce of epoch 2 step 1,204". Each rank
keeps what it would need to say its part: the phase it entered last (set by the training loop at each phase's
start) and its last `capacity` collectives (sequence number, name, bytes, phase, when entered and left), in
preallocated arrays, so a step records them without allocating an array. The watchdog (`mpitrain.training.
watchdog`) writes each rank's state when it fires and composes the `verdict` of the states the ranks wrote.

A test stalls a rank on purpose with MPITRAIN_TEST_STALL=PHASE@RANK (a phase's name, or a collective's: the rank
sleeps when it enters it the third time), or slows it with MPITRAIN_TEST_SLOW=PHASE@RANK:SECONDS (it sleeps that
long each time it enters the phase), which only tests set (the forensics tests; test_tune's killed worker).
"""
from __future__ import annotations

import os
import time

import numpy as np

PHASES = ("start-up", "the data read", "forward, backward and the update", "the checkpoint write", "the evaluation",
          "the summary")
START_UP, DATA_READ, STEP, CHECKPOINT, EVALUATION, SUMMARY = range(len(PHASES))
COLLECTIVES = ("Allreduce", "Iallreduce", "wait for the posted Allreduces", "Bcast", "Gather", "Scatter",
               "Allgather", "Allgatherv", "Alltoallv", "Sendrecv", "object Bcast", "object Gather",
               "object Allgather", "Allreduce of a maximum", "Barrier", "Ialltoallv")
(ALLREDUCE, IALLREDUCE, WAIT, BCAST, GATHER, SCATTER, ALLGATHER, ALLGATHERV, ALLTOALLV, SENDRECV, BCAST_OBJECT,
 GATHER_OBJECT, ALLGATHER_OBJECT, MAX, BARRIER, IALLTOALLV) = range(len(COLLECTIVES))
STALL_AFTER = 2  # MPITRAIN_TEST_STALL: the rank stalls the third time it enters the phase or collective


class RollCall:
    """One rank's phase and ring of collectives (see the module docstring). Not a collective."""

    def __init__(self, rank: int, host: str, capacity: int = 32):
        self.rank, self.host = rank, host
        self.seq = 0  # collectives entered so far
        self.seqs = np.full(capacity, -1, np.int64)
        self.names, self.phases = np.zeros(capacity, np.int16), np.zeros(capacity, np.int16)
        self.sizes = np.zeros(capacity, np.int64)
        self.entered, self.left = np.zeros(capacity), np.zeros(capacity)
        self.inside = -1  # the slot of the collective in progress, or -1
        self.phase, self.since = START_UP, time.monotonic()
        self.epoch = self.step = -1  # the step the phase belongs to (0-based), -1: none
        self.stall, self.reached = _stall_of(os.environ.get("MPITRAIN_TEST_STALL", ""), rank), 0
        slow, _, seconds = os.environ.get("MPITRAIN_TEST_SLOW", "").rpartition(":")
        self.slow, self.slow_s = _stall_of(slow, rank), float(seconds or 0)

    def at(self, phase: int, epoch: int = -1, step: int = -1) -> None:
        """This rank enters `phase` (one of PHASES' indices) now, of step `step` of epoch `epoch` (0-based; -1: of
        no step)."""
        self.phase, self.since = phase, time.monotonic()
        self.epoch, self.step = epoch, step
        if self.stall == PHASES[phase]:
            self._stall()
        if self.slow == PHASES[phase]:
            time.sleep(self.slow_s)

    def enter(self, name: int, nbytes: int) -> int:
        """This rank enters the collective `name` (one of COLLECTIVES' indices) of `nbytes`; returns its slot."""
        slot = self.seq % len(self.seqs)
        self.seqs[slot] = self.seq
        self.names[slot] = name
        self.phases[slot] = self.phase
        self.sizes[slot] = nbytes
        self.entered[slot] = time.monotonic()
        self.left[slot] = -1.0
        self.inside, self.seq = slot, self.seq + 1
        if self.stall == COLLECTIVES[name]:
            self._stall()
        return slot

    def leave(self, slot: int) -> None:
        """The collective of `slot` returned."""
        self.left[slot], self.inside = time.monotonic(), -1

    def state(self, where: str) -> dict:
        """What this rank says of itself: a JSON-able dict of its phase and the step it belongs to (else `where`,
        the watchdog's last beat), the collective it is in (or None) and its ring, oldest first, times in seconds
        ago."""
        if self.epoch >= 0:
            where = f"epoch {self.epoch + 1} step {self.step + 1}" if self.step >= 0 else f"epoch {self.epoch + 1}"
        now = time.monotonic()
        ring = [{"seq": int(self.seqs[i]), "name": COLLECTIVES[self.names[i]], "bytes": int(self.sizes[i]),
                 "phase": PHASES[self.phases[i]], "entered_s_ago": round(now - self.entered[i], 3),
                 "seconds": None if self.left[i] < 0 else round(self.left[i] - self.entered[i], 6)}
                for i in np.argsort(self.seqs) if self.seqs[i] >= 0]
        inside = None if self.inside < 0 else {"name": COLLECTIVES[self.names[self.inside]],
                                               "seq": int(self.seqs[self.inside]),
                                               "seconds": round(now - self.entered[self.inside], 3)}
        return {"rank": self.rank, "host": self.host, "phase": PHASES[self.phase], "where": where,
                "phase_seconds": round(now - self.since, 3), "collective": inside, "ring": ring}

    def _stall(self) -> None:
        self.reached += 1
        if self.reached > STALL_AFTER:
            time.sleep(3600)


def _stall_of(setting: str, rank: int) -> str:
    """The phase or collective MPITRAIN_TEST_STALL=NAME@RANK stalls on this rank, or ""."""
    name, _, stalled = setting.rpartition("@")
    return name if stalled.isdigit() and int(stalled) == rank else ""


def verdict(states: list[dict], ranks: int) -> str:
    """One line over the states the ranks wrote: the ranks that are not where the most are (those in a collective
    count as waiting, and win a tie), where they are and since when, and where the others wait; ranks that wrote
    nothing are named as silent."""
    groups: dict[tuple, list[dict]] = {}
    for state in sorted(states, key=lambda s: s["rank"]):
        inside = state["collective"]
        key = ("collective", inside["name"], inside["seq"], state["where"]) if inside else \
            ("phase", state["phase"], state["where"])
        groups.setdefault(key, []).append(state)
    waiting = max(groups, key=lambda key: (len(groups[key]), key[0] == "collective", -groups[key][0]["rank"]))
    silent = sorted(set(range(ranks)) - {state["rank"] for state in states})
    parts = [f"{_ranks([s['rank'] for s in group])} on {', '.join(dict.fromkeys(s['host'] for s in group))} "
             f"{'is' if len(group) == 1 else 'are'} in {_place(key)} ({_seconds(key, group):.1f} s)"
             for key, group in groups.items() if key != waiting]
    if parts:
        others = [s["rank"] for s in groups[waiting]]
        parts.append(f"{_ranks(others)} {'waits' if len(others) == 1 else 'wait'} in {_place(waiting)}")
    else:
        nowhere = "a stuck network or device?" if waiting[0] == "collective" else "a rank's own work?"
        parts.append(f"every rank that answered is in {_place(waiting)} ({_seconds(waiting, groups[waiting]):.1f} s): "
                     f"none is elsewhere ({nowhere})")
    if silent:
        parts.append(f"{_ranks(silent)} did not answer (a rank holding the interpreter, or its node gone)")
    return "; ".join(parts)


def _place(key: tuple) -> str:
    return f"the {key[1]} of {key[3]}" if key[0] == "collective" else f"{key[1]} of {key[2]}"


def _seconds(key: tuple, group: list[dict]) -> float:
    return max(s["collective"]["seconds"] if key[0] == "collective" else s["phase_seconds"] for s in group)


def _ranks(ranks: list[int]) -> str:
    """'rank 3', or 'ranks 0-2, 4-7'."""
    spans, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            spans.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(spans)
