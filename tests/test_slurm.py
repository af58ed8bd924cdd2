"""The slurm/ scripts on a real one-node Slurm cluster that this file starts and stops.

The `slurm` fixture writes a slurm.conf (free ports; state, spool, logs and pid files in a
temporary folder), a munge key, and starts munged, slurmctld and slurmd as plain processes
(no systemd), all as root; at the end it cancels what is left in the queue and stops the
daemons by their PIDs, also when a test failed. Debian's packages: `make slurm`.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

from conftest import make_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLURM = os.path.join(REPO, "slurm")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


class Cluster:
    """A running one-node cluster: its folder, and the environment that points Slurm's commands at it."""

    def __init__(self, root: str):
        self.root = root
        self.env = {**os.environ, "SLURM_CONF": os.path.join(root, "slurm.conf"), "PYTHONUNBUFFERED": "1"}
        if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(REPO, ".venv")):
            self.env["MPITRAIN_VENV"] = sys.prefix  # the scripts' default is the checkout's .venv

    def run(self, *args, cwd=None, timeout: float = 30, env=None) -> subprocess.CompletedProcess:
        return subprocess.run(list(map(str, args)), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**self.env, **(env or {})})

    def job_field(self, job: str, field: str) -> str:
        """A field of `scontrol show job`, e.g. JobState or StartTime (ISO times compare as strings)."""
        out = self.run("scontrol", "show", "job", "-o", job).stdout
        return re.search(rf"\b{field}=(\S+)", out).group(1)

    def job_state(self, job: str) -> str:
        return self.job_field(job, "JobState")

    def wait(self, job: str, timeout: float, folder) -> str:
        """Poll until `job` has ended; return its final state (fail on a timeout, showing the queue and logs)."""
        deadline = time.monotonic() + timeout
        while (state := self.job_state(job)) not in ENDED:
            if time.monotonic() > deadline:
                jobs = self.run("scontrol", "show", "job", "-o").stdout
                self.run("scancel", job)
                pytest.fail(f"job {job} still {state} after {timeout:.0f} s\n{jobs}\n{_job_logs(folder)}")
            time.sleep(0.5)
        return state

    def queue(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").stdout.split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(root: str) -> None:
    node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    node = re.sub(r"^NodeName=\S+", "NodeName=localhost", node)
    settings = {
        "ClusterName": "mpitrain-test", "SlurmctldHost": "localhost", "SlurmUser": "root", "SlurmdUser": "root",
        "SlurmctldPort": _free_port(), "SlurmdPort": _free_port(),
        "AuthType": "auth/munge", "CredType": "cred/munge", "AuthInfo": f"socket={root}/run/munge.socket",
        "StateSaveLocation": f"{root}/state", "SlurmdSpoolDir": f"{root}/spool",
        "SlurmctldPidFile": f"{root}/run/slurmctld.pid", "SlurmdPidFile": f"{root}/run/slurmd.pid",
        "SlurmctldLogFile": f"{root}/log/slurmctld.log", "SlurmdLogFile": f"{root}/log/slurmd.log",
        # No cgroups (a container has none to give): Linux process tracking, no task binding.
        "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
        "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_Core",
        "JobAcctGatherType": "jobacct_gather/none", "AccountingStorageType": "accounting_storage/none",
        "MpiDefault": "none", "ReturnToService": 2, "MinJobAge": 600, "KillWait": 3, "InactiveLimit": 0,
    }
    with open(os.path.join(root, "slurm.conf"), "w") as f:
        f.writelines(f"{key}={value}\n" for key, value in settings.items())
        f.write(f"{node}\nPartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n")


@pytest.fixture(scope="session")
def slurm():
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]
    if missing:
        message = f"Slurm not installed ({', '.join(missing)} missing): make slurm"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons run as root")
    # Not under pytest's private 0700 folder: munged wants its socket's folders open to all.
    root = tempfile.mkdtemp(prefix="mpitrain-slurm-")
    os.chmod(root, 0o755)
    for sub, mode in (("munge", 0o700), ("run", 0o755), ("state", 0o755), ("spool", 0o755), ("log", 0o755)):
        os.makedirs(os.path.join(root, sub), mode=mode)
    with open(os.path.join(root, "munge", "munge.key"), "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(os.path.join(root, "munge", "munge.key"), 0o400)
    _write_config(root)
    cluster = Cluster(root)
    commands = [
        ["munged", "--foreground", f"--socket={root}/run/munge.socket", f"--key-file={root}/munge/munge.key",
         f"--pid-file={root}/run/munged.pid", f"--seed-file={root}/munge/munged.seed",
         f"--log-file={root}/log/munged.log"],
        ["slurmctld", "-D", "-i"],
        ["slurmd", "-D"],
    ]
    daemons = []
    try:
        for cmd in commands:
            with open(os.path.join(root, "log", f"{cmd[0]}.out"), "w") as out:
                daemons.append(subprocess.Popen(cmd, env=cluster.env, stdout=out, stderr=subprocess.STDOUT))
            if cmd[0] == "munged":
                _wait_for(lambda: os.path.exists(f"{root}/run/munge.socket"), 20, "munged's socket", root)
        _wait_for(lambda: cluster.run("sinfo", "-h", "-n", "localhost", "-o", "%T").stdout.strip() == "idle",
                  60, "the node to be idle in sinfo", root)
        yield cluster
    finally:
        jobs = cluster.queue() if daemons else []
        if jobs:  # slurmstepd outlives slurmd: end the jobs first
            cluster.run("scancel", *jobs)
            _wait_for(lambda: not cluster.queue(), 30, "cancelled jobs to leave the queue", root, fail=False)
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(ready, timeout: float, what: str, root: str, fail: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            if fail:
                logs = "\n".join(f"--- {path}\n{open(path).read()[-3000:]}"
                                 for path in sorted(glob.glob(os.path.join(root, "log", "*"))))
                pytest.fail(f"no {what} after {timeout:.0f} s\n{logs}")
            return
        time.sleep(0.25)


def _failed_in_mpi_init(folder, job: str) -> bool:
    """Whether training job `job` died inside MPI_Init, before any mpitrain code ran: pip MPICH under
    srun --mpi=pmi2 does now and then on this kind of host (UCX, pmodels/mpich#7417)."""
    log = os.path.join(folder, f"slurm-mpitrain-train-{job}.out")
    return os.path.exists(log) and "Fatal error in internal_Init_thread" in open(log).read()


def _job_logs(folder) -> str:
    return "\n".join(f"--- {path}\n{open(path).read()[-4000:]}" for path in sorted(glob.glob(f"{folder}/slurm-*.out")))


def _write_mlp_config(path, data_path: str, epochs: int, **sections) -> None:
    config = {
        "data": {"path": data_path},
        "model": {"layers": [{"type": "dense", "units": 32, "activation": "relu"}, {"type": "dense", "units": 10}]},
        "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9},
        "train": {"epochs": epochs, "batch_size": 16, "seed": 1, "log_every": 1000},
        "sync": {"mode": "allreduce"},
        "report": False,
        **sections,
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)


def test_pipeline_runs_etl_then_training(slurm, tmp_path):
    """slurm/pipeline.sh: Spark ETL of digits in one job, then 2-rank training after it (afterok)."""
    _write_mlp_config(tmp_path / "digits.yaml", "elsewhere", epochs=3)  # the pipeline points it at the ETL's output
    submitted = slurm.run(f"{SLURM}/pipeline.sh", "--source", "digits:", "--out", "data/digits", "--shards", 2,
                          "--", "digits.yaml", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    jobs = dict(re.findall(r"^(etl|train) job (\d+)$", submitted.stdout, re.MULTILINE))
    assert set(jobs) == {"etl", "train"}, submitted.stdout

    for _ in range(3):
        if not (slurm.wait(jobs["train"], 600, tmp_path) == "FAILED" and _failed_in_mpi_init(tmp_path, jobs["train"])):
            break
        retry = slurm.run("sbatch", "--parsable", f"{SLURM}/train.sbatch", "digits.yaml", "--set",
                          "data.path=data/digits", cwd=tmp_path)
        jobs["train"] = retry.stdout.strip()
    assert slurm.wait(jobs["train"], 600, tmp_path) == "COMPLETED", _job_logs(tmp_path)
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
    _write_mlp_config(tmp_path / "digits.yaml", "elsewhere", epochs=1)
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
    _write_mlp_config(tmp_path / "long.yaml", "data", epochs=epochs, checkpoint={"every": 1, "unit": "epoch", "keep": 2})
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
            _wait_for(lambda: ready() or slurm.job_state(job) in ENDED, 300, "the job", slurm.root)
            if ready() or not _failed_in_mpi_init(tmp_path, job):
                return job
            slurm.wait(job, 60, tmp_path)
        return job

    first = start(lambda: glob.glob(f"{run_dir}/checkpoints/ckpt-*.h5"))
    assert slurm.run("scancel", first).returncode == 0
    # CANCELLED, or FAILED when the batch script sees its srun killed before slurmctld records the cancel
    assert slurm.wait(first, 60, tmp_path) in ("CANCELLED", "FAILED"), _job_logs(tmp_path)
    assert not (run_dir / "summary.json").exists(), "the job finished before it was cancelled"
    newest = sorted(glob.glob(f"{run_dir}/checkpoints/ckpt-*.h5"))[-1]
    epoch, step = map(int, re.search(r"ckpt-(\d+)-(\d+)", newest).groups())
    assert 1 <= epoch < epochs
    cancelled = (tmp_path / f"slurm-mpitrain-train-{first}.out").read_text()
    assert f"stopped by SIGTERM at epoch {epoch + 1} step {step}: wrote {newest}; resume with the same command" \
        in cancelled, cancelled
    assert slurm.job_field(first, "Restarts") == "0"  # a cancelled job is not requeued

    second = start(lambda: (run_dir / "summary.json").exists())
    assert slurm.wait(second, 300, tmp_path) == "COMPLETED", _job_logs(tmp_path)
    log = (tmp_path / f"slurm-mpitrain-train-{second}.out").read_text()
    assert f"resuming from {newest} at epoch {epoch + 1} step {step}" in log, log
    assert f"epoch {epoch + 1}/{epochs} " in log and f"epoch {epoch}/{epochs} " not in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == epochs and summary["ranks"] == 2
    finished = [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                if '"test_accuracy"' in line]
    assert sorted(set(finished)) == list(range(epochs)), finished  # the first job's epochs, then the resumed ones


def test_usr1_mid_epoch_checkpoints_requeues_and_ends_where_an_uninterrupted_run_does(slurm, tmp_path):
    """scancel --signal=USR1 reaches mpitrain's handler in every rank (the MPI library installs one of its own,
    which would let training go on): they checkpoint at that step, rank 0 requeues the job, it runs again,
    resumes and ends with the parameters of a run that was never interrupted, bit for bit. The ranks run under
    the venv's mpiexec inside the allocation, whose proxies (job steps) pass the signal on to them; srun's
    pmi2 start-up of pip MPICH fails now and then on this host (see _failed_in_mpi_init)."""
    make_dataset(tmp_path / "data", n_train=4000, n_test=200, shards=2, num_classes=10, shape=(1, 8, 8))
    epochs = 30
    _write_mlp_config(tmp_path / "long.yaml", "data", epochs=epochs, checkpoint={"every": 100, "unit": "epoch"},
                      train={"epochs": epochs, "batch_size": 16, "seed": 1, "log_every": 25})
    run_dir = tmp_path / "runs" / "long"
    for _ in range(3):
        job = slurm.run("sbatch", "--parsable", f"{SLURM}/train.sbatch", "long.yaml", cwd=tmp_path,
                        env={"MPITRAIN_LAUNCHER": "mpiexec"}).stdout.strip()
        metrics = run_dir / "metrics.jsonl"
        _wait_for(lambda: (metrics.exists() and '"kind": "window"' in metrics.read_text())
                  or slurm.job_state(job) in ENDED, 300, "the first metrics window", slurm.root)
        if not _failed_in_mpi_init(tmp_path, job):
            break
        slurm.wait(job, 60, tmp_path)
    assert slurm.run("scancel", "--signal=USR1", job).returncode == 0
    log = tmp_path / f"slurm-mpitrain-train-{job}.out"
    _wait_for(lambda: "requeued: it resumes" in log.read_text(), 120, "the stop and the requeue", slurm.root)
    # Slurm holds a requeued batch job for a while (its BeginTime); as the cluster's admin, start it now
    _wait_for(lambda: slurm.job_state(job) == "PENDING", 60, "the requeued job to be pending", slurm.root)
    assert slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now").returncode == 0
    state = slurm.wait(job, 300, tmp_path)
    if state == "FAILED" and _failed_in_mpi_init(tmp_path, job):  # the restart died in MPI_Init: resubmit it
        again = slurm.run("sbatch", "--parsable", f"{SLURM}/train.sbatch", "long.yaml", cwd=tmp_path,
                          env={"MPITRAIN_LAUNCHER": "mpiexec"}).stdout.strip()
        state = slurm.wait(again, 300, tmp_path)
    assert state == "COMPLETED", _job_logs(tmp_path)
    text = "".join(open(path).read() for path in sorted(glob.glob(f"{tmp_path}/slurm-*.out")))
    stopped = re.search(r"mpitrain train: stopped by SIGUSR1 at epoch (\d+) step (\d+): wrote (\S+); Slurm job "
                        rf"{job} requeued: it resumes from this checkpoint", text)
    assert stopped, text
    assert text.count("got SIGUSR1: training stops with a checkpoint at the next step boundary") == 2  # both ranks
    assert f"resuming from {stopped.group(3)} at epoch {stopped.group(1)} step {stopped.group(2)}" in text
    assert "(restart 1)" in log.read_text()

    reference = _run_uninterrupted(tmp_path, "long.yaml", "reference")
    assert summary_hashes(run_dir) == summary_hashes(reference)


def summary_hashes(run_dir) -> list:
    return json.loads((run_dir / "summary.json").read_text())["replica_hashes"]


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
    _write_mlp_config(tmp_path / "tiny.yaml", "data", epochs=1)
    result = slurm.run("srun", "--ntasks=2", "--mpi=none", os.path.join(sys.prefix, "bin", "mpitrain"), "train",
                       "tiny.yaml", cwd=tmp_path, timeout=60)
    assert result.returncode != 0
    assert result.stderr.count("srun started 2 tasks, but each sees an MPI world of 1 rank") == 2, result.stderr
    assert not (tmp_path / "runs").exists()
