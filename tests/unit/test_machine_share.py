"""MachineShare (mpitrain.testing.machine_share), which lets make test run the mpi and system tests at the same time:
shared holders overlap, an alone holder waits for them and runs by itself, and a shared holder that comes while an
alone one waits goes after it; a worker's `alone` tests in a row keep it from one to the next (`WorkerHolds`)."""
from __future__ import annotations

import threading
import time

import pytest

from mpitrain.testing.machine_share import MachineShare, WorkerHolds


def holder(share: MachineShare, alone: bool, events: list, name: str, seconds: float) -> threading.Thread:
    def hold():
        with share.held(alone):
            events.append(("start", name))
            time.sleep(seconds)
            events.append(("end", name))
    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def test_shared_holders_hold_it_at_the_same_time(tmp_path):
    events = []
    threads = [holder(MachineShare(tmp_path), False, events, name, 0.3) for name in ("a", "b")]
    for thread in threads:
        thread.join(10)
    assert [kind for kind, _ in events] == ["start", "start", "end", "end"], events


def test_an_alone_holder_waits_for_the_shared_one_and_a_later_shared_one_waits_for_it(tmp_path):
    events = []
    first = holder(MachineShare(tmp_path), False, events, "shared", 0.6)
    while not events:
        time.sleep(0.01)
    alone = holder(MachineShare(tmp_path), True, events, "alone", 0.2)
    time.sleep(0.3)  # the alone holder waits for the machine, holding the turnstile
    later = holder(MachineShare(tmp_path), False, events, "later", 0.0)
    for thread in (first, alone, later):
        thread.join(10)
    assert events == [("start", "shared"), ("end", "shared"), ("start", "alone"), ("end", "alone"),
                      ("start", "later"), ("end", "later")], events


@pytest.mark.parametrize("kept", [True, False], ids=["alone-then-alone", "alone-then-shared"])
def test_a_worker_s_alone_tests_in_a_row_keep_the_machine_from_one_to_the_next(tmp_path, kept):
    """Worker A runs two tests, the first `alone`; worker B's test asks for the machine during A's first. When A's
    second test is `alone` too, B's goes after both (one wait for the row); otherwise between them."""
    events, holds = [], WorkerHolds(MachineShare(tmp_path))
    assert holds.start(alone=True) < 0.5
    events.append("A1")
    other = holder(MachineShare(tmp_path), False, events, "B", 0.0)
    time.sleep(0.3)  # B waits for the machine
    holds.end(next_alone=kept)
    deadline = time.monotonic() + (0.3 if kept else 10)  # kept: B's chance to slip in; else: B's turn
    while ("end", "B") not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    waited = holds.start(alone=kept)
    events.append("A2")
    holds.end(next_alone=False)
    other.join(10)
    if kept:
        assert events == ["A1", "A2", ("start", "B"), ("end", "B")] and waited < 0.05, (events, waited)
    else:
        assert events == ["A1", ("start", "B"), ("end", "B"), "A2"], events
