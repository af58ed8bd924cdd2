"""Starting mpitrain as users do, from tests and benchmarks: the venv's own mpiexec and mpitrain,
each command with a timeout so a hang fails instead of stalling CI, and no thread variables
(mpitrain sizes its pools itself)."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

import pytest

# the tests' daemons (Slurm's, the S3 server) start with it as `preexec_fn`: a test run killed by SIGKILL,
# which no `finally` survives, leaves none behind
from mpitrain.spark.processes import die_with_parent  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK_SCRIPTS = os.path.join(REPO, "tests", "mpi", "ranks")  # scripts the MPI tests run on every rank
VENV_BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(VENV_BIN, "mpiexec")
MPITRAIN = os.path.join(VENV_BIN, "mpitrain")
FASHION = "/usr/share/datasets/fashion-mnist"
# The options of every JVM the tests start (tests/conftest.py exports them for spark-submit's drivers and
# launchers; the simulated clusters' daemons and executors take them too). A test's JVM lives seconds, and spends
# a third of its CPU there in C2's JIT and G1's threads: C1 only and a serial GC (a local ETL job: 20.8 s of CPU
# -> 14.0 s, 2026-12-07). Not mpitrain's defaults: a user's long-lived driver and executors gain from C2.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def command(*args, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """Run a command with a timeout, so a hang fails the test instead of stalling CI."""
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYSPARK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=timeout, env=run_env)


def mpiexec(n: int, *args, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """Run `mpiexec -n N ARGS...` with a timeout."""
    return command(MPIEXEC, "-n", n, *args, timeout=timeout, env=env)


def train_each(n: int, *arguments, timeout: float = 240) -> subprocess.CompletedProcess:
    """`mpiexec -n N python tests/mpi/ranks/train_each.py CONFIG [--set KEY=VALUE ...] ...`: several runs in turn in
    one job (one start-up for scenarios that differ only in their config)."""
    return mpiexec(n, sys.executable, os.path.join(RANK_SCRIPTS, "train_each.py"), *arguments, timeout=timeout)


def require_fashion_mnist() -> None:
    """Skip without Debian's dataset-fashion-mnist; under CI=true its absence is a failure."""
    if not os.path.isdir(FASHION):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{FASHION} is missing; CI needs Debian's dataset-fashion-mnist (make fashion-mnist)")
        pytest.skip(f"{FASHION} not installed")


def child_processes(pid: int) -> dict[int, str]:
    """{pid: command name} of the running processes whose parent is `pid` (from /proc)."""
    found = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(stat.split("/")[2])] = name
    return found


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until_gone(pids, seconds: float) -> list[int]:
    """Wait up to `seconds` for the processes `pids` to end (a zombie has ended); the ones still running."""
    deadline = time.monotonic() + seconds
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]
