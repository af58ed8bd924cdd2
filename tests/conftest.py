"""Shared fixtures (a SparkSession per module, a small dataset), and each test's marker from its folder:
tests/unit (fast, no launcher, no Spark, no root), tests/mpi (real mpiexec), tests/system (Spark, Slurm,
simulated nodes, GPUs). The harness the tests share is `mpitrain.testing` (tests/harness/)."""
from __future__ import annotations

import os
import sys

import pytest

from mpitrain.testing.datasets import make_dataset

# pip's MPICH runs over UCX; on some hosts UCX's network address exchange fails at MPI_Init now
# and then ("failed to unpack address, invalid bandwidth 0.00", pmodels/mpich#7417). The tests
# run on one node: shared memory is all they need. Exported, so Slurm jobs inherit it too.
os.environ.setdefault("UCX_TLS", "self,sm")
KINDS = ("unit", "mpi", "system")


def pytest_collection_modifyitems(items):
    """Mark each test with its folder's kind (`pytest -m unit` runs the fast ones alone)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        kind = os.path.relpath(str(item.path), tests).split(os.sep)[0]
        if kind in KINDS:
            item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture(scope="module")
def spark():
    """One local[2] SparkSession per test module (starting one takes seconds)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = SparkSession.builder.master("local[2]").appName("mpitrain-tests") \
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def dataset(tmp_path):
    make_dataset(tmp_path / "data")
    return tmp_path / "data"
