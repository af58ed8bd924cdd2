"""Metrics over real ranks (`mpitrain.training.distributed_scores`): the histogram mode against the exact mode under
`mpiexec -n 2` and an odd size with a rank without rows (tests/mpi/ranks/histogram_checks.py)."""
import os
import sys

import pytest

from mpitrain.testing.launch import RANK_SCRIPTS, mpiexec


@pytest.mark.parametrize("n", [2, 3])
def test_the_histogram_mode_gives_the_exact_modes_figures_and_auc_within_its_bound(n):
    result = mpiexec(n, sys.executable, os.path.join(RANK_SCRIPTS, "histogram_checks.py"), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    for kind in ("class", "binary", "multilabel", "regression"):
        assert f"OK {kind}: the histogram mode's other figures are the exact mode's {n}" in result.stdout
        if kind != "regression":
            assert f"OK {kind}: each AUC within its bound and 1e-6 of the exact {n}" in result.stdout
    assert f"OK a bad label on the last rank is one error on every rank {n}" in result.stdout
