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


def test_cuda_kernels_match_reference_under_simulator():
    result = subprocess.run([sys.executable, SCRIPT], env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("OK"), result.stdout
