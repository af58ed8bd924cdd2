"""A study's results, written by rank 0 of a worker after each trial (plots when a worker ends) and by
`mpitrain tune STUDY --status`:

    STUDY/trials.csv     trial, state, objective, every parameter, run directory, seconds, why it failed
    STUDY/best.yaml      the best trial's full config (its RUN_DIR/config.yaml) training into STUDY/best:
                         `mpitrain train STUDY/best.yaml` on as many ranks reproduces its objective exactly
    STUDY/history.png, STUDY/importances.png, STUDY/parallel.png   Optuna's matplotlib plots
    STUDY/report.png, STUDY/report.html   the trials side by side (`mpitrain report` of their run directories)

Every file is written under a temporary name and renamed (`mpitrain.base.files.write_file`), and workers write them
one at a time (STUDY/results.lock), so a reader always finds whole files.
"""
from __future__ import annotations

import csv
import io
import os

import yaml
from optuna.storages import RetryHeartbeatStaleTrialCallback

from mpitrain.base.files import write_file
from mpitrain.config.yaml_input import read_yaml_file
from mpitrain.rundir.directory import RunDir
from mpitrain.rundir.report import write_report
from mpitrain.tune.storage import REASON, locked, retried_trials, trial_run_dir
from mpitrain.tune.studyfile import Study

RESULTS_GRACE_S = 600  # drawing a large study's plots and report takes a while: a longer grace before the lock breaks
PLOTS = {"history.png": "plot_optimization_history", "importances.png": "plot_param_importances",
         "parallel.png": "plot_parallel_coordinate"}


def trial_rows(study: Study, optuna_study) -> list[dict]:
    """One row per trial, in trial order: what trials.csv and --status show."""
    rows, trials = [], optuna_study.get_trials(deepcopy=False)
    retried_as = {number: t.number for t in trials for number in RetryHeartbeatStaleTrialCallback.retry_history(t)}
    for trial in trials:
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() \
            if trial.datetime_complete and trial.datetime_start else None
        value = trial.value if trial.value is not None else (
            trial.intermediate_values[max(trial.intermediate_values)] if trial.intermediate_values else None)
        rows.append({"trial": trial.number, "state": trial.state.name.lower(), "objective": value,
                     **{key: trial.params.get(key) for key in study.space},
                     # its folder by its number, not the journal's path: a study's records name nothing outside it
                     "run_dir": trial_run_dir(study.folder, trial) if "run_dir" in trial.user_attrs else "",
                     "seconds": None if seconds is None else round(seconds, 3),
                     "failure": _failure(trial, retried_as)})
    return rows


def _failure(trial, retried_as: dict) -> str:
    """Why a failed trial failed: its recorded line, else its worker stopped answering; and its retry."""
    if trial.state.name != "FAIL":
        return ""
    reason = trial.user_attrs.get(REASON) or "no heartbeat from its worker (it died)"
    return reason + (f"; retried as trial {retried_as[trial.number]}" if trial.number in retried_as else "")


def write_results(study: Study, optuna_study, plots: bool) -> list[str]:
    """trials.csv, best.yaml once a trial completed, and with `plots` the PNGs; the paths written. Under
    STUDY/results.lock: workers that finish at once write one after the other."""
    with locked(os.path.join(study.folder, "results"), grace_s=RESULTS_GRACE_S):
        return _write_results(study, optuna_study, plots)


def _write_results(study: Study, optuna_study, plots: bool) -> list[str]:
    rows = trial_rows(study, optuna_study)
    written = [os.path.join(study.folder, "trials.csv")]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=["trial", "state", "objective", *study.space, "run_dir", "seconds",
                                              "failure"])
    writer.writeheader()
    writer.writerows(rows)
    write_file(written[0], lambda f: f.write(text.getvalue()))
    if any(row["state"] == "complete" for row in rows):
        written.append(write_best(study, optuna_study.best_trial))
    if plots:
        written += write_plots(study, optuna_study)
        trained = [row["run_dir"] for row in rows if row["state"] in ("complete", "pruned")]
        if trained:  # the trials side by side: their curves and step times overlaid, a table row each
            written += write_report(trained, study.folder, overwrite=True)
    return written


def write_best(study: Study, trial) -> str:
    """STUDY/best.yaml: the best trial's config as its run recorded it, training into STUDY/best."""
    config = read_yaml_file(RunDir(trial_run_dir(study.folder, trial)).config, "config file")
    config["run_dir"] = os.path.join(study.folder, "best")
    header = (f"# trial {trial.number} of {study.folder}: {study.objective.split}.{study.objective.metric} "
              f"{trial.value!r} on {trial.user_attrs['ranks']} ranks; data.test_split is the objective's split.\n"
              f"# `mpiexec -n {trial.user_attrs['ranks']} mpitrain train best.yaml` trains it again, to the same "
              "value.\n")
    path = os.path.join(study.folder, "best.yaml")
    write_file(path, lambda f: f.write(header + yaml.safe_dump(config, sort_keys=False)))
    return path


def write_plots(study: Study, optuna_study) -> list[str]:
    """Optuna's optimization history, parameter importances and parallel coordinates as PNG; they need two
    completed trials (importances: a parameter that varied among them)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as plots
    from optuna.trial import TrialState

    complete = optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return []
    varied = any(len({repr(t.params.get(key)) for t in complete}) > 1 for key in study.space)
    written = []
    for name, plot in PLOTS.items():
        if name == "importances.png" and not varied:
            continue
        axes = getattr(plots, plot)(optuna_study)
        figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        figure.set_size_inches(9, 5)
        path = os.path.join(study.folder, name)
        write_file(path, lambda f: figure.savefig(f, format="png", dpi=100, bbox_inches="tight"), binary=True)
        plt.close(figure)
        written.append(path)
    return written


def status_table(study: Study, optuna_study) -> str:
    """The trials as an aligned text table, then the count per state and the best trial."""
    rows = trial_rows(study, optuna_study)
    columns = ["trial", "state", "objective", *study.space, "seconds"]
    cells = [columns] + [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    retried = retried_trials(optuna_study.get_trials(deepcopy=False))
    counts = {}
    for row in rows:
        if row["trial"] not in retried:
            counts[row["state"]] = counts.get(row["state"], 0) + 1
    lines.append(f"{study.folder}: {sum(counts.values())} of {study.trials} trials ("
                 + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + ")"
                 + (f"; {len(retried)} failed attempt{'s' * (len(retried) > 1)} retried" if retried else ""))
    complete = [row for row in rows if row["state"] == "complete"]
    if complete:
        best = (max if study.objective.direction == "maximize" else min)(complete, key=lambda row: row["objective"])
        lines.append(f"best: trial {best['trial']}, {study.objective.split}.{study.objective.metric} "
                     f"{best['objective']:.6g} ({os.path.join(study.folder, 'best.yaml')})")
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
