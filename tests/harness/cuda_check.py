"""Running the numba-CUDA kernel checks (`cuda_kernels_check`) in a process of their own: the
simulator must be on before numba.cuda is first imported, and a test process may have imported
numba already."""
from __future__ import annotations

import os
import subprocess
import sys


def run_cuda_kernels_check(simulator: bool, timeout: int) -> str:
    """Run mpitrain.testing.cuda_kernels_check under the simulator or on the GPU; its output, once it has passed."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    result = subprocess.run([sys.executable, "-m", "mpitrain.testing.cuda_kernels_check"], env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("OK"), result.stdout
    return result.stdout
