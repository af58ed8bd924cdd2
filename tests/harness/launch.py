"""Starting mpitrain as users do, from tests and benchmarks: the venv's own mpiexec and mpitrain,
each command with a timeout so a hang fails instead of stalling CI, and no thread variables
(mpitrain sizes its pools itself)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK_SCRIPTS = os.path.join(REPO, "tests", "mpi", "ranks")  # scripts the MPI tests run on every rank
VENV_BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(VENV_BIN, "mpiexec")
MPITRAIN = os.path.join(VENV_BIN, "mpitrain")
FASHION = "/usr/share/datasets/fashion-mnist"


def command(*args, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """Run a command with a timeout, so a hang fails the test instead of stalling CI."""
    run_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYSPARK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=timeout, env=run_env)


def mpiexec(n: int, *args, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """Run `mpiexec -n N ARGS...` with a timeout."""
    return command(MPIEXEC, "-n", n, *args, timeout=timeout, env=env)


def require_fashion_mnist() -> None:
    """Skip without Debian's dataset-fashion-mnist; under CI=true its absence is a failure."""
    if not os.path.isdir(FASHION):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{FASHION} is missing; CI needs Debian's dataset-fashion-mnist (make fashion-mnist)")
        pytest.skip(f"{FASHION} not installed")

