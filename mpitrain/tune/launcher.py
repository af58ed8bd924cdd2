"""`mpitrain tune STUDY.yaml --workers W --ranks R`: check the study, create it, run W workers at once on this
machine (each `mpiexec -n R mpitrain tune-worker STUDY --no-plots`), then write the results and the plots once, and
print the table.

    mpitrain tune studies/digits.yaml --workers 2 --ranks 2
    mpitrain tune studies/digits --status

The workers share nothing but the study folder, so the same study runs as a Slurm job array
(`slurm/tune.sbatch`) or as workers started by hand on several machines. SIGTERM or SIGINT to this command
goes on to every worker: each stops its trial with a checkpoint, and the same command continues the study.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

from mpitrain.base.errors import ConfigError
from mpitrain.tune.results import status_table, write_results
from mpitrain.tune.storage import open_study
from mpitrain.tune.studyfile import load_study


def mpiexec() -> str:
    """The mpiexec beside this Python (pip's MPICH), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        raise ConfigError("no mpiexec beside this Python or on PATH; install MPI (pip install 'mpitrain[mpich]')")
    return found


def run_study(path: str, workers: int, ranks: int) -> int:
    """Run `workers` workers of `ranks` ranks on the study at `path` until its budget is spent; the exit status
    (0, or the first failing worker's)."""
    if workers < 1 or ranks < 1:
        raise ConfigError(f"--workers {workers} --ranks {ranks}: expected at least one worker of at least one rank")
    study = load_study(path)
    open_study(study, create=True)  # before the workers: every one of them finds the study and its grid
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpitrain", "tune-worker", study.folder, "--no-plots"]
    jobs = [subprocess.Popen(command) for _ in range(workers)]

    def forward(signum, frame):
        for job in jobs:
            job.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        statuses = [job.wait() for job in jobs]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    optuna_study = open_study(study)
    write_results(study, optuna_study, plots=True)
    print(status_table(study, optuna_study))
    return next((status for status in statuses if status), 0)


def show_status(path: str) -> int:
    """Print the study's table (and rewrite its results) without running anything."""
    study = load_study(path)
    optuna_study = open_study(study)
    write_results(study, optuna_study, plots=True)
    print(status_table(study, optuna_study))
    return 0
