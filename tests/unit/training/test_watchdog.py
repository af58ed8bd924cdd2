"""The watchdog calls abort only when no beat came for its time limit."""
import threading
import time

from mpitrain.training.watchdog import Watchdog


def test_beats_keep_it_quiet_and_silence_aborts(capfd):
    aborted = threading.Event()
    with Watchdog(0.3, rank=3, abort=aborted.set, poll=0.05) as watchdog:
        for step in range(10):
            watchdog.beat(f"step {step}")
            time.sleep(0.05)
        assert not aborted.is_set()
        watchdog.beat("the slow part")
        assert aborted.wait(2.0)
    err = capfd.readouterr().err
    assert "[rank 3] watchdog: no progress for" in err and "at the slow part" in err
    assert "test_watchdog.py" in err  # the stacks say where each thread was


def test_alone_it_writes_its_state_and_the_verdict_and_aborts(tmp_path, capfd):
    from mpitrain.parallel.rollcall import DATA_READ, RollCall
    aborted, calls = threading.Event(), RollCall(0, "n1")
    calls.at(DATA_READ, 1, 4)
    with Watchdog(0.2, rank=0, abort=aborted.set, poll=0.05, calls=calls, ranks=1, run_dir=str(tmp_path)):
        assert aborted.wait(10.0)
    err = capfd.readouterr().err
    folder = tmp_path / "forensics"
    assert ("[rank 0] watchdog: no progress for 0 s (train.watchdog_s = 0.2) at starting: every rank that answered "
            "is in the data read of epoch 2 step 5") in err and f"each rank's collectives and stacks: {folder}" in err
    assert (folder / "verdict.txt").read_text().startswith("every rank that answered is in the data read")
    assert "test_watchdog.py" in (folder / "rank-0.stacks.txt").read_text()


def test_a_roll_call_that_fails_still_prints_the_stacks_and_aborts(tmp_path, capfd):
    class Broken:
        def state(self, where):
            raise KeyError("oops")
    aborted = threading.Event()
    with Watchdog(0.2, rank=1, abort=aborted.set, poll=0.05, calls=Broken(), ranks=2, run_dir=str(tmp_path)):
        assert aborted.wait(10.0)
    err = capfd.readouterr().err
    assert "[rank 1] watchdog: the roll-call failed (KeyError: 'oops')" in err
    assert "watchdog: no progress for" in err and "test_watchdog.py" in err  # the stacks, as without a roll-call
