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
