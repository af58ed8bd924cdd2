"""The slurm/ scripts on a real one-node Slurm cluster that this file starts and stops.

The `slurm` fixture starts munged, slurmctld and slurmd as plain processes from a temporary
folder (tests/harness/slurm.py) and stops them at the end, also when a test failed. The
scripts across several nodes: tests/system/test_cluster.py. Debian's packages: `make slurm`.
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from mpitrain.testing.datasets import make_dataset
from mpitrain.testing.launch import child_processes, wait_until_gone
from mpitrain.testing.slurm import (
    ENDED,
    SLURM,
    failed_in_mpi_init,
    job_logs,
    require_slurm,
    start_slurm,
    summary_hashes,
    wait_for,
    write_mlp_config,
)
from mpitrain.testing.thread_pools import MODULE as THREAD_POOLS
from mpitrain.testing.thread_pools import assert_every_pool, pools_of


@pytest.fixture(scope="session")
def slurm():
    """A one-node Slurm on this machine for the session (tests/harness/slurm.py)."""
    with start_slurm() as cluster:
        yield cluster


def test_pipeline_runs_etl_then_training(slurm, tmp_path):
    """slurm/pipeline.sh: Spark ETL of digits in one job, then 2-rank training after it (afterok)."""
    write_mlp_config(tmp_path / "digits.yaml", "elsewhere", epochs=3)  # the pipeline points it at the ETL's output
    submitted = slurm.run(f"{SLURM}/pipeline.sh", "--source", "digits:", "--out", "data/digits", "--shards", 2,
                          "--", "digits.yaml", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    jobs = dict(re.findall(r"^(etl|train) job (\d+)$", submitted.stdout, re.MULTILINE))
    assert set(jobs) == {"etl", "train"}, submitted.stdout

    for _ in range(3):
        if not (slurm.wait(jobs["train"], 600, tmp_path) == "FAILED" and failed_in_mpi_init(tmp_path, jobs["train"])):
            break
        retry = slurm.run("sbatch", "--parsable", f"{SLURM}/train.sbatch", "digits.yaml", "--set",
                          "data.path=data/digits", cwd=tmp_path)
        jobs["train"] = retry.stdout.strip()
    assert slurm.wait(jobs["train"], 600, tmp_path) == "COMPLETED", job_logs(tmp_path)
    assert slurm.job_state(jobs["etl"]) == "COMPLETED"
    assert slurm.job_field(jobs["train"], "StartTime") >= slurm.job_field(jobs["etl"], "EndTime")  # afterok
    manifest = json.loads((tmp_path / "data" / "digits" / "manifest.json").read_text())
    assert manifest["num_classes"] == 10 and len(manifest["splits"]["train"]) == 2
    summary = json.loads((tmp_path / "runs" / "digits" / "summary.json").read_text())  # under the submit folder
    assert summary["ranks"] == 2 and summary["epochs"] == 3
    assert summary["test_accuracy"] > 0.8, summary  # 10 classes: chance is 0.1
    log = (tmp_path / f"slurm-mpitrain-train-{jobs['train']}.out").read_text()
    assert "srun --mpi=pmi2" in log and "--resume" in log


def test_pipeline_with_a_failing_etl_never_trains(slurm, tmp_path):
    """The ETL job fails on a missing source folder; Slurm then cancels the training job that depends on it."""
    write_mlp_config(tmp_path / "digits.yaml", "elsewhere", epochs=1)
    submitted = slurm.run(f"{SLURM}/pipeline.sh", "--source", f"idx:{tmp_path}/missing", "--out", "data/x",
                          "--shards", 2, "--", "digits.yaml", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    jobs = dict(re.findall(r"^(etl|train) job (\d+)$", submitted.stdout, re.MULTILINE))
    assert slurm.wait(jobs["etl"], 300, tmp_path) == "FAILED"
    assert slurm.wait(jobs["train"], 30, tmp_path) == "CANCELLED"
    assert f"{tmp_path}/missing" in (tmp_path / f"slurm-mpitrain-etl-{jobs['etl']}.out").read_text()
    assert not (tmp_path / f"slurm-mpitrain-train-{jobs['train']}.out").exists()
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()


def test_cancelled_training_resumes_from_its_checkpoint(slurm, tmp_path):
    """scancel after the first checkpoint: its SIGTERM makes the ranks checkpoint where they are (without a
    requeue: the job was cancelled); sbatch the same job again: it continues at that checkpoint's step."""
    make_dataset(tmp_path / "data", n_train=2000, n_test=200, shards=2, num_classes=10, shape=(1, 8, 8))
    epochs = 20
    write_mlp_config(tmp_path / "long.yaml", "data", epochs=epochs, checkpoint={"every": 1, "unit": "epoch", "keep": 2})
    run_dir = tmp_path / "runs" / "long"

    def submit() -> str:  # the venv's mpiexec inside the allocation: the launcher the pipeline test does not use
        submitted = slurm.run("sbatch", "--parsable", f"{SLURM}/train.sbatch", "long.yaml", cwd=tmp_path,
                              env={"MPITRAIN_LAUNCHER": "mpiexec"})
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip()

    def start(ready) -> str:
        """Submit; wait until `ready()` or the job ended; a job that died inside MPI_Init is submitted again."""
        for _ in range(3):
            job = submit()
            wait_for(lambda: ready() or slurm.job_state(job) in ENDED, 300, "the job", slurm.root)
            if ready() or not failed_in_mpi_init(tmp_path, job):
                return job
            slurm.wait(job, 60, tmp_path)
        return job

    first = start(lambda: glob.glob(f"{run_dir}/checkpoints/ckpt-*.h5"))
    assert slurm.run("scancel", first).returncode == 0
    # CANCELLED, or FAILED when the batch script sees its srun killed before slurmctld records the cancel
    assert slurm.wait(first, 60, tmp_path) in ("CANCELLED", "FAILED"), job_logs(tmp_path)
    assert not (run_dir / "summary.json").exists(), "the job finished before it was cancelled"
    newest = sorted(glob.glob(f"{run_dir}/checkpoints/ckpt-*.h5"))[-1]
    epoch, step = map(int, re.search(r"ckpt-(\d+)-(\d+)", newest).groups())
    assert 1 <= epoch < epochs
    cancelled = (tmp_path / f"slurm-mpitrain-train-{first}.out").read_text()
    assert f"stopped by SIGTERM at epoch {epoch + 1} step {step}: wrote {newest}; resume with the same command" \
        in cancelled, cancelled
    assert slurm.job_field(first, "Restarts") == "0"  # a cancelled job is not requeued

    second = start(lambda: (run_dir / "summary.json").exists())
    assert slurm.wait(second, 300, tmp_path) == "COMPLETED", job_logs(tmp_path)
    log = (tmp_path / f"slurm-mpitrain-train-{second}.out").read_text()
    assert f"resuming from {newest} at epoch {epoch + 1} step {step}" in log, log
    assert f"epoch {epoch + 1}/{epochs} " in log and f"epoch {epoch}/{epochs} " not in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == epochs and summary["ranks"] == 2
    finished = [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                if '"test_accuracy"' in line]
    assert sorted(set(finished)) == list(range(epochs)), finished  # the first job's epochs, then the resumed ones


@pytest.mark.alone  # a requeue under the mpi tests' load once came back FAILED (the job step took 32 s to die)
def test_usr1_mid_epoch_checkpoints_requeues_and_ends_where_an_uninterrupted_run_does(slurm, tmp_path):
    """scancel --signal=USR1 reaches mpitrain's handler in every rank (the MPI library installs one of its own,
    which would let training go on): they checkpoint at that step, rank 0 requeues the job, it runs again,
    resumes and ends with the parameters of a run that was never interrupted, bit for bit. The ranks run under
    the venv's mpiexec inside the allocation, whose proxies (job steps) pass the signal on to them; srun's
    pmi2 start-up of pip MPICH fails now and then on this host (see _failed_in_mpi_init)."""
    make_dataset(tmp_path / "data", n_train=4000, n_test=200, shards=2, num_classes=10, shape=(1, 8, 8))
    epochs = 30
    write_mlp_config(tmp_path / "long.yaml", "data", epochs=epochs, checkpoint={"every": 100, "unit": "epoch"},
                      train={"epochs": epochs, "batch_size": 16, "seed": 1, "log_every": 25})
    run_dir = tmp_path / "runs" / "long"
    for _ in range(3):
        job = slurm.run("sbatch", "--parsable", f"{SLURM}/train.sbatch", "long.yaml", cwd=tmp_path,
                        env={"MPITRAIN_LAUNCHER": "mpiexec"}).stdout.strip()
        metrics = run_dir / "metrics.jsonl"
        wait_for(lambda: (metrics.exists() and '"kind": "window"' in metrics.read_text())
                  or slurm.job_state(job) in ENDED, 300, "the first metrics window", slurm.root)
        if not failed_in_mpi_init(tmp_path, job):
            break
        slurm.wait(job, 60, tmp_path)
    assert slurm.run("scancel", "--signal=USR1", job).returncode == 0
    log = tmp_path / f"slurm-mpitrain-train-{job}.out"
    wait_for(lambda: "requeued: it resumes" in log.read_text(), 120, "the stop and the requeue", slurm.root)
    # Slurm holds a requeued batch job for a while (its BeginTime); as the cluster's admin, start it now
    wait_for(lambda: slurm.job_state(job) == "PENDING", 60, "the requeued job to be pending", slurm.root)
    assert slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now").returncode == 0
    state = slurm.wait(job, 300, tmp_path)
    restarted, resubmitted = "(restart 1)" in log.read_text(), False
    # Resubmitted (the checkpoint must still be resumed, bit for bit) when the restart died in MPI_Init, or never
    # reached the batch script: under load the first run's killed job step took 32 s to die, and Slurm failed the
    # restart it had queued (the requeue itself happened: the job was pending again).
    if state == "FAILED" and (failed_in_mpi_init(tmp_path, job) or not restarted):
        reason = slurm.run("scontrol", "show", "job", job).stdout
        again = slurm.run("sbatch", "--parsable", f"{SLURM}/train.sbatch", "long.yaml", cwd=tmp_path,
                          env={"MPITRAIN_LAUNCHER": "mpiexec"}).stdout.strip()
        state, resubmitted = slurm.wait(again, 300, tmp_path), True
        assert state == "COMPLETED", f"the restart failed ({reason}), and so did the resubmitted job:\n" + \
            job_logs(tmp_path)
    assert state == "COMPLETED", job_logs(tmp_path)
    text = "".join(open(path).read() for path in sorted(glob.glob(f"{tmp_path}/slurm-*.out")))
    stopped = re.search(r"mpitrain train: stopped by SIGUSR1 at epoch (\d+) step (\d+): wrote (\S+); Slurm job "
                        rf"{job} requeued: it resumes from this checkpoint", text)
    assert stopped, text
    assert text.count("stopped by SIGUSR1") == 1  # one line about the stop, however many ranks got the signal
    assert f"resuming from {stopped.group(3)} at epoch {stopped.group(1)} step {stopped.group(2)}" in text
    assert restarted or resubmitted  # the restart ran, or failed before the batch script and a resubmission resumed

    reference = _run_uninterrupted(tmp_path, "long.yaml", "reference")
    assert summary_hashes(run_dir) == summary_hashes(reference)


def _run_uninterrupted(folder, config: str, name: str):
    """The same config trained in one go by the venv's mpiexec, 2 ranks of 1 thread: the reference run."""
    result = subprocess.run([os.path.join(sys.prefix, "bin", "mpiexec"), "-n", "2",
                             os.path.join(sys.prefix, "bin", "mpitrain"), "train", config, "--set",
                             f"run_dir=runs/{name}"], cwd=folder, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    return folder / "runs" / name


def test_srun_with_a_mismatched_mpi_plugin_fails_on_every_rank(slurm, tmp_path):
    """srun --mpi=none gives each MPICH task a world of its own: mpitrain refuses to start, on every task."""
    make_dataset(tmp_path / "data")
    write_mlp_config(tmp_path / "tiny.yaml", "data", epochs=1)
    result = slurm.run("srun", "--ntasks=2", "--mpi=none", os.path.join(sys.prefix, "bin", "mpitrain"), "train",
                       "tiny.yaml", cwd=tmp_path, timeout=60)
    assert result.returncode != 0
    assert result.stderr.count("srun started 2 tasks, but each sees an MPI world of 1 rank") == 2, result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("tasks, cpus_per_task", [(2, None), (1, 2)])
def test_srun_tasks_size_their_thread_pools_with_no_thread_variables(slurm, tasks, cpus_per_task):
    """Every pool of each srun task (mpitrain.testing.thread_pools): the node's cores shared by its tasks, or the
    task's --cpus-per-task; no thread variable in the environment."""
    cores = len(os.sched_getaffinity(0))
    env = {k: v for k, v in slurm.env.items() if not k.endswith("_NUM_THREADS")}
    command = ["srun", "-n", tasks, *([f"--cpus-per-task={cpus_per_task}"] if cpus_per_task else []),
               sys.executable, *THREAD_POOLS]
    result = subprocess.run(list(map(str, command)), capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    ranks = pools_of(result.stdout)
    assert len(ranks) == tasks and all(r["launcher"] == "Slurm srun" for r in ranks), result.stdout
    for pool in ranks:
        assert_every_pool(pool, cpus_per_task or max(1, cores // tasks))


HOLD_SLURM = """
import time
from mpitrain.testing.slurm import start_slurm
with start_slurm():
    print("up", flush=True)
    time.sleep(600)
"""


def test_a_test_run_killed_by_sigkill_leaves_no_slurm_daemon_behind():
    """A process holding a test Slurm (as a pytest session does) is killed with SIGKILL, so no `finally` runs:
    its munged, slurmctld and slurmd die with it (tests/harness/slurm.py, die_with_parent)."""
    require_slurm()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_SLURM], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        daemons = child_processes(holder.pid)
        assert sorted(daemons.values()) == ["munged", "slurmctld", "slurmd"], daemons
    finally:
        holder.kill()
        holder.wait()
    assert wait_until_gone(daemons, 10) == [], daemons


def test_a_study_s_workers_run_as_a_job_array_until_its_budget_is_spent(slurm, tmp_path):
    """slurm/tune.sbatch as an array of 3 tasks, 2 at a time, one rank each: the tasks share 4 trials among them
    (the last task finds the budget spent, or takes what is left), each trial once, no lock left behind."""
    import csv

    import yaml

    from mpitrain.testing.datasets import make_digits_dataset
    make_digits_dataset(tmp_path / "data", validation_fraction=0.2)
    write_mlp_config(tmp_path / "base.yaml", "data", epochs=1)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "base": "base.yaml", "objective": {"metric": "validation.accuracy"}, "trials": 4, "sampler": "random",
        "pruner": "none", "space": {"optimizer.lr": {"float": [0.01, 0.1], "log": True}}}))
    submitted = slurm.run("sbatch", "--parsable", "--array=0-2%2", "--ntasks-per-node=1", f"{SLURM}/tune.sbatch",
                          "study.yaml", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    array = submitted.stdout.strip()
    states = [slurm.wait(f"{array}_{task}", 600, tmp_path) for task in range(3)]
    assert states == ["COMPLETED"] * 3, job_logs(tmp_path)
    with open(tmp_path / "study" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {row["state"] for row in rows} == {"complete"}, rows
    assert len({row["run_dir"] for row in rows}) == 4
    assert not glob.glob(str(tmp_path / "study" / "*.lock"))
    ran = [int(m) for log in glob.glob(str(tmp_path / f"slurm-mpitrain-tune-{array}_*.out"))
           for m in re.findall(r"this worker ran (\d+) trials", open(log).read())]
    assert len(ran) == 3 and sum(ran) == 4, job_logs(tmp_path)  # every task ended as a worker whose budget was spent
    assert {"history.png", "parallel.png", "report.png"} <= set(os.listdir(tmp_path / "study"))  # drawn by the tasks
