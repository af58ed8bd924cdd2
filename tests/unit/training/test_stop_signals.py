"""The stop signals' handlers without MPI: held ones only set a flag, released ones end the process as the default
would, a signal held meanwhile included. Each case runs in a fresh interpreter: handlers are process-wide."""
import signal
import subprocess
import sys

import pytest

HELD_THEN = """
import os, signal, sys
from mpitrain.training.preemption import hold_stop_signals, release_stop_signals, signal_received
hold_stop_signals()
for number in {signals}:
    os.kill(os.getpid(), number)  # a held signal only sets the flag: the process goes on
print(signal_received(), flush=True)
{then}
print("still running", flush=True)
"""


def run(signals, then: str) -> subprocess.CompletedProcess:
    code = HELD_THEN.format(signals=[int(s) for s in signals], then=then)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("first, second", [(signal.SIGUSR1, signal.SIGTERM), (signal.SIGTERM, signal.SIGTERM)])
def test_held_signals_set_a_flag_and_the_first_one_counts(first, second):
    result = run([first, second], "")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [first.name, "still running"]


def test_releasing_delivers_a_signal_held_meanwhile_with_its_default_action():
    result = run([signal.SIGTERM], "release_stop_signals()")
    assert result.returncode == -signal.SIGTERM  # ended by the signal, as if mpitrain had never held it
    assert result.stdout == "SIGTERM\n"


def test_releasing_without_a_signal_gives_the_defaults_back():
    result = run([], "release_stop_signals()\nprint(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)")
    assert result.returncode == 0 and result.stdout.split() == ["None", "True", "still", "running"], result.stdout
