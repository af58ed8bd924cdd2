"""Launch concerns: how a job of ranks starts and how it ends when one rank fails.

    mpiexec -n 4 mpitrain train configs/fashion_mlp.yaml      # MPICH/Open MPI launcher
    srun --mpi=pmi2 mpitrain train configs/fashion_mlp.yaml   # Slurm, MPICH (pmix for Open MPI)

Three checks live here, apart from the collectives (`mpitrain.parallel.comm`): the abort hook that
turns one rank's uncaught exception into the end of the whole job, the srun world check
that refuses N tasks which each see a world of 1 rank, and the probe for an MPI library
that reads device memory itself (CUDA-aware). `mpitrain.parallel.comm` and this module are the
only ones that import mpi4py.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
import traceback

from mpi4py import MPI

from mpitrain.base.errors import MpitrainError


def install_abort_hook() -> None:
    """Turn an uncaught exception on any rank into MPI_Abort.

    Without this, the failing rank exits while the others wait forever in their next
    collective: the job hangs until the wall-clock limit instead of failing at once.
    """
    def hook(kind, value, tb):
        rank = MPI.COMM_WORLD.Get_rank()
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.rstrip().splitlines()))
        sys.stderr.flush()
        if MPI.COMM_WORLD.Get_size() > 1:
            time.sleep(0.5)  # let the launcher forward the traceback: Abort tears the job down, pipes and all
            abort_job()
        os._exit(1)

    sys.excepthook = hook


def abort_job() -> None:
    """End every rank of the job now (MPI_Abort on COMM_WORLD), and this process in any case.

    MPICH's MPI_Abort asks the process manager to end the job and returns; the manager's
    proxy on this node kills the ranks. With the node cut off from mpiexec (a network link
    down) no kill comes, so this rank ends itself instead of waiting on in a collective.
    """
    MPI.COMM_WORLD.Abort(1)
    os._exit(1)


# What each launcher tells its processes about their number, and what to do when MPI disagrees.
LAUNCHERS = (("SLURM_STEP_NUM_TASKS", "srun", "tasks", "srun's MPI plugin (--mpi={plugin}) does not match this MPI "
              "library; use srun --mpi=pmi2 for MPICH, --mpi=pmix for Open MPI, or mpiexec"),
             ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun", "processes", "mpi4py runs on another MPI library: call the "
              "mpiexec of the MPI mpi4py was built with (the venv's .venv/bin/mpiexec)"),
             ("PMI_SIZE", "an MPICH-family mpiexec", "processes", "mpi4py runs on another MPI library: call the "
              "mpiexec of the MPI mpi4py was built with (the venv's .venv/bin/mpiexec)"))


def check_srun_world(size: int) -> None:
    """Refuse to start when the launcher started several processes but MPI made each one a world of its own.

    That is what an srun `--mpi` plugin the MPI library does not speak gives, or another MPI's
    mpiexec: every process would train alone and all of them would write the same run directory.
    """
    if size != 1:
        return
    for variable, launcher, kind, advice in LAUNCHERS:
        started = os.environ.get(variable, "1")
        if started.isdigit() and int(started) > 1:
            raise MpitrainError(f"{launcher} started {started} {kind}, but each sees an MPI world of 1 rank: "
                                + advice.format(plugin=os.environ.get("SLURM_MPI_TYPE", "none")))


def cuda_aware_mpi() -> bool:
    """Whether the MPI library mpi4py loaded reads and writes device memory itself.

    Asks the library's `int MPIX_Query_cuda_support(void)` (Open MPI, MVAPICH2 and MPICH
    export it; 1 when built with CUDA and enabled at run time). mpi4py has no binding for
    it, so it is looked up with ctypes in the loaded libmpi; False when there is none.
    """
    for path in _loaded_mpi_libraries():
        query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
        if query is not None:
            query.restype = ctypes.c_int
            return query() == 1
    return False


def _loaded_mpi_libraries() -> list[str]:
    """Paths of the MPI libraries mapped into this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libmpi" in line and ".so" in line}
    except OSError:
        return []
    return sorted(paths)
