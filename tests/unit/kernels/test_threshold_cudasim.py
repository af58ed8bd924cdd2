"""The numba-CUDA kernels against the numpy reference under the CUDA simulator.

The simulator must be enabled before numba.cuda is first imported, and other tests in this
process may import numba first, so the checks run in a subprocess: cuda_kernels_check.py.
"""
from __future__ import annotations

import pytest

from mpitrain.testing.cuda_check import run_cuda_kernels_check

pytest.importorskip("numba")


def test_cuda_kernels_match_reference_under_simulator():
    run_cuda_kernels_check(simulator=True, timeout=240)
