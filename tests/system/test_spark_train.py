"""Training in a Spark barrier stage (mpitrain.spark), with real Spark and MPICH's Hydra: the final parameters
are `mpiexec -n 2 mpitrain train`'s bit for bit in local[2], local-cluster[2,1,1024] and on a standalone cluster
of two simulated nodes (network namespaces, tests/harness/cluster.py; root only); a rank that raises or is
killed, or a killed proxy, fails the stage with one line naming the rank and host and leaves no process of the
job; a killed executor leaves none either, and the stage Spark reruns resumes from the newest checkpoint to
mpiexec's parameters; a user error on the ranks is their one line and exit status 2, not a failed stage; what
a barrier stage cannot run is refused up front. Spark starts are few: each costs
10-20 s here."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mpitrain.errors import MpitrainError
from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.spark.processes import descendants, die_with_parent
from mpitrain.spark.stage import run_mpi_job
from mpitrain.spark.task import JobFailed, MpiJob
from mpitrain.testing.cluster import SimulatedCluster, missing_capability
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, RANK_SCRIPTS, REPO, VENV_BIN, command, mpiexec, wait_until_gone

SPARK_SUBMIT, SPARK_CLASS = os.path.join(VENV_BIN, "spark-submit"), os.path.join(VENV_BIN, "spark-class")


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
    config, expected = reference
    done = subprocess.run([SPARK_SUBMIT, "--master", "local-cluster[2,1,1024]", "--conf", "spark.ui.enabled=false",
                           os.path.join(REPO, "etl", "train.py"), config, "--ranks", "2",
                           "--set", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=400, env=spark_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert final_parameters(tmp_path / "run") == expected
    # spark-submit passes its Python driver's stderr on to its own stdout
    assert "Spark master local-cluster[2,1,1024]" in done.stdout, done.stdout[-3000:]
    assert not left_running(config)


def test_requests_a_barrier_stage_cannot_serve_are_refused_in_one_line(reference, tmp_path):
    """Before Spark starts: a config error, an MPI without a manual launcher; once it has: dynamic allocation."""
    config, _ = reference
    done = command(MPITRAIN, "spark-train", config, "--ranks", "2", "--set", "train.epochs=0")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "train.epochs" in done.stderr, done.stderr
    open_mpi = tmp_path / "mpiexec"
    open_mpi.write_text("#!/bin/sh\necho 'mpiexec (OpenRTE) 4.1.2'\n")
    open_mpi.chmod(0o755)
    done = command(MPITRAIN, "spark-train", config, "--ranks", "2", "--mpiexec", open_mpi)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "(mpiexec (OpenRTE) 4.1.2) has no manual launcher" in done.stderr and "MPICH's Hydra" in done.stderr
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
def spark():
    """local[2] for the in-process tests, with one attempt per stage: a failed stage fails the job at once
    instead of being rerun (the test of a rerun is the killed executor's, with Spark's default of 4)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = SparkSession.builder.master("local[2]").appName("mpitrain-spark-train-tests") \
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false") \
        .config("spark.stage.maxConsecutiveAttempts", "1").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


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


def rank_pids(config: str) -> dict[int, int]:
    """{rank: pid} of the ranks of `mpitrain train CONFIG` started by Hydra (PMI_RANK in their environment)."""
    ranks = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(v.split("=", 1) for v in f.read().decode(errors="replace").split("\0") if "=" in v)
        except OSError:
            continue
        if argv[1:5] == ["-m", "mpitrain", "train", config] and "PMI_RANK" in environ:
            ranks[int(environ["PMI_RANK"])] = int(pid)
    return ranks


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
        deadline = time.monotonic() + 120
        while len(list_checkpoints(str(tmp_path / "run"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = rank_pids(config)
        assert sorted(ranks) == [0, 1], ranks
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


def test_a_standalone_cluster_of_two_simulated_nodes_ends_bit_for_bit_where_mpiexec_does(reference, tmp_path):
    """A master on the first node and a worker of one core on each (tests/harness/cluster.py); spark-submit in
    the first node: one rank runs on each node, the MPI job crosses the link, the parameters are mpiexec's."""
    reason = missing_capability()
    if reason:
        pytest.fail(reason) if os.environ.get("CI") == "true" else pytest.skip(reason)
    config, expected = reference
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    with SimulatedCluster(nodes=2, link_gbps=1) as cluster:
        # seven JVMs share 2 cores: C1 only and a serial GC save about a third of their start-up CPU
        env = {**cluster.env, **spark_env(), "SPARK_CONF_DIR": str(tmp_path / "conf"),
               "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
        first = cluster.nodes[0]
        master = f"spark://{first}:7077"
        daemons = [start_in_node(cluster, first, tmp_path / "master.log", SPARK_CLASS,
                                 "org.apache.spark.deploy.master.Master", "--host", first, "--port", "7077",
                                 "--webui-port", "0", env=env)]
        try:
            wait_for_line("I have been elected leader", tmp_path / "master.log")
            workers = [tmp_path / f"worker-{node}.log" for node in cluster.nodes]
            daemons += [start_in_node(cluster, node, log, SPARK_CLASS, "org.apache.spark.deploy.worker.Worker",
                                      "--host", node, "--cores", "1", "--memory", "1024m", "--webui-port", "0",
                                      "--work-dir", tmp_path / "work", master, env=env)
                        for node, log in zip(cluster.nodes, workers)]
            wait_for_line("Successfully registered with master", *workers)
            done = subprocess.run(cluster.node_command(first, SPARK_SUBMIT, "--master", master,
                                                       os.path.join(REPO, "etl", "train.py"), config, "--ranks", "2",
                                                       "--set", f"run_dir={tmp_path / 'run'}"),
                                  capture_output=True, text=True, timeout=400, env=env)
            assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
            assert final_parameters(tmp_path / "run") == expected
            # each rank alone on its node (rank 0's thread plan says so), each node's executor ran a task
            assert "threads: 1 rank(s) on this node (from MPICH Hydra)" in done.stdout, done.stdout[-3000:]
            assert f"Spark master {master}" in done.stdout
            executors = list((tmp_path / "work").glob("*/*/stderr"))
            assert len(executors) == 2 and all("Running task" in log.read_text() for log in executors)
            time.sleep(2)  # the guards' last kills, had anything been left
            assert {node: job_processes(config, pids) for node, pids in cluster.pids().items()} == \
                {node: [] for node in cluster.nodes}
        finally:
            for daemon in daemons:
                daemon.kill()
                daemon.wait()


def test_a_killed_executor_leaves_nothing_and_the_retried_stage_resumes_to_mpiexec_s_parameters(tmp_path):
    """local-cluster[2,1,1024]: SIGKILL the executor whose task started the ranks, after the first epoch's
    checkpoint. Its proxy and ranks go at once; Spark starts another executor and reruns the stage, whose
    `mpitrain train` resumes from the checkpoint and ends where an uninterrupted mpiexec run does."""
    config = train_config(tmp_path, epochs=4, n_train=4000)
    reference = mpiexec(2, MPITRAIN, "train", config, f"--set=run_dir={tmp_path / 'mpiexec-run'}", timeout=300)
    assert reference.returncode == 0, reference.stderr[-2000:]
    driver = subprocess.Popen([MPITRAIN, "spark-train", config, "--ranks", "2", "--master", "local-cluster[2,1,1024]"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=spark_env())
    try:
        deadline = time.monotonic() + 300
        while not list_checkpoints(str(tmp_path / "run")) and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = rank_pids(config)
        assert sorted(ranks) == [0, 1], ranks
        executors = [pid for pid in descendants(driver.pid) if "CoarseGrainedExecutorBackend" in cmdline(pid)]
        hosting = [pid for pid in executors if ranks[0] in descendants(pid)]
        assert len(executors) == 2 and len(hosting) == 1, (executors, hosting)
        first_attempt = job_processes(config, descendants(hosting[0])) + job_processes("no other marker")
        os.kill(hosting[0], signal.SIGKILL)
        assert wait_until_gone(first_attempt, 15) == []
        newest = list_checkpoints(str(tmp_path / "run"))[-1]
        out, err = driver.communicate(timeout=400)
    finally:
        driver.kill()
    assert driver.returncode == 0, err[-4000:]
    assert f"resuming from {newest}" in err, err[-4000:]
    assert final_parameters(tmp_path / "run") == final_parameters(tmp_path / "mpiexec-run")
    assert not left_running(config)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
