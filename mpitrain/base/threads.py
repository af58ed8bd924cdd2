"""Thread pools sized before they start: each rank on a node gets its share of the node's cores.

numba's parallel kernels (threading layer `omp`: GNU OpenMP) and OpenBLAS each create a pool
of threads when they load, sized by an environment variable read once at that moment
(`NUMBA_NUM_THREADS`, `OPENBLAS_NUM_THREADS`/`OMP_NUM_THREADS`) and by default one thread per
core of the node. Lowering the count afterwards (`numba.set_num_threads`, threadpoolctl) keeps
the pool: with two ranks on two cores each rank's idle OpenMP threads spin between kernels and
take the cores from the other rank's work and from MPI's progress; numba's pool alone did the
damage (docs/benchmarks.md#threads-per-rank-what-made-the-default-slow).

So `mpitrain/__init__.py` calls `thread_plan()` before anything imports numpy or numba:
the number of ranks on this node comes from the launcher's environment, and every pool
variable the user did not set gets `cores // ranks` (at least 1). The user's own values win;
a user's `OMP_NUM_THREADS` (what Spark sets for its Python workers: `spark.task.cpus`) is the
default for every pool. A user's value that is no count of threads (`0`, `-3`, `abc`) is replaced by the share
and named in the log line: numba's import would raise on it, on every rank. Nothing here imports numpy: it runs
first.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import sys
import warnings
from dataclasses import dataclass

log = logging.getLogger(__name__)

POOL_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
# What this process set, "VARIABLE=VALUE,...": a child process (a benchmark's or a script's mpiexec, the
# Spark driver's workers) inherits the values but, seeing them here, sizes its own pools instead of
# taking them for the user's choice.
SIZED_MARK = "MPITRAIN_SIZED_THREADS"
# Launchers and the variable each gives every rank: the number of ranks on its node. Checked in
# this order, so an MPI launcher started inside a Slurm allocation counts, not the allocation.
LOCAL_SIZE_VARIABLES = (
    ("MPICH Hydra", "MPI_LOCALNRANKS"),  # also Intel MPI, MVAPICH's mpiexec.hydra
    ("Open MPI", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MVAPICH", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PMIx", "PMIX_LOCAL_SIZE"),
)


@dataclass(frozen=True)
class ThreadPlan:
    """How many ranks share this node, who said so, and the threads each pool of this rank gets."""

    ranks_on_node: int
    launcher: str | None  # None: no launcher's environment found (1 rank assumed)
    cores: int  # the cores this process may run on
    threads: dict  # pool variable -> its value in this process's environment
    chosen_by_user: tuple  # the pool variables the user set
    ignored: tuple = ()  # "VARIABLE=VALUE" the user set that is no count of threads: replaced by the share

    def describe(self) -> str:
        """One line for the log."""
        source = f"from {self.launcher}" if self.launcher else "no MPI or Slurm launcher in the environment, so 1"
        user = f"; set by you: {', '.join(self.chosen_by_user)}" if self.chosen_by_user else ""
        ignored = f"; ignored: {', '.join(self.ignored)} (expected a whole number of threads >= 1)" \
            if self.ignored else ""
        return (f"threads: {self.ranks_on_node} rank(s) on this node ({source}), {self.cores} core(s): numba "
                f"{self.threads['NUMBA_NUM_THREADS']}, BLAS {self.threads['OPENBLAS_NUM_THREADS']} thread(s) per "
                f"rank{user}{ignored}")


def ranks_on_node(environ) -> tuple[int, str | None]:
    """The number of ranks on this node and the launcher that said so, from `environ` alone (1, None when none did).

    MPI launchers first (their variables name the ranks of this node directly), then `srun`'s
    step (SLURM_STEP_TASKS_PER_NODE such as "2(x3),1", this node's entry by SLURM_NODEID).
    """
    for launcher, variable in LOCAL_SIZE_VARIABLES:
        if _positive_int(environ.get(variable)):
            return int(environ[variable]), launcher
    tasks, node = environ.get("SLURM_STEP_TASKS_PER_NODE"), environ.get("SLURM_NODEID")
    if tasks and node is not None and node.isdigit():
        counts = []
        for entry in tasks.split(","):
            match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", entry.strip())
            if not match:
                return 1, None
            counts += [int(match[1])] * int(match[2] or 1)
        if int(node) < len(counts) and counts[int(node)] > 0:
            return counts[int(node)], "Slurm srun"
    return 1, None


def plan_threads(environ, cores: int) -> ThreadPlan:
    """What `size_thread_pools` sets in `environ` for a process that may run on `cores` cores.

    A variable counts as the user's when set to a whole number >= 1 and not marked as set by an ancestor's
    mpitrain (any other value of the user's is `ignored`). Each pool variable the user did not set gets the
    user's OMP_NUM_THREADS when that is one, else SLURM_CPUS_PER_TASK under srun (the cores Slurm gave each task),
    else cores // ranks on the node.
    """
    ranks, launcher = ranks_on_node(environ)
    sized = _sized_by_mpitrain(environ)
    given = tuple(v for v in POOL_VARIABLES if environ.get(v) and environ[v] != sized.get(v))
    chosen = tuple(v for v in given if _positive_int(environ[v]))
    if "OMP_NUM_THREADS" in chosen:
        share = int(environ["OMP_NUM_THREADS"])
    elif launcher == "Slurm srun" and _positive_int(environ.get("SLURM_CPUS_PER_TASK")):
        share = int(environ["SLURM_CPUS_PER_TASK"])
    else:
        share = max(1, cores // ranks)
    threads = {v: environ[v] if v in chosen else str(share) for v in POOL_VARIABLES}
    return ThreadPlan(ranks, launcher, cores, threads, chosen, tuple(f"{v}={environ[v]}" for v in given
                                                                     if v not in chosen))


def size_thread_pools(environ=os.environ) -> ThreadPlan:
    """Set the pool variables in `environ` (this process's, by default) before numba or a BLAS loads, and mark
    which ones mpitrain set (SIZED_MARK), so that child processes size their own.

    Called by `mpitrain/__init__.py`, so every entry point (the CLI, `python -m mpitrain`, the
    Spark executors that import mpitrain.etl, a script's `import mpitrain`) gets it. When numpy
    or numba was imported before mpitrain, their pools exist already: BLAS pools are lowered
    through threadpoolctl (harmless: BLAS pools did no damage), and a too-large numba pool gets a warning naming
    the fix.
    """
    plan = plan_threads(environ, len(os.sched_getaffinity(0)))
    environ.update(plan.threads)
    environ[SIZED_MARK] = ",".join(f"{v}={plan.threads[v]}" for v in POOL_VARIABLES if v not in plan.chosen_by_user)
    if environ is os.environ and ("numpy" in sys.modules or "numba" in sys.modules):
        _lower_started_pools(plan)
    return plan


@functools.cache
def thread_plan() -> ThreadPlan:
    """This process's plan: the first call sizes the pools (`size_thread_pools`), later calls give the same plan.
    `import mpitrain` makes the first call, before numpy or numba loads; `mpitrain.THREADS` is its plan."""
    return size_thread_pools()


def _lower_started_pools(plan: ThreadPlan) -> None:
    """Lower the pools that loaded before mpitrain to the plan's sizes (BLAS), or warn (numba)."""
    blas = int(plan.threads["OPENBLAS_NUM_THREADS"])
    from threadpoolctl import threadpool_info, threadpool_limits
    if any(pool["num_threads"] > blas for pool in threadpool_info() if pool["user_api"] == "blas"):
        threadpool_limits(blas, user_api="blas")
    if "numba" in sys.modules:
        import numba
        wanted = int(plan.threads["NUMBA_NUM_THREADS"])
        if numba.config.NUMBA_NUM_THREADS > wanted:
            numba.set_num_threads(wanted)
            warnings.warn(f"numba was imported before mpitrain, so its thread pool has "
                          f"{numba.config.NUMBA_NUM_THREADS} threads while {plan.ranks_on_node} rank(s) share this "
                          f"node's {plan.cores} cores; its idle threads slow every rank down. Import mpitrain before "
                          f"numba, or set NUMBA_NUM_THREADS={wanted} in the environment.", RuntimeWarning,
                          stacklevel=4)


def check_ranks_on_node(plan: ThreadPlan, local_size: int) -> None:
    """Compare the plan with the ranks MPI found on this node (`local_size`, from the communicator).

    A launcher mpitrain does not know leaves the plan at 1 rank: the pools are then too large.
    This lowers them as far as a running process can and warns, naming the variable to set.
    """
    if local_size == plan.ranks_on_node or plan.chosen_by_user:
        return
    share = max(1, plan.cores // local_size)
    log.warning("%d ranks share this node but the launcher's environment did not say so (%s): thread pools were "
                "sized for %d rank(s); set OMP_NUM_THREADS=%d and NUMBA_NUM_THREADS=%d before starting the ranks",
                local_size, ", ".join(v for _, v in LOCAL_SIZE_VARIABLES), plan.ranks_on_node, share, share)
    import numba
    from threadpoolctl import threadpool_limits
    threadpool_limits(share, user_api="blas")
    numba.set_num_threads(min(share, numba.config.NUMBA_NUM_THREADS))


def with_pools(environ, pools: dict) -> dict:
    """`environ` with its pool variables and mpitrain's mark replaced by `pools` (pool variable -> threads): a
    program started with it, and the processes it starts, take `pools` for the user's choice."""
    return {**{k: v for k, v in environ.items() if k not in (*POOL_VARIABLES, SIZED_MARK)}, **pools}


def users_environment(environ) -> dict:
    """`environ` as the user set it: without the pool variables mpitrain's import set in it (SIZED_MARK) and the
    mark. For a process that imported mpitrain and starts another program (a benchmark's PyTorch peer), which
    would take them for the user's."""
    sized = _sized_by_mpitrain(environ)
    return {k: v for k, v in environ.items() if k != SIZED_MARK and not (k in sized and sized[k] == v)}


def _sized_by_mpitrain(environ) -> dict:
    """The pool variables an ancestor process's mpitrain set (SIZED_MARK), with their values."""
    return dict(item.split("=", 1) for item in environ.get(SIZED_MARK, "").split(",") if "=" in item)


def _positive_int(value) -> bool:
    return bool(value) and value.isdigit() and int(value) > 0
