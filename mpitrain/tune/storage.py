"""A study's folder on the shared file system, and the one place that hands out its trials.

    STUDY/study.yaml        the checked study file, absolute paths (what workers read)
    STUDY/journal.log       Optuna's journal: every trial, parameter, report and state, appended
    STUDY/journal.log.lock  present only while a process appends to the journal (Optuna's JournalFileOpenLock)
    STUDY/budget.lock       present only while a worker takes a trial (the same kind of lock)
    STUDY/results.lock      present only while a worker writes the results (`mpitrain.tune.results`)
    STUDY/trials/trial-NNNN an ordinary run directory per trial (config.yaml, checkpoints/, metrics.jsonl, ...)

No server: Optuna's JournalStorage over JournalFileBackend appends JSON lines under a lock file made with
`open(O_CREAT | O_EXCL)`, which NFSv3 and later and Lustre make atomic across nodes (flock is not reliable on
every NFS mount); a lock left by a process that died is broken after its grace period (30 s). Taking a trial
(reaping stale trials, counting the budget, `study.ask`) happens under STUDY/budget.lock, so two workers never
take one trial, the budget is never overrun, and a grid's points, enqueued once when the study is created, are
each run once however many workers there are.

A running trial's rank 0 writes a heartbeat (a trial user attribute, the time) every `heartbeat_s` / 3
seconds; a RUNNING trial whose heartbeat is older than `heartbeat_s` belongs to a worker that died (SIGKILL, a
node lost): the next worker to take a trial marks it failed and enqueues its parameters again with Optuna's
RetryHeartbeatStaleTrialCallback (up to `retries` times), which JournalStorage, having no heartbeat of its own,
does not call itself. The retry trains in the run directory of the trial it retries, so it resumes from that
trial's newest checkpoint.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

from mpitrain.base.errors import ConfigError
from mpitrain.base.files import write_file
from mpitrain.data.storage import sha256_of
from mpitrain.training.watchdog import Periodic
from mpitrain.tune.studyfile import STUDY_FILE, Study, changed_keys, grid_values, load_study, study_yaml

STUDY_NAME = "study"
HEARTBEAT = "heartbeat"   # trial user attribute: time.time() of the last beat
REASON = "failure"        # trial user attribute: why a trial failed, in a line
BASE_SHA256 = "base_sha256"  # study user attribute: the base config file's sha256 when the study began


def journal_path(folder: str) -> str:
    return os.path.join(folder, "journal.log")


def trial_run_dir(folder: str, trial) -> str:
    """The run directory of `trial` (a FrozenTrial): the first trial's of its retries (`retried_trial_number`), so
    a retry resumes from the checkpoints of the attempt it replaces."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    original = RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)
    return os.path.join(folder, "trials", f"trial-{trial.number if original is None else original:04d}")


def _lock(path: str, grace_s: int = 30):
    from optuna.storages.journal import JournalFileOpenLock
    return JournalFileOpenLock(path, grace_period=grace_s)


@contextmanager
def locked(path: str, grace_s: int = 30):
    """Hold the lock file `path`.lock while the block runs (Optuna's O_EXCL lock: see the module docstring); a
    lock file older than `grace_s` seconds is taken as left by a process that died, so the block must be
    shorter."""
    lock = _lock(path, grace_s)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def open_study(study: Study, create: bool = False):
    """The Optuna study of `study`'s folder; with `create`, make the folder, record study.yaml and create the study
    (a grid's points enqueued, the base config's sha256 recorded) if it is not there. A study.yaml recorded with
    other keys than `trials`, or a base config changed since, is refused: a study keeps its space, objective,
    algorithms and base for all its trials."""
    import optuna

    folder = study.folder
    recorded_path = os.path.join(folder, STUDY_FILE)
    if not create and not os.path.exists(journal_path(folder)):
        raise ConfigError(f"{folder}: no study here (no journal.log); start it with `mpitrain tune STUDY.yaml`")
    os.makedirs(folder, exist_ok=True)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        journal_path(folder), lock_obj=_lock(journal_path(folder))))
    with locked(os.path.join(folder, "budget")):
        if create:
            if os.path.exists(recorded_path) and os.path.abspath(study.path) != os.path.abspath(recorded_path):
                changed = changed_keys(load_study(recorded_path), study)
                if changed:
                    raise ConfigError(f"{study.path}: {changed[0]} differs from the study in {folder} (its "
                                      f"{STUDY_FILE}); a study keeps its keys but `trials`: use another folder "
                                      "(the `folder` key) for another study")
            write_file(recorded_path, lambda f: f.write(study_yaml(study)))
        names = [summary.study_name for summary in optuna.get_all_study_summaries(storage)]
        if STUDY_NAME not in names:
            optuna_study = optuna.create_study(study_name=STUDY_NAME, storage=storage, sampler=sampler(study),
                                               pruner=pruner(study), direction=study.objective.direction)
            optuna_study.set_user_attr(BASE_SHA256, file_sha256(study.base))
            for point in study.grid[:study.trials]:
                optuna_study.enqueue_trial(point)
            return optuna_study
        optuna_study = optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler(study),
                                         pruner=pruner(study))
        if create and optuna_study.user_attrs.get(BASE_SHA256) != file_sha256(study.base):
            raise ConfigError(f"{study.base}: changed since the study in {folder} began (its sha256 is recorded); "
                              "its trials would not compare: put the old file back, or start another study (the "
                              "`folder` key)")
        return optuna_study


def file_sha256(path: str) -> str:
    """The sha256 of the file at `path` (`mpitrain.data.storage.sha256_of`)."""
    with open(path, "rb") as f:
        return sha256_of(f)


def sampler(study: Study, taken: int = 0):
    """The study's sampler, seeded by the study's seed and the number of trials `taken` before this one: workers
    asking one after another draw different parameters, and the same history draws the same ones."""
    import optuna
    seed = study.seed + taken
    options = {key: value for key, value in study.sampler.items() if key != "type"}
    kind = study.sampler["type"]
    if kind == "grid":  # its points are enqueued when the study is created: the sampler only names the space
        return optuna.samplers.GridSampler({key: grid_values(entry) for key, entry in study.space.items()},
                                           seed=seed, **options)
    return {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}[kind](seed=seed, **options)


def pruner(study: Study):
    import optuna
    options = {key: value for key, value in study.pruner.items() if key != "type"}
    return {"median": optuna.pruners.MedianPruner, "asha": optuna.pruners.SuccessiveHalvingPruner,
            "none": optuna.pruners.NopPruner}[study.pruner["type"]](**options)


def take_trial(study: Study, optuna_study):
    """Under STUDY/budget.lock: fail and re-enqueue stale trials, then (a trial to run, its run directory), a
    waiting one first (a retry or a grid point), or None once the budget is spent. Rank 0 of a worker calls it."""
    from optuna.trial import TrialState

    with locked(os.path.join(study.folder, "budget")):
        reap_stale(study, optuna_study)
        trials = optuna_study.get_trials(deepcopy=False)
        retried = retried_trials(trials)
        counted = sum(1 for t in trials if t.number not in retried)
        waiting = any(t.state == TrialState.WAITING for t in trials)
        if counted >= study.trials and not waiting:
            return None
        optuna_study.sampler = sampler(study, len(trials))
        trial = optuna_study.ask(space_distributions(study))
        beat(trial)
        return trial, trial_run_dir(study.folder, frozen(optuna_study, trial.number))


def retried_trials(trials) -> set[int]:
    """The numbers of the failed trials enqueued again (`retry_history` of their retries): the budget counts
    their retries instead."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    return {number for t in trials for number in RetryHeartbeatStaleTrialCallback.retry_history(t)}


def frozen(optuna_study, number: int):
    """Trial `number` as the study records it now (a FrozenTrial)."""
    return next(t for t in optuna_study.get_trials(deepcopy=False) if t.number == number)


def space_distributions(study: Study) -> dict:
    """The space as Optuna distributions (ask's fixed_distributions: every parameter is sampled at once)."""
    import optuna.distributions as d

    out = {}
    for key, entry in study.space.items():
        if "choice" in entry:
            out[key] = d.CategoricalDistribution(entry["choice"])
        elif "int" in entry:
            out[key] = d.IntDistribution(*entry["int"], log=entry.get("log", False), step=entry.get("step", 1))
        else:
            out[key] = d.FloatDistribution(*map(float, entry["float"]), log=entry.get("log", False),
                                           step=entry.get("step"))
    return out


def beat(trial) -> None:
    """Record that `trial` (an Optuna Trial this process runs) is alive now."""
    trial.set_user_attr(HEARTBEAT, time.time())


def fail_and_retry(study: Study, optuna_study, trial) -> None:
    """Fail `trial` (a FrozenTrial, RUNNING) and enqueue its parameters again, up to `study.retries` times: its
    worker died or was stopped, which says nothing about the parameters."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    optuna_study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    RetryHeartbeatStaleTrialCallback(max_retry=study.retries)(optuna_study, trial)


def reap_stale(study: Study, optuna_study) -> list[int]:
    """Fail and retry every RUNNING trial whose heartbeat is older than `heartbeat_s` (under the budget lock);
    their numbers."""
    from optuna.trial import TrialState

    now, reaped = time.time(), []
    for trial in optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if now - trial.user_attrs.get(HEARTBEAT, now) > study.heartbeat_s:
            fail_and_retry(study, optuna_study, trial)
            reaped.append(trial.number)
    return reaped


class Heartbeat(Periodic):
    """A daemon thread beating for one trial every `heartbeat_s` / 3 seconds while the block runs (rank 0)."""

    def __init__(self, study: Study, trial):
        super().__init__(study.heartbeat_s / 3, "mpitrain-trial-heartbeat")
        self.trial = trial

    def tick(self) -> None:
        beat(self.trial)
