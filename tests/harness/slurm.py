"""A real Slurm for the tests: munged, slurmctld and one slurmd per node, started and stopped by the tests.

    with start_slurm() as slurm:                  # one node: this machine, named localhost
        slurm.run("sbatch", "--parsable", "slurm/train.sbatch", "config.yaml", cwd=folder)
    with SimulatedCluster(nodes=2) as cluster, start_slurm(cluster) as slurm:
        ...                                       # a slurmd in each simulated node (tests/harness/cluster.py)

`start_slurm` writes a slurm.conf (free ports; state, spool, logs and pid files in a temporary
folder), a munge key, and starts the daemons as plain processes (no systemd), all as root. On a
simulated cluster, munged and slurmctld stay in the root namespace: munged's socket is a file,
which every node's processes reach, and slurmctld is at the bridge's address in every node
(SlurmctldHost=localhost(ADDRESS)). Each slurmd runs inside its node (network namespace, hosts
file, host name = node name, by which it finds its NodeName line), with a spool folder of its
own (`%n` in slurm.conf) and its node's address as NodeAddr; the jobs' processes (slurmstepd,
the batch script, srun's tasks) descend from it and so run inside the node too. At the end it
cancels what is left in the queue and stops the daemons by their PIDs, also when a test failed;
a simulated cluster's close kills whatever is left in its nodes. Debian's packages: `make slurm`.
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
from contextlib import contextmanager

import pytest
import yaml

from mpitrain.testing.launch import REPO, die_with_parent

SLURM = os.path.join(REPO, "slurm")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


class SlurmCluster:
    """A running Slurm: its folder, its nodes, and the environment that points Slurm's commands at it."""

    def __init__(self, root: str, nodes: list[str]):
        self.root, self.nodes = root, nodes
        self.daemons: list[subprocess.Popen] = []  # munged, slurmctld, then each node's slurmd
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
                pytest.fail(f"job {job} still {state} after {timeout:.0f} s\n{jobs}\n{job_logs(folder)}")
            time.sleep(0.5)
        return state

    def queue(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def idle(self) -> bool:
        """Whether every node has registered and is idle."""
        states = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return dict(zip(states[::2], states[1::2])) == {node: "idle" for node in self.nodes}


def require_slurm() -> None:
    """Skip without Slurm's daemons and commands, or when not root; under CI=true a missing Slurm is a failure."""
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]
    if missing:
        message = f"Slurm not installed ({', '.join(missing)} missing): make slurm"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons run as root")


@contextmanager
def start_slurm(cluster=None):
    """Start Slurm on this machine as node `localhost`, or with a slurmd in each node of simulated `cluster`;
    yield a SlurmCluster once every node is idle; cancel its jobs and stop its daemons on the way out."""
    require_slurm()
    # Not under pytest's private 0700 folder: munged wants its socket's folders open to all.
    root = tempfile.mkdtemp(prefix="mpitrain-slurm-")
    os.chmod(root, 0o755)
    nodes = cluster.nodes if cluster else ["localhost"]
    slurm = SlurmCluster(root, nodes)
    daemons = slurm.daemons
    try:
        _make_folders(root, nodes)
        _write_config(root, dict(zip(cluster.nodes, cluster.hosts)) if cluster else {"localhost": None},
                      f"{cluster.subnet}.254" if cluster else None)
        daemons.append(_start(root, "munged", _munged_command(root), slurm.env))
        wait_for(lambda: os.path.exists(f"{root}/run/munge.socket"), 20, "munged's socket", root)
        daemons.append(_start(root, "slurmctld", ["slurmctld", "-D", "-i"], slurm.env))
        for node in nodes:
            daemons.append(_start(root, f"slurmd-{node}",
                                  cluster.node_command(node, "slurmd", "-D") if cluster else ["slurmd", "-D"],
                                  slurm.env))
        wait_for(slurm.idle, 60, "every node idle in sinfo", root)
        yield slurm
    finally:
        jobs = slurm.queue() if daemons else []
        if jobs:  # slurmstepd outlives slurmd: end the jobs first
            slurm.run("scancel", *jobs)
            wait_for(lambda: not slurm.queue(), 30, "cancelled jobs to leave the queue", root, fail=False)
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        shutil.rmtree(root, ignore_errors=True)


def _make_folders(root: str, nodes: list[str]) -> None:
    """The folders the daemons write to (a spool folder per node), and munge's key."""
    for sub, mode in (("munge", 0o700), ("run", 0o755), ("state", 0o755), ("log", 0o755)):
        os.makedirs(os.path.join(root, sub), mode=mode)
    for node in nodes:
        os.makedirs(os.path.join(root, "spool", node), mode=0o755)
    with open(os.path.join(root, "munge", "munge.key"), "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(os.path.join(root, "munge", "munge.key"), 0o400)


def _munged_command(root: str) -> list[str]:
    return ["munged", "--foreground", f"--socket={root}/run/munge.socket", f"--key-file={root}/munge/munge.key",
            f"--pid-file={root}/run/munged.pid", f"--seed-file={root}/munge/munged.seed",
            f"--log-file={root}/log/munged.log"]


def _start(root: str, name: str, command: list[str], env: dict) -> subprocess.Popen:
    """Start a daemon in the foreground, its output in log/NAME.out. It dies with the process that started it
    (`die_with_parent`): a test run killed by SIGKILL, which no `finally` survives, leaves no daemon behind."""
    with open(os.path.join(root, "log", f"{name}.out"), "w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(root: str, nodes: dict[str, str | None], controller: str | None) -> None:
    """slurm.conf for `nodes` (name: address, None for the name itself), each with this machine's CPUs and
    memory (`slurmd -C`), and slurmctld on this machine, reached at `controller` when it is an address."""
    hardware = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    hardware = re.sub(r"^NodeName=\S+ ", "", hardware)
    settings = {
        "ClusterName": "mpitrain-test", "SlurmctldHost": f"localhost({controller})" if controller else "localhost",
        "SlurmUser": "root", "SlurmdUser": "root", "SlurmctldPort": _free_port(), "SlurmdPort": _free_port(),
        "AuthType": "auth/munge", "CredType": "cred/munge", "AuthInfo": f"socket={root}/run/munge.socket",
        "StateSaveLocation": f"{root}/state", "SlurmdSpoolDir": f"{root}/spool/%n",
        "SlurmctldPidFile": f"{root}/run/slurmctld.pid", "SlurmdPidFile": f"{root}/run/slurmd-%n.pid",
        "SlurmctldLogFile": f"{root}/log/slurmctld.log", "SlurmdLogFile": f"{root}/log/slurmd-%n.log",
        # No cgroups (a container has none to give): Linux process tracking, no task binding.
        "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
        "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_Core",
        "JobAcctGatherType": "jobacct_gather/none", "AccountingStorageType": "accounting_storage/none",
        "MpiDefault": "none", "ReturnToService": 2, "MinJobAge": 600, "InactiveLimit": 0,
        # Slurm's default grace between a cancel's SIGTERM and SIGKILL. At 3 s a busy 2-core CI machine killed
        # the ranks after they wrote their stop checkpoint but before they said so; processes that obey the
        # signal exit long before 30 s, so the tests wait no longer for it.
        "KillWait": 30,
    }
    with open(os.path.join(root, "slurm.conf"), "w") as f:
        f.writelines(f"{key}={value}\n" for key, value in settings.items())
        f.writelines(f"NodeName={node}{f' NodeAddr={address}' if address else ''} {hardware}\n"
                     for node, address in nodes.items())
        f.write(f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP\n")
    if controller:
        # In a simulated node /sys is the node's own (ip netns exec mounts a fresh sysfs), without the
        # machine's cgroup file systems, so slurmd's cgroup autodetection fails. cgroup/v1 loads without
        # them, and nothing here uses cgroups (proctrack/linuxproc, task/none).
        with open(os.path.join(root, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\n")


def wait_for(ready, timeout: float, what: str, root: str, fail: bool = True) -> None:
    """Poll `ready()` until it is true; after `timeout` seconds fail, showing the daemons' logs (or just return)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            if fail:
                logs = "\n".join(f"--- {path}\n{open(path).read()[-3000:]}"
                                 for path in sorted(glob.glob(os.path.join(root, "log", "*"))))
                pytest.fail(f"no {what} after {timeout:.0f} s\n{logs}")
            return
        time.sleep(0.25)


def failed_in_mpi_init(folder, job: str) -> bool:
    """Whether training job `job` died inside MPI_Init, before any mpitrain code ran: pip MPICH under
    srun --mpi=pmi2 does now and then on this kind of host (UCX, pmodels/mpich#7417)."""
    log = os.path.join(folder, f"slurm-mpitrain-train-{job}.out")
    return os.path.exists(log) and "Fatal error in internal_Init_thread" in open(log).read()


def job_logs(folder) -> str:
    return "\n".join(f"--- {path}\n{open(path).read()[-4000:]}" for path in sorted(glob.glob(f"{folder}/slurm-*.out")))


def write_mlp_config(path, data_path: str, epochs: int, **sections) -> None:
    """A small MLP config for 10 classes of 8x8 (digits) at `data_path`; keyword arguments replace sections."""
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


def summary_hashes(run_dir) -> list:
    return json.loads((run_dir / "summary.json").read_text())["replica_hashes"]
