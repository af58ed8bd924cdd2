"""Training in a Spark barrier stage (mpitrain.spark), with real Spark and MPICH's Hydra: the final parameters
are `mpiexec -n 2 mpitrain train`'s bit for bit in local[2] and local-cluster[2,1,1024]; a rank that raises or
is killed, or a killed proxy, fails the stage with one line naming the rank and host and leaves no process of
the job; what a barrier stage cannot run is refused up front. Spark starts are few: each costs 10-20 s here."""
from __future__ import annotations

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
from mpitrain.spark.stage import run_mpi_job
from mpitrain.spark.task import JobFailed, MpiJob
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, RANK_SCRIPTS, REPO, VENV_BIN, command, mpiexec, wait_until_gone

SPARK_SUBMIT = os.path.join(VENV_BIN, "spark-submit")


def final_parameters(run_dir) -> tuple[bytes, bytes, int]:
    """The newest checkpoint's parameters and statistics as bytes, and its epoch."""
    checkpoint = load_checkpoint(list_checkpoints(str(run_dir))[-1])
    return checkpoint.params.tobytes(), checkpoint.stats.tobytes(), checkpoint.epoch


def job_processes(marker: str) -> list[int]:
    """The running processes of a job whose command lines hold `marker` (ranks, mpiexec, guards), and the
    proxies of this venv's manual launcher (only the Spark jobs start those)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        proxy = line.startswith(os.path.join(VENV_BIN, "hydra_pmi_proxy")) and "--launcher manual" in line
        if (marker in line or proxy) and int(pid) != os.getpid():
            found.append(int(pid))
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
    done = subprocess.run([MPITRAIN, "spark-train", config, "--ranks", "2", "--set", "run_dir=spark-run"],
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


def rank_job(config: str, *python_args) -> MpiJob:
    return MpiJob(python_args or ("-m", "mpitrain", "train", config), os.path.dirname(config), ("", 0))


def test_more_ranks_than_task_slots_are_refused_before_the_stage(spark, reference):
    config, _ = reference
    with pytest.raises(MpitrainError, match=r"^--ranks 3 needs 3 task slots at once, but Spark master local\[2\] has 2 "):
        run_mpi_job(spark.sparkContext, 3, rank_job(config))


def test_a_rank_that_raises_fails_the_stage_naming_it_and_leaves_nothing_running(spark, tmp_path):
    config = train_config(tmp_path)
    with pytest.raises(JobFailed) as failed:
        run_mpi_job(spark.sparkContext, 2, rank_job(config, os.path.join(RANK_SCRIPTS, "raise_mid_epoch.py"),
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
            outcome["status"] = run_mpi_job(spark.sparkContext, 2, rank_job(config))
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
