"""The numba-CUDA kernels against the numpy reference under the CUDA simulator.

The simulator must be enabled before numba.cuda is first imported, and other tests in this
process may import numba first, so the checks run in a subprocess: cuda_kernels_check.py.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_kernels_check.py")


def run_cuda_kernels_check(simulator: bool, timeout: int) -> str:
    """Run cuda_kernels_check.py under the simulator or on the GPU; its output, once it has passed."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    result = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("OK"), result.stdout
    return result.stdout


def test_cuda_kernels_match_reference_under_simulator():
    run_cuda_kernels_check(simulator=True, timeout=240)
