"""The barrier task, run by each of the stage's N tasks on the executors: together they form one MPI job of
N ranks with Hydra's manual launcher (`hydra.py`).

1. Every task learns the stage's hosts (`BarrierTaskContext.getTaskInfos`): one rank per task, so a host
   runs as many ranks as it has tasks of the stage (`Placement`).
2. Task 0 starts `mpiexec -launcher manual`, reads the proxy command lines it prints and shares them with
   every task (`allGather`; every task calls it at the same points).
3. The first task on each host starts that host's `hydra_pmi_proxy`, which starts the host's ranks; the
   other tasks of the host only hold their slot (and its cores) until the job ends. On a GPU cluster
   (`spark.task.resource.gpu.amount=1`) the tasks share their GPU (`TaskContext.resources()`) in the same
   allGather, and the proxy's ranks see only their tasks' GPUs (`visible_devices`): the host's local rank i
   takes the i-th of them (`mpitrain.parallel.backend`), so each task's GPU serves exactly one rank.
4. Task 0 streams mpiexec's output (every rank's) to the driver and waits for mpiexec; the other tasks wait
   for their proxy, then all meet in a second allGather, so every task holds its slot until the job ended. A
   user error or a stop by signal (exit 2 or 3) is returned; any other end makes every task raise `JobFailed`
   naming the rank and host, which fails the stage.

mpiexec and the proxies run guarded (`processes.py`): a task that ends, however, takes them and the ranks with
it. They start with the ranks' thread pools in their environment (`MpiJob.threads`: spark.task.cpus threads
per rank unless the user set the executors' pool variables). No task waits on another but in an allGather,
which Spark ends when the stage fails.
"""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from mpitrain.base.threads import with_pools
from mpitrain.spark.hydra import Placement, find_mpiexec, launcher_command, read_proxy_commands
from mpitrain.spark.logstream import LineSender
from mpitrain.spark.processes import descendants, start_guarded, stop

RETURNED_STATUSES = (0, 2, 3)  # done; a user error (its one line is in the output); stopped by a signal, resumable
TAIL_LINES = 200  # mpiexec's last lines task 0 keeps
TAIL_REPORTED = 40  # of those, what every task gets to describe a failure from


class JobFailed(Exception):
    """The MPI job ended otherwise than by finishing, a user error or a stop: a rank raised, a rank or proxy
    was killed. The message is one line naming the rank and its host where the output tells them."""


@dataclass(frozen=True)
class MpiJob:
    """What every one of the `ranks` ranks runs (`python` arguments, given to the executor's own Python), where
    (`workdir`), with which mpiexec (None: the one `find_mpiexec` finds on the executor), where the output
    goes, and the ranks' thread pools (pool variable -> threads; `stage.rank_threads`)."""

    ranks: int
    python_args: tuple[str, ...]
    workdir: str
    log_address: tuple[str, int]
    mpiexec: str | None = None
    threads: dict[str, str] = field(default_factory=dict)


def run_barrier_task(job: MpiJob, _rows) -> list[tuple[int, int]]:
    """The body of each barrier task (`mapPartitions`): [(the task's index, the exit status of what it
    started)]."""
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    me = context.partitionId()
    infos = context.getTaskInfos()
    if len(infos) != job.ranks:  # a stage attempt that reran only some tasks cannot form the job
        raise JobFailed(f"this attempt of the barrier stage runs {len(infos)} of its {job.ranks} tasks")
    task_hosts = [info.address.rsplit(":", 1)[0] for info in infos]
    placement = Placement.of_tasks(task_hosts)
    started, watch = [], None
    environ = with_pools(os.environ, job.threads)
    try:
        if me == 0:
            command = launcher_command(find_mpiexec(job.mpiexec), placement, job.workdir,
                                       [sys.executable, *job.python_args])
            launcher = start_guarded(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=environ)
            started.append(launcher)
            proxies = read_proxy_commands(iter(launcher.stdout.readline, ""))
        shared = [json.loads(text) for text in context.allGather(json.dumps(
            {"proxies": proxies if me == 0 else None, "gpus": task_gpus(context)}))]
        proxies = shared[0]["proxies"]
        if me in placement.proxy_tasks:
            host = placement.proxy_tasks.index(me)
            devices = visible_devices(task_hosts, [task["gpus"] for task in shared], placement.hosts[host])
            proxy = start_guarded(proxies[host], env=environ if devices is None else
                                  {**environ, "CUDA_VISIBLE_DEVICES": devices})
            started.append(proxy)
            watch = RankWatch(proxy.pid, placement.counts[host])
        status, tail = _follow(launcher, job.log_address) if me == 0 else (None, [])
        proxy_status = proxy.wait() if watch else 0
        # Every task holds its slot, and its cores, until the job has ended. Task 0's report says how mpiexec
        # ended, the others' whose rank or proxy was killed; every task raises when the job failed, so none of
        # a failed attempt succeeds (a succeeded task of a barrier shuffle map stage may be left out of its
        # rerun, which then has too few tasks).
        report = {"status": status, "tail": tail[-TAIL_REPORTED:], "proxy_status": proxy_status,
                  "ranks": watch.stop() if watch else {}}
        reports = [json.loads(r) for r in context.allGather(json.dumps(report))]
        if reports[0]["status"] not in RETURNED_STATUSES:
            raise JobFailed(describe_failure(reports[0]["tail"], reports[0]["status"], placement, reports))
        return [(me, reports[0]["status"] if me == 0 else proxy_status)]
    finally:
        if watch:
            watch.stop()
        for process in reversed(started):
            stop(process)


def task_gpus(context) -> list[str]:
    """The addresses of the GPUs Spark gave this task (`spark.task.resource.gpu.amount`); [] without."""
    gpu = context.resources().get("gpu")
    return list(gpu.addresses) if gpu is not None else []


def visible_devices(task_hosts: list[str], task_gpus: list[list[str]], host: str) -> str | None:
    """CUDA_VISIBLE_DEVICES for `host`'s ranks: the GPU of each of its tasks, in task order; None (the ranks see the
    executor's GPUs, as under mpiexec) unless each of them has exactly one, the one-rank-per-GPU setting."""
    gpus = [task_gpus[task] for task, task_host in enumerate(task_hosts) if task_host == host]
    if not gpus or any(len(addresses) != 1 for addresses in gpus):
        return None
    return ",".join(addresses[0] for addresses in gpus)


class RankWatch:
    """{pid: rank} of the `expected` ranks a proxy starts (PMI_RANK in their environment), collected while they
    start, so that a rank Hydra reports killed (by pid and host only) can be named."""

    def __init__(self, guard_pid: int, expected: int):
        self.ranks: dict[str, int] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(guard_pid, expected), daemon=True)
        self._thread.start()

    def _run(self, guard_pid: int, expected: int) -> None:
        while len(self.ranks) < expected and not self._stopped.wait(0.5):
            for pid in descendants(guard_pid):
                rank = _pmi_rank(pid) if str(pid) not in self.ranks else None
                if rank is not None:
                    self.ranks[str(pid)] = rank

    def stop(self) -> dict[str, int]:
        """Stop watching; the ranks found."""
        self._stopped.set()
        self._thread.join()
        return self.ranks


def _pmi_rank(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return None
    rank = next((v[len(b"PMI_RANK="):] for v in environ if v.startswith(b"PMI_RANK=")), None)
    return int(rank) if rank is not None and rank.isdigit() else None


def _follow(launcher: subprocess.Popen, log_address) -> tuple[int, list[str]]:
    """Send mpiexec's output to the driver line by line until it ends; its exit status and last lines."""
    sender, tail = LineSender(log_address), collections.deque(maxlen=TAIL_LINES)
    try:
        for line in launcher.stdout:
            sender.send(line)
            tail.append(line.rstrip("\n"))
    finally:
        sender.close()
    return launcher.wait(), list(tail)


def describe_failure(tail: list[str], status: int, placement: Placement, reports: list[dict]) -> str:
    """One line on why the job ended, from the end of its output and the tasks' reports: the rank whose
    exception the abort hook printed (`[rank R] Error: ...`), else the rank Hydra saw killed (by its pid), else
    the proxy that was killed, else mpiexec's status and its exit string or last line."""
    raised = [m for m in map(re.compile(r"\[rank (\d+)\] (.*)").match, tail) if m]
    if raised:
        rank = int(raised[-1][1])
        return f"rank {rank} on {placement.host_of_rank(rank)} failed: {raised[-1][2]}"
    exit_string = next((line.split(":", 1)[1].strip() for line in tail if "EXIT STRING:" in line), "")
    ranks = {int(pid): rank for report in reports for pid, rank in report["ranks"].items()}
    for line in tail:
        killed = re.search(r"PID (\d+) RUNNING AT (\S+)", line)
        if killed and int(killed[1]) in ranks:
            return f"rank {ranks[int(killed[1])]} on {killed[2]} ended: {exit_string or 'bad termination'}"
    for task, report in enumerate(reports):
        if task in placement.proxy_tasks and report["proxy_status"] > 128:
            host = placement.hosts[placement.proxy_tasks.index(task)]
            return (f"the MPI proxy on {host} (ranks {', '.join(map(str, placement.ranks_of_host(host)))}) was "
                    f"killed by signal {report['proxy_status'] - 128}")
    last = exit_string or next((line.strip() for line in reversed(tail) if line.strip()), "no output")
    return f"mpiexec exited with status {status}: {last}"
