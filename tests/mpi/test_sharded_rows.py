"""Row-sharded embedding tables' exchanges (mpitrain/parallel/sharded_rows.py) under real `mpiexec -n 2, 3, 4`:
tests/mpi/ranks/sharded_rows_checks.py's checks, each reported by rank 0 once every rank agreed."""
import os
import sys

import pytest

from mpitrain.testing.launch import RANK_SCRIPTS, mpiexec

CHECKS = [f"step {step}: {what}" for step in (0, 1) for what in (
    "the owners' rows are the table's rows of the batch", "the owners' gradient rows are the replicated table's sums")]


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_rows_gathered_from_their_owners_and_gradients_added_there_equal_the_replicated_table(ranks):
    result = mpiexec(ranks, sys.executable, os.path.join(RANK_SCRIPTS, "sharded_rows_checks.py"), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for check in CHECKS:
        assert f"OK {check} {ranks}" in result.stdout, result.stdout + result.stderr
