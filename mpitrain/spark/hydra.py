"""MPICH's Hydra with its manual launcher: `mpiexec -launcher manual` starts no process itself but prints one
`hydra_pmi_proxy` command line per host, and the job forms once each host runs its own (the MPI launcher's
own mechanism, as `-launcher ssh` would run them over ssh). Other MPIs have no such launcher (Open MPI's
`mpirun` has none): `check_manual_launcher` says which work.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from mpitrain.base.errors import MpitrainError

LAUNCH, LAUNCH_END = "HYDRA_LAUNCH:", "HYDRA_LAUNCH_END"
WORKING_MPIS = "MPICH's Hydra mpiexec (pip's `mpich`, MPICH >= 3, Intel MPI's and MVAPICH's mpiexec.hydra)"


@dataclass(frozen=True)
class Placement:
    """Where the ranks run: `hosts[k]` runs `counts[k]` ranks (ranks numbered host by host, in this order)
    and its proxy is started by task `proxy_tasks[k]`, the first task on that host."""

    hosts: tuple[str, ...]
    counts: tuple[int, ...]
    proxy_tasks: tuple[int, ...]

    @classmethod
    def of_tasks(cls, task_hosts: list[str]) -> Placement:
        """One rank per task, hosts in the order of their first task (task 0's host first, so rank 0 runs beside
        mpiexec)."""
        hosts = list(dict.fromkeys(task_hosts))
        return cls(tuple(hosts), tuple(task_hosts.count(h) for h in hosts),
                   tuple(task_hosts.index(h) for h in hosts))

    def ranks_of_host(self, host: str) -> range:
        k = self.hosts.index(host)
        return range(sum(self.counts[:k]), sum(self.counts[:k + 1]))

    def host_of_rank(self, rank: int) -> str:
        return next(host for host in self.hosts if rank in self.ranks_of_host(host))


def find_mpiexec(chosen: str | None = None) -> str:
    """`chosen`, else the mpiexec beside this Python (pip's mpich installs it there), else the first on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = chosen or (beside if os.access(beside, os.X_OK) else shutil.which("mpiexec"))
    if not found:
        raise MpitrainError(f"no mpiexec beside {sys.executable} or on PATH; install MPICH (pip install mpich) "
                            "or pass --mpiexec")
    return found


def check_manual_launcher(mpiexec: str) -> None:
    """Refuse an mpiexec that is not Hydra with the manual launcher, naming the MPIs that work."""
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MpitrainError(f"{mpiexec}: cannot run it ({e}); expected {WORKING_MPIS}") from None
    launchers = [line.split(":", 1)[1].split() for line in version.splitlines() if "Launchers available" in line]
    if "HYDRA" not in version or not launchers or "manual" not in launchers[0]:
        first = version.strip().splitlines()[0] if version.strip() else "no version"
        raise MpitrainError(f"{mpiexec} ({first}) has no manual launcher, which Spark training needs to start the "
                            f"MPI job from Spark's tasks; use {WORKING_MPIS}")


def launcher_command(mpiexec: str, placement: Placement, workdir: str, program: list[str]) -> list[str]:
    """`mpiexec -launcher manual` for `program` on the placement's hosts, run in `workdir`, proxies calling
    back to the first host (the one task 0, which runs this, is on)."""
    hosts = ",".join(f"{host}:{count}" for host, count in zip(placement.hosts, placement.counts))
    return [mpiexec, "-launcher", "manual", "-localhost", placement.hosts[0], "-hosts", hosts,
            "-n", str(sum(placement.counts)), "-wdir", workdir, *program]


def read_proxy_commands(lines) -> list[list[str]]:
    """The proxy command lines mpiexec prints, one per host in `-hosts` order, read from its output up to the
    end marker; an error naming what mpiexec printed instead."""
    commands, seen = [], []
    for line in lines:
        if line.startswith(LAUNCH):
            commands.append(line[len(LAUNCH):].split())
        elif line.strip() == LAUNCH_END:
            return commands
        else:
            seen.append(line.rstrip())
    raise MpitrainError("mpiexec -launcher manual ended without printing its proxy commands: "
                        + (" | ".join(seen[-5:]) or "no output"))
