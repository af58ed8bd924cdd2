"""Child processes of a Spark task that end with it: a killed task, Python worker or executor leaves no MPI
proxy or rank behind.

A task starts its program through `python -m mpitrain.spark.processes PROGRAM...` (the guard). The kernel
sends the guard SIGTERM when the task's process dies (Linux's PR_SET_PDEATHSIG). The guard is a child
subreaper (PR_SET_CHILD_SUBREAPER): a process below it whose parent dies becomes its child instead of init's.
On that signal, or when the program ends, the guard kills every process below it with SIGKILL. A process
group would not do: Hydra's proxy starts each rank in a session of its own, so the ranks of a killed proxy
would live on, and only the subreaper still finds them.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before it runs its program (`preexec_fn`): the kernel sends it `sig` when its parent dies
    (kept across exec, so also by the program that `ip netns exec`, `unshare` and `sh -c exec` become)."""
    _prctl(PR_SET_PDEATHSIG, sig)


def _prctl(option: int, value: int) -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(option, value) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def start_guarded(argv: list[str], **popen) -> subprocess.Popen:
    """Start `argv` under the guard, which ends the program and every process below it when this process dies
    or `stop(guard)` is called; `popen` as for `subprocess.Popen` (stdout, cwd, env)."""
    return subprocess.Popen([sys.executable, "-m", "mpitrain.spark.processes", *argv],
                            preexec_fn=lambda: die_with_parent(signal.SIGTERM), **popen)


def stop(guard: subprocess.Popen) -> None:
    """End a guarded program and everything it started, if still running; wait for the guard."""
    if guard.poll() is None:
        guard.terminate()
    guard.wait()


def descendants(pid: int) -> list[int]:
    """The running processes below `pid` (children, their children, ...), from /proc."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _guard(argv: list[str]) -> int:
    """Run `argv`; on SIGTERM or its end, SIGKILL every process below the guard; the program's exit status
    (128 + N for a program killed by signal N, as a shell says)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)

    def end_all(*_):
        _kill_descendants()
        os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, end_all)  # before the start, so no signal finds the program unguarded
    program = subprocess.Popen(argv, preexec_fn=die_with_parent)
    status = program.wait()
    _kill_descendants()
    return 128 - status if status < 0 else status


def _kill_descendants() -> None:
    """SIGKILL every process below this one until none is left, reaping those that became its children."""
    while below := descendants(os.getpid()):
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        _reap()
    _reap()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


if __name__ == "__main__":
    sys.exit(_guard(sys.argv[1:]))
