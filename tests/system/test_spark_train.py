"""Training in a Spark barrier stage (mpitrain.spark), with real Spark and MPICH's Hydra: the final parameters
are `mpiexec -n 2 mpitrain train`'s bit for bit in local[2], local-cluster[2,2,1024] (two cores per task, two
threads per rank) and on a standalone cluster of two simulated nodes (network namespaces,
tests/harness/cluster.py; root only). In local mode and on the two nodes (there the rank and proxy of the node
without mpiexec): a rank that raises or is killed, or a killed proxy, fails the stage with one line naming the
rank and host and leaves no process of the job on any node. On the two nodes a killed executor (of the node
without mpiexec) leaves none either, and the stage Spark reruns resumes from the newest checkpoint to mpiexec's
parameters; each rank sees its own task's GPU (workers offering a pretend GPU by a discovery script). A user
error on the ranks is their one line and exit status 2, not a failed stage; what a barrier stage cannot run is
refused up front. A sharded embedding table (issue 49) trains in the stage as under mpiexec, its rows written by
each rank. Spark starts are few: each costs 10-20 s here."""
from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mpitrain.base.errors import MpitrainError
from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.spark.processes import descendants, die_with_parent
from mpitrain.spark.stage import run_mpi_job
from mpitrain.spark.task import JobFailed, MpiJob
from mpitrain.testing.cluster import SimulatedCluster, missing_capability
from mpitrain.testing.datasets import make_click_dataset, make_dataset, write_config
from mpitrain.testing.launch import (
    MPITRAIN,
    RANK_SCRIPTS,
    REPO,
    TEST_JVM_OPTIONS,
    VENV_BIN,
    command,
    mpiexec,
    wait_until_gone,
)

SPARK_SUBMIT, SPARK_CLASS = os.path.join(VENV_BIN, "spark-submit"), os.path.join(VENV_BIN, "spark-class")
SPARK_JOB = os.path.join(REPO, "tests", "harness", "spark_job.py")  # a driver running any rank program


def final_parameters(run_dir) -> tuple[bytes, bytes, int]:
    """The newest checkpoint's parameters and statistics as bytes, and its epoch."""
    checkpoint = load_checkpoint(list_checkpoints(str(run_dir))[-1])
    return checkpoint.params.tobytes(), checkpoint.stats.tobytes(), checkpoint.epoch


def job_processes(marker: str, pids=None) -> list[int]:
    """The running processes (of `pids`, default all) of a job whose command lines hold `marker` (ranks, mpiexec,
    guards), and the proxies of this venv's manual launcher (only the Spark jobs start those)."""
    found = []
    for pid in pids or map(int, filter(str.isdigit, os.listdir("/proc"))):
        line = cmdline(pid)
        proxy = line.startswith(os.path.join(VENV_BIN, "hydra_pmi_proxy")) and "--launcher manual" in line
        if (marker in line or proxy) and pid != os.getpid():
            found.append(pid)
    return found


def left_running(marker: str) -> list[int]:
    """The job's processes (`job_processes`) still running 10 s from now."""
    return wait_until_gone(job_processes(marker), 10)


def train_config(folder: Path, **train) -> str:
    make_dataset(folder / "data", n_train=train.pop("n_train", 800), shape=(1, 8, 8))
    return write_config(folder / "exp.yaml", folder / "data", train={"epochs": 2, "batch_size": 16, "seed": 1,
                                                                        "log_every": 10, **train})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A config and its run under plain `mpiexec -n 2 mpitrain train`, the result Spark must reproduce."""
    folder = tmp_path_factory.mktemp("reference")
    config = train_config(folder)
    done = mpiexec(2, MPITRAIN, "train", config, f"--set=run_dir={folder / 'mpiexec-run'}", timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return config, final_parameters(folder / "mpiexec-run")


def spark_env() -> dict:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def test_spark_train_in_local_mode_ends_bit_for_bit_where_mpiexec_does(reference, tmp_path):
    config, expected = reference
    # a relative run_dir means what it means under mpiexec: under the driver's working directory
    done = subprocess.run([MPITRAIN, "spark-train", config, "--ranks", "2", "--set", "run_dir=spark-run",
                           "--conf", "spark.ui.enabled=false"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=spark_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert final_parameters(tmp_path / "spark-run") == expected
    # the driver shows the ranks' progress as it comes, then its summary
    assert "epoch 2/2 done: test accuracy" in done.stderr, done.stderr[-3000:]
    assert "spark-train: trained 2 ranks in" in done.stderr and f"results in {tmp_path / 'spark-run'}" in done.stderr
    assert (tmp_path / "spark-run" / "metrics.jsonl").read_text().count('"kind": "epoch"') == 2
    assert not left_running(config)


def test_spark_submit_on_a_local_cluster_ends_bit_for_bit_where_mpiexec_does(reference, tmp_path):
    """Two executors of two cores, two cores per task: each rank runs spark.task.cpus threads per pool."""
    config, expected = reference
    done = subprocess.run([SPARK_SUBMIT, "--master", "local-cluster[2,2,1024]", "--conf", "spark.ui.enabled=false",
                           "--conf", f"spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}",
                           "--conf", "spark.task.cpus=2", os.path.join(REPO, "etl", "train.py"), config,
                           "--ranks", "2", "--set", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=400, env=spark_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert final_parameters(tmp_path / "run") == expected
    # spark-submit passes its Python driver's stderr on to its own stdout
    assert "Spark master local-cluster[2,2,1024]" in done.stdout, done.stdout[-3000:]
    assert "numba 2, BLAS 2 thread(s) per rank; set by you: OMP_NUM_THREADS" in done.stdout, done.stdout[-3000:]
    assert not left_running(config)


def test_a_sharded_table_trains_in_a_barrier_stage_as_under_mpiexec(spark, tmp_path):
    """Each rank of the stage (the module's session: `mpitrain spark-train` runs the same `run_mpi_job`, its command
    line is the local-mode test's) holds its rows of a `shard: rows` table and writes them beside the checkpoint: the
    rows and the model are mpiexec's bit for bit."""
    make_click_dataset(tmp_path / "data", n_train=2000, n_test=200, ids=(50, 3000))
    graph = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 4, "shard": "rows"},
             {"name": "flat", "type": "flatten", "input": "emb"},
             {"name": "out", "type": "dense", "input": "flat", "units": 1}]
    config = write_config(tmp_path / "sharded.yaml", tmp_path / "data", model={"layers": [], "graph": graph,
                                                                              "loss": "binary_cross_entropy"},
                          train={"epochs": 1, "batch_size": 32}, optimizer={"type": "adam", "lr": 0.01})
    done = mpiexec(2, MPITRAIN, "train", config, f"--set=run_dir={tmp_path / 'mpiexec-run'}", timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    out = io.StringIO()
    job = rank_job(2, config, "-m", "mpitrain", "train", config, "--set", f"run_dir={tmp_path / 'spark-run'}")
    assert run_mpi_job(spark.sparkContext, job, out=out) == 0, out.getvalue()[-3000:]
    assert final_parameters(tmp_path / "spark-run") == final_parameters(tmp_path / "mpiexec-run")
    rows = sorted((tmp_path / "spark-run" / "checkpoints" / "ckpt-0001-000000.rows").rglob("*.npy"))
    assert [str(p.relative_to(tmp_path / "spark-run")) for p in rows] == \
        [f"checkpoints/ckpt-0001-000000.rows/{rank}/emb/{table}/{array}.npy" for rank in (0, 1)
         for table in ("table0", "table1") for array in ("first_moment", "params", "second_moment")]
    for path in rows:
        assert np.array_equal(np.load(path), np.load(tmp_path / "mpiexec-run" / path.relative_to(tmp_path / "spark-run")))
    assert not left_running(config)


def test_requests_a_barrier_stage_cannot_serve_are_refused_in_one_line(reference, tmp_path):
    """Before Spark starts: a config error, an MPI without a manual launcher, Spark Connect; once it has: dynamic
    allocation (the other settings: tests/unit/spark/test_refusals.py)."""
    config, _ = reference
    done = command(MPITRAIN, "spark-train", config, "--ranks", "2", "--set", "train.epochs=0")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "train.epochs" in done.stderr, done.stderr
    open_mpi = tmp_path / "mpiexec"
    open_mpi.write_text("#!/bin/sh\necho 'mpiexec (OpenRTE) 4.1.2'\n")
    open_mpi.chmod(0o755)
    done = command(MPITRAIN, "spark-train", config, "--ranks", "2", "--mpiexec", open_mpi)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "(mpiexec (OpenRTE) 4.1.2) has no manual launcher" in done.stderr and "MPICH's Hydra" in done.stderr
    done = command(MPITRAIN, "spark-train", config, "--ranks", "2", "--conf", "spark.api.mode=connect")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "spark.api.mode=connect asks for Spark Connect, whose sessions have no RDD API" in done.stderr
    done = subprocess.run([SPARK_SUBMIT, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                           "--conf", "spark.dynamicAllocation.enabled=true", os.path.join(REPO, "etl", "train.py"),
                           config, "--ranks", "2", "--set", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=300, env=spark_env())
    assert done.returncode == 2, done.stdout[-3000:]
    assert "error: spark.dynamicAllocation.enabled is true, but the ranks' barrier stage needs all its 2 tasks " \
           "at once; set spark.dynamicAllocation.enabled=false" in done.stdout
    assert not (tmp_path / "run").exists()


def rank_job(ranks: int, config: str, *python_args) -> MpiJob:
    return MpiJob(ranks, python_args or ("-m", "mpitrain", "train", config), os.path.dirname(config), ("", 0))


@pytest.fixture(scope="module")
def spark(spark_sessions):
    """local[2] for the in-process tests, with one attempt per stage: a failed stage fails the job at once
    instead of being rerun (the test of a rerun is the killed executor's, with Spark's default of 4): a setting of
    the SparkContext, so a session of the module's own."""
    with spark_sessions.own("mpitrain-spark-train-tests", {"spark.stage.maxConsecutiveAttempts": "1"}) as session:
        yield session


def test_more_ranks_than_task_slots_are_refused_before_the_stage(spark, reference):
    config, _ = reference
    with pytest.raises(MpitrainError, match=r"^--ranks 3 needs 3 task slots at once, but Spark master local\[2\] has 2 "):
        run_mpi_job(spark.sparkContext, rank_job(3, config))


def test_a_user_error_on_the_ranks_is_their_one_line_and_status_2_not_a_failed_stage(spark, tmp_path):
    config = train_config(tmp_path, batch_size=100_000)  # checked where the rows are known: on the ranks
    out = io.StringIO()
    assert run_mpi_job(spark.sparkContext, rank_job(2, config), out=out) == 2
    errors = [line for line in out.getvalue().splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("mpitrain train: error: ") and "batch" in errors[0], errors
    assert not left_running(config)


def test_a_rank_that_raises_fails_the_stage_naming_it_and_leaves_nothing_running(spark, tmp_path):
    config = train_config(tmp_path)
    with pytest.raises(JobFailed) as failed:
        run_mpi_job(spark.sparkContext, rank_job(2, config, os.path.join(RANK_SCRIPTS, "raise_mid_epoch.py"),
                                                 config, "1", "5"))
    host = spark.sparkContext.getConf().get("spark.driver.host")
    assert str(failed.value) == f"rank 1 on {host} failed: RuntimeError: injected fault at step 5"
    assert not left_running(config)
    assert not (tmp_path / "run" / "summary.json").exists()


def ranks_once_checkpointed(run_dir: Path, config: str, checkpoints: int, seconds: float) -> dict[int, int]:
    """Once `run_dir` holds `checkpoints` checkpoints (waiting up to `seconds`): the two ranks of `mpitrain train
    CONFIG`, {rank: pid}."""
    deadline = time.monotonic() + seconds
    while len(list_checkpoints(str(run_dir))) < checkpoints and time.monotonic() < deadline:
        time.sleep(0.2)
    ranks = rank_pids(config)
    assert sorted(ranks) == [0, 1], ranks
    return ranks


def rank_pids(config: str) -> dict[int, int]:
    """{rank: pid} of the ranks of `mpitrain train CONFIG` started by Hydra (PMI_RANK in their environment)."""
    ranks = {}
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        environ = environ_of(pid)
        if cmdline(pid).split(" ")[1:5] == ["-m", "mpitrain", "train", config] and "PMI_RANK" in environ:
            ranks[int(environ["PMI_RANK"])] = pid
    return ranks


def environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(v.split("=", 1) for v in f.read().decode(errors="replace").split("\0") if "=" in v)
    except OSError:
        return {}


@pytest.mark.parametrize("victim", ["rank", "proxy"])
def test_a_killed_rank_or_proxy_fails_the_stage_and_leaves_nothing_running(spark, tmp_path, victim):
    config = train_config(tmp_path, epochs=500, n_train=4000)
    outcome = {}

    def train():
        try:
            outcome["status"] = run_mpi_job(spark.sparkContext, rank_job(2, config))
        except JobFailed as e:
            outcome["failed"] = str(e)

    stage = threading.Thread(target=train)
    stage.start()
    try:
        ranks = ranks_once_checkpointed(tmp_path / "run", config, 2, 120)
        proxies = [pid for pid in job_processes("no other marker") if pid not in ranks.values()]
        assert len(proxies) == 1, proxies  # local[2]: one host, one proxy starting both ranks
        os.kill(ranks[1] if victim == "rank" else proxies[0], signal.SIGKILL)
        killed = time.monotonic()
        stage.join(timeout=60)
        assert not stage.is_alive(), "the stage did not end within 60 s of the kill"
        assert time.monotonic() - killed < 30
    finally:
        if stage.is_alive():
            spark.sparkContext.cancelAllJobs()
            stage.join(timeout=60)
    host = spark.sparkContext.getConf().get("spark.driver.host")
    assert "failed" in outcome, outcome
    assert outcome["failed"] == (f"rank 1 on {host} ended: Killed (signal 9)" if victim == "rank" else
                                 f"the MPI proxy on {host} (ranks 0, 1) was killed by signal 9")
    assert not left_running(config)


def start_in_node(cluster, node: str, log: Path, *args, env: dict) -> subprocess.Popen:
    """A Spark daemon in `node`, its output in `log`; it dies with this test run (die_with_parent)."""
    with open(log, "w") as out:
        return subprocess.Popen(cluster.node_command(node, *args), stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=die_with_parent)


def wait_for_line(text: str, *logs: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not all(text in log.read_text() for log in logs):
        assert time.monotonic() < deadline, f"{text!r} not in every one of {logs}"
        time.sleep(0.5)


@dataclass
class Standalone:
    """A Spark standalone cluster of two simulated nodes: a master on the first, a worker of one core and one
    (pretend) GPU on each, the GPU's address `gpus[node]` (what the worker's discovery script says); `submit`
    runs spark-submit inside the first node."""

    cluster: SimulatedCluster
    master: str
    env: dict
    gpus: dict[str, str]
    work: Path

    def submit(self, *args, **popen) -> subprocess.Popen:
        return subprocess.Popen(self.cluster.node_command(self.cluster.nodes[0], SPARK_SUBMIT, "--master",
                                                          self.master, *args),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env, **popen)

    def run(self, *args, timeout: float = 400) -> subprocess.CompletedProcess:
        submitted = self.submit(*args)
        try:
            out, err = submitted.communicate(timeout=timeout)
        finally:
            submitted.kill()
        return subprocess.CompletedProcess(submitted.args, submitted.returncode, out, err)

    def node_of(self, pid: int) -> str:
        return next(node for node, pids in self.cluster.pids().items() if pid in pids)

    def left_running(self, marker: str) -> dict[str, list[int]]:
        """The job's processes (`job_processes`) still running in each node 10 s from now."""
        running = wait_until_gone(job_processes(marker, sum(self.cluster.pids().values(), [])), 10)
        return {node: [pid for pid in running if pid in pids] for node, pids in self.cluster.pids().items()
                if any(pid in pids for pid in running)}


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """The two-node cluster (tests/harness/cluster.py; root only), its daemons started once for the module."""
    reason = missing_capability()
    if reason:
        pytest.fail(reason) if os.environ.get("CI") == "true" else pytest.skip(reason)
    folder = tmp_path_factory.mktemp("standalone")
    (folder / "conf").mkdir()
    (folder / "conf" / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    with SimulatedCluster(nodes=2, link_gbps=1) as cluster:
        # seven JVMs share 2 cores: the daemons and executors take the tests' JVM options too
        env = {**cluster.env, **spark_env(), "SPARK_CONF_DIR": str(folder / "conf"), "JAVA_TOOL_OPTIONS": TEST_JVM_OPTIONS}
        first = cluster.nodes[0]
        master = f"spark://{first}:7077"
        daemons = [start_in_node(cluster, first, folder / "master.log", SPARK_CLASS,
                                 "org.apache.spark.deploy.master.Master", "--host", first, "--port", "7077",
                                 "--webui-port", "0", env=env)]
        try:
            wait_for_line("I have been elected leader", folder / "master.log")
            gpus, workers = {}, []
            for i, node in enumerate(cluster.nodes):
                gpus[node] = str(4 + 3 * i)
                discovery = folder / f"gpu-{node}.sh"
                discovery.write_text(f"#!/bin/sh\necho '{{\"name\": \"gpu\", \"addresses\": [\"{gpus[node]}\"]}}'\n")
                discovery.chmod(0o755)
                workers.append(folder / f"worker-{node}.log")
                daemons.append(start_in_node(
                    cluster, node, workers[-1], SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", "--host", node,
                    "--cores", "1", "--memory", "1024m", "--webui-port", "0", "--work-dir", folder / "work", master,
                    env={**env, "SPARK_WORKER_OPTS": "-Dspark.worker.resource.gpu.amount=1 "
                                                     f"-Dspark.worker.resource.gpu.discoveryScript={discovery}"}))
            wait_for_line("Successfully registered with master", *workers)
            yield Standalone(cluster, master, env, gpus, folder / "work")
        finally:
            for daemon in daemons:
                daemon.kill()
                daemon.wait()


def test_a_standalone_cluster_of_two_simulated_nodes_ends_bit_for_bit_where_mpiexec_does(reference, standalone,
                                                                                         tmp_path):
    """spark-submit in the first node: one rank runs on each node, the MPI job crosses the link, the parameters
    are mpiexec's."""
    config, expected = reference
    done = standalone.run(os.path.join(REPO, "etl", "train.py"), config, "--ranks", "2",
                          "--set", f"run_dir={tmp_path / 'run'}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert final_parameters(tmp_path / "run") == expected
    # each rank alone on its node (rank 0's thread plan says so), each node's executor of this application ran a
    # task (the workers keep a folder per application, an executor's log in each)
    assert "threads: 1 rank(s) on this node (from MPICH Hydra)" in done.stdout, done.stdout[-3000:]
    assert f"Spark master {standalone.master}" in done.stdout
    application = re.search(r"app-\d+-\d+", done.stderr)[0]
    executors = list((standalone.work / application).glob("*/stderr"))
    assert len(executors) == 2 and all("Running task" in log.read_text() for log in executors), executors
    time.sleep(2)  # the guards' last kills, had anything been left
    assert standalone.left_running(config) == {}


def test_on_two_nodes_a_rank_that_raises_fails_the_stage_naming_it_and_its_node_and_leaves_nothing(standalone,
                                                                                                  tmp_path):
    """Rank 1 runs on the node without mpiexec, where the proxy is started by that node's task."""
    config = train_config(tmp_path)
    done = standalone.run("--conf", "spark.stage.maxConsecutiveAttempts=1", SPARK_JOB, "2", tmp_path,
                          os.path.join(RANK_SCRIPTS, "raise_mid_epoch.py"), config, "1", "5")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    # Spark names an executor's host by its address
    assert any(f"failed: rank 1 on {host} failed: RuntimeError: injected fault at step 5" in done.stdout.splitlines()
               for host in standalone.cluster.hosts), done.stdout[-3000:]
    assert standalone.left_running(config) == {}


@pytest.mark.parametrize("victim", ["rank", "proxy"])
def test_on_two_nodes_the_task_s_gpu_is_its_rank_s_and_a_killed_remote_rank_or_proxy_leaves_nothing(
        standalone, tmp_path, victim):
    """With spark.task.resource.gpu.amount=1 each rank sees its own task's GPU (the worker's address) and no
    other. Then SIGKILL rank 1 or the proxy on the second node, the node without mpiexec: the stage fails
    within seconds naming it, and no process of the job is left on either node."""
    config = train_config(tmp_path, epochs=500, n_train=4000)
    submitted = standalone.submit("--conf", "spark.stage.maxConsecutiveAttempts=1",
                                  "--conf", "spark.executor.resource.gpu.amount=1",
                                  "--conf", "spark.task.resource.gpu.amount=1",
                                  SPARK_JOB, "2", tmp_path, "-m", "mpitrain", "train", config)
    try:
        ranks = ranks_once_checkpointed(tmp_path / "run", config, 2, 180)
        nodes = [standalone.node_of(ranks[rank]) for rank in (0, 1)]
        assert sorted(nodes) == sorted(standalone.cluster.nodes), nodes
        assert [environ_of(ranks[rank]).get("CUDA_VISIBLE_DEVICES") for rank in (0, 1)] == \
            [standalone.gpus[node] for node in nodes]
        second = nodes[1]  # rank 0 runs beside mpiexec, on task 0's node
        proxies = [pid for pid in job_processes("no other marker") if pid not in ranks.values()]
        remote_proxy = [pid for pid in proxies if standalone.node_of(pid) == second]
        assert len(proxies) == 2 and len(remote_proxy) == 1, proxies
        os.kill(ranks[1] if victim == "rank" else remote_proxy[0], signal.SIGKILL)
        killed = time.monotonic()
        out, err = submitted.communicate(timeout=90)
        assert time.monotonic() - killed < 45, "the stage did not fail within 45 s of the kill"
    finally:
        submitted.kill()
    host = standalone.cluster.hosts[standalone.cluster.nodes.index(second)]  # Spark's name of the node
    assert (f"failed: rank 1 on {host} ended: Killed (signal 9)" if victim == "rank" else
            f"failed: the MPI proxy on {host} (ranks 1) was killed by signal 9") in out.splitlines(), out[-3000:]
    assert standalone.left_running(config) == {}


@pytest.fixture(scope="module")
def three_epochs(tmp_path_factory):
    """A config of 3 epochs of 4000 rows and its final parameters under plain `mpiexec -n 2 mpitrain train`: what a
    run whose executor is killed mid-way must end with."""
    folder = tmp_path_factory.mktemp("three-epochs")
    config = train_config(folder, epochs=3, n_train=4000)
    done = mpiexec(2, MPITRAIN, "train", config, f"--set=run_dir={folder / 'mpiexec-run'}", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return config, final_parameters(folder / "mpiexec-run")


def run_killing_an_executor(driver: subprocess.Popen, processes, run_dir: Path, config: str,
                            beside_rank: int) -> tuple[str, str, str]:
    """Run `driver` to its end, killing one executor on the way: once `processes()` (pids) holds two executors and
    `run_dir` a checkpoint, SIGKILL the executor whose task hosts rank `beside_rank`, and check that every process
    of the job below it, and every proxy of its attempt, ends within 15 s. The newest checkpoint then (the rerun
    resumes from it) and the driver's stdout and stderr."""
    try:
        while len(executors := [pid for pid in processes() if "CoarseGrainedExecutorBackend" in cmdline(pid)]) < 2 \
                and driver.poll() is None:
            time.sleep(0.2)
        ranks = ranks_once_checkpointed(run_dir, config, 1, 300)
        hosting = [pid for pid in executors if ranks[beside_rank] in descendants(pid)]
        assert len(hosting) == 1, (executors, hosting)
        first_attempt = job_processes(config, descendants(hosting[0])) + job_processes("no other marker")
        os.kill(hosting[0], signal.SIGKILL)
        assert wait_until_gone(first_attempt, 15) == []
        newest = list_checkpoints(str(run_dir))[-1]
        out, err = driver.communicate(timeout=400)
    finally:
        driver.kill()
    return newest, out, err


def test_on_two_nodes_a_killed_remote_executor_leaves_nothing_on_either_node_and_the_rerun_resumes(
        standalone, three_epochs, tmp_path):
    """The executor on the node without mpiexec (rank 1's) is killed: its proxy and rank go at once, the
    other node's task is ended by Spark and takes mpiexec and rank 0 with it, the worker starts another
    executor, and the rerun resumes to mpiexec's parameters."""
    config, expected = three_epochs
    submitted = standalone.submit(os.path.join(REPO, "etl", "train.py"), config, "--ranks", "2",
                                  "--set", f"run_dir={tmp_path / 'run'}")
    newest, out, err = run_killing_an_executor(submitted, lambda: sum(standalone.cluster.pids().values(), []),
                                               tmp_path / "run", config, 1)
    assert submitted.returncode == 0, (out + err)[-4000:]
    assert f"resuming from {newest}" in out, out[-4000:]
    assert final_parameters(tmp_path / "run") == expected
    assert standalone.left_running(config) == {}


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
