"""A study's worker: one MPI job that takes trials until the study's budget is spent.

    mpiexec -n 2 mpitrain tune-worker studies/digits       # a study folder, or its study file
    srun mpitrain tune-worker studies/digits.yaml           # one task of slurm/tune.sbatch's array

`run_worker` is a collective. Rank 0 alone talks to the study (`mpitrain.tune.storage`): it takes a trial and
broadcasts its number, parameters and run directory; every rank trains the trial with `mpitrain.train`, an
ordinary run in the study folder. After each epoch rank 0 reports the objective to the trial and broadcasts the
pruner's decision, so every rank stops at the same epoch (`Pruned`, raised on all of them). Rank 0 then tells
the study the result, records the trial's parameters and objective in its run's TensorBoard events (with
the tensorboard package), and writes the study's results (`mpitrain.tune.results`).

A trial's own user error (training diverged, a value its model cannot take) fails that trial, with its line
recorded, and the worker goes on. A stop by SIGTERM or SIGUSR1 (preemption) fails the trial for a retry, which
resumes from the checkpoint the stop wrote, and ends the worker with exit 3 like `mpitrain train`.
"""
from __future__ import annotations

import contextlib
import logging

from optuna.trial import TrialState

from mpitrain.base.errors import MpitrainError
from mpitrain.rundir import tensorboard
from mpitrain.training.loop import train
from mpitrain.training.preemption import Stopped
from mpitrain.tune import storage
from mpitrain.tune.results import write_results
from mpitrain.tune.studyfile import load_study

log = logging.getLogger("mpitrain")


class Pruned(Exception):
    """Raised on every rank after the epoch at which the pruner stopped a trial."""


def run_worker(path: str, comm, plots: bool = True) -> int:
    """Take and train trials of the study at `path` until none is left (a collective); the trials this worker
    ran. At its end rank 0 writes the results, and with `plots` the study's plots (`mpitrain tune` draws them once
    itself, after all its workers ended)."""
    study = load_study(path)
    optuna_study = None
    with comm.agreed_errors():
        if comm.is_root:
            optuna_study = storage.open_study(study, create=True)
    ran = 0
    while True:
        taken = storage.take_trial(study, optuna_study) if comm.is_root else None
        trial = taken and taken[0]
        assignment = comm.bcast_obj(taken and (trial.number, trial.params, taken[1]))
        if assignment is None:
            break
        number, params, run_dir = assignment
        run_trial(study, optuna_study, trial, number, params, run_dir, comm)
        ran += 1
    with comm.agreed_errors():  # a results file that cannot be written is an error on every rank
        if comm.is_root:
            write_results(study, optuna_study, plots=plots)
    return ran


def run_trial(study, optuna_study, trial, number: int, params: dict, run_dir: str, comm) -> None:
    """Train one trial on every rank; rank 0 reports each epoch, beats its heartbeat and tells the study how the
    trial ended."""
    if comm.is_root:
        log.info("trial %d: %s (run directory %s)", number, params, run_dir)
        trial.set_user_attr("run_dir", run_dir)
        trial.set_user_attr("ranks", comm.size)
    try:
        with storage.Heartbeat(study, trial) if comm.is_root else contextlib.nullcontext():
            state, value = _train_trial(study, trial, number, params, run_dir, comm)
    except Stopped:
        if comm.is_root:
            trial.set_user_attr(storage.REASON, "stopped by a signal; retried from its checkpoint")
            storage.fail_and_retry(study, optuna_study, storage.frozen(optuna_study, number))
        raise
    with comm.agreed_errors():
        if comm.is_root:
            optuna_study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)
            if value is not None and tensorboard.available():
                events = tensorboard.EventWriter(run_dir, steps_per_epoch=1)
                events.hparams(params, {f"hparam/{study.objective.split}.{study.objective.metric}": value})
                events.close()
            log.info("trial %d %s%s", number, state.name.lower(),
                     f": {study.objective.split}.{study.objective.metric} {value:.6g}" if value is not None else "")
            write_results(study, optuna_study, plots=False)


def _train_trial(study, trial, number: int, params: dict, run_dir: str, comm) -> tuple:
    """(state, objective) of one trial trained on every rank: COMPLETE with the last epoch's value, PRUNED with
    the value of the epoch the pruner stopped it at, or FAIL (a user error of the trial's own, recorded)."""
    reported = {}

    def report(epoch: int, record: dict) -> None:
        decision = None
        if comm.is_root:
            reported["value"] = record[f"test_{study.objective.metric}"]
            trial.report(reported["value"], epoch)
            decision = trial.should_prune()
        if comm.bcast_obj(decision):
            raise Pruned(f"trial {number} pruned after epoch {epoch + 1} on rank {comm.rank}")

    try:
        summary = train(study.trial_config(params, run_dir), comm, on_epoch=report)
        return TrialState.COMPLETE, summary[f"test_{study.objective.metric}"]
    except Pruned as e:
        log.warning("%s", e)
        return TrialState.PRUNED, reported.get("value")
    except Stopped:
        raise
    except MpitrainError as e:
        if comm.is_root:
            log.warning("trial %d failed: %s", number, e)
            trial.set_user_attr(storage.REASON, str(e))
        return TrialState.FAIL, None
