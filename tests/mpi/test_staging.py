"""Host staging of collectives (device -> pinned host -> MPI -> device) under real `mpiexec -n 2`.

On the CPU the staging is forced onto numpy buffers through the same code the GPU path runs;
the cupy run needs a GPU and is skipped, saying so, where there is none.
"""
import os
import sys

import pytest

from mpitrain.parallel.backend import gpu_available
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import RANK_SCRIPTS, mpiexec

NO_GPU = "no GPU: cupy is not installed or cupy.is_available() is False; staging device buffers needs a CUDA GPU"
CHECKS = ["allreduce equals the unstaged sum", "allreduce copies once each way", "bcast equals the unstaged one",
          "bcast copies out on the root, in elsewhere", "allgatherv equals the unstaged exchange",
          "allgatherv copies the message out and all messages in", "alltoallv equals the unstaged exchange",
          "alltoallv copies the parts out and the received parts in", "sendrecv equals the unstaged exchange",
          "sendrecv copies the message out and what arrived in", "host buffers are not staged on the GPU path",
          "allreduce: staged training equals unstaged", "averaging: staged training equals unstaged",
          "staged train run finished", "a staged train run counts its copies and ends where the plain one does"]


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cupy", marks=pytest.mark.skipif(
    not gpu_available(), reason=NO_GPU))])
def test_staged_collectives_equal_unstaged_ones_and_count_their_copies(tmp_path, backend):
    make_dataset(tmp_path / "data", n_train=320, n_test=64)
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", train={"epochs": 1, "log_every": 5})
    result = mpiexec(2, sys.executable, os.path.join(RANK_SCRIPTS, "staging_checks.py"), backend, config)
    assert result.returncode == 0, result.stdout + result.stderr
    sharing = [f"sharing {exchange}: staged training equals unstaged" for exchange in ("allgather", "split",
                                                                                        "recursive")]
    for check in CHECKS + (sharing if backend == "numpy" else []):
        assert f"OK {check} 2" in result.stdout, result.stdout + result.stderr
    assert result.stdout.count("OK cuda_aware") == 3, result.stdout
