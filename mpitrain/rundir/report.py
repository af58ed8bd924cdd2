"""Pictures of runs: `report.png`/`report.html` from run directories, and the pictures of an evaluation by target
kind: a confusion matrix (class), ROC and precision-recall curves (binary, multilabel), predicted against true values
(regression).

A report reads what training wrote (`metrics.jsonl`, `config.yaml`, and `summary.json` when
the run has finished), so it also works on a run still in progress or on someone else's
copy; `report.html` also shows the pictures `mpitrain eval` left in each run directory.
Figures are drawn on a bare `matplotlib.figure.Figure` (Agg canvas): no display, no
pyplot state, safe inside an MPI job.

The points an evaluation picture draws are computed apart from the drawing (`curve_points`, `scatter_points`), so
tests compare them with scikit-learn's instead of pixels.
"""
from __future__ import annotations

import base64
import html
import io
import json
import os
from dataclasses import dataclass

import numpy as np

from mpitrain.base.errors import MpitrainError
from mpitrain.base.files import write_file
from mpitrain.config.yaml_input import read_yaml
from mpitrain.rundir.directory import RunDir, check_output
from mpitrain.rundir.metrics_file import read_metrics

FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")
REPORT_SIZE = (15, 8)  # inches; at REPORT_DPI: 1500 x 800 pixels
REPORT_DPI = 100
MAX_CURVE_POINTS = 2000  # points drawn per curve; more: an evenly spaced subset of them, both ends kept
MAX_CURVES = 10  # labels drawn per panel (multilabel); the title says how many there are
MAX_SCATTER_POINTS = 20000  # rows drawn per predicted-vs-true panel; more: a seeded sample of them
MAX_SCATTER_PANELS = 6  # regression outputs drawn, the first ones
SUMMARY_COLUMNS = {"ranks": "ranks", "epochs": "epochs", "test accuracy": "test_accuracy", "test loss": "test_loss",
                   "samples/s": "samples_per_s", "bytes/step/rank": "bytes_sent_per_step", "wall s": "wall_s"}


@dataclass
class Run:
    """One run directory's records: step windows, epochs, its summary (None while unfinished) and the pictures
    `mpitrain eval` left in it."""

    name: str
    mode: str
    windows: list[dict]
    epochs: list[dict]
    summary: dict | None
    pictures: list[str]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.mode})"


def read_run(run_dir: str) -> Run:
    """Read a run directory; a missing or damaged file is an MpitrainError naming it."""
    files = RunDir(run_dir)
    windows, epochs = read_metrics(files.metrics)
    path = files.config
    try:
        with open(path) as f:
            mode = read_yaml(f, path)["sync"]["mode"]  # one line for a config.yaml that is not YAML
        path = files.summary
        summary = None
        if os.path.exists(path):
            with open(path) as f:
                summary = json.load(f)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MpitrainError(f"{path}: cannot read it ({e}); expected the file `mpitrain train` writes") from None
    return Run(os.path.basename(os.path.normpath(run_dir)), mode, windows, epochs, summary, files.eval_pngs())


def write_report(run_dirs: list[str], out_dir: str, overwrite: bool = False) -> tuple[str, str]:
    """Draw OUT/report.png from the runs (overlaid) and OUT/report.html around it, each complete or absent; return
    both paths. Existing ones are refused unless `overwrite` (a run's own report is replaced: the training loop and
    `mpitrain report RUN_DIR` pass it), and an `out_dir` in a run's checkpoints/ or a dataset folder always."""
    runs = [read_run(d) for d in run_dirs]
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise MpitrainError(f"{out_dir}: is a file; expected a folder to write report.png and report.html into")
    png, page = RunDir(out_dir).report_png, RunDir(out_dir).report_html
    for path in (png, page):
        check_output(path, overwrite)
    drawn = io.BytesIO()
    _report_figure(runs).savefig(drawn, format="png", dpi=REPORT_DPI)
    write_file(png, lambda f: f.write(drawn.getvalue()), binary=True)
    write_file(page, lambda f: f.write(_report_html(runs, base64.b64encode(drawn.getvalue()).decode("ascii"))))
    return png, page


def _base64(png: str) -> str:
    with open(png, "rb") as f:
        return base64.b64encode(f.read()).decode("ascii")


def step_time_breakdown(windows: list[dict]) -> dict[str, np.ndarray]:
    """Where each metrics window's step time went, in ms per step: `step` (the window's wall time per step on its
    slowest rank), `mpi` (the ranks' mean time inside MPI: communication not hidden behind backward), `input` (the
    ranks' mean wait for batches), `compute` (the rest: forward, backward, the update), and `comm` (communication
    from its start to its end, the part behind backward included). `step` at the windows' global steps."""
    steps = np.diff([0] + [w["global_step"] for w in windows]).astype(np.float64)
    step_ms = np.array([1e3 * w["samples"] / max(w["samples_per_s"], 1e-12) for w in windows]) / np.maximum(steps, 1)
    mpi = np.array([w.get("mpi_ms_per_step", 0.0) for w in windows])
    wait = np.array([w.get("input_wait_ms_per_step", 0.0) for w in windows])
    return {"global_step": np.array([w["global_step"] for w in windows]), "step": step_ms, "mpi": mpi,
            "input": wait, "compute": np.maximum(step_ms - mpi - wait, 0.0),
            "comm": np.array([w.get("comm_ms_per_step", 0.0) for w in windows])}


def report_panels(runs: list[Run]) -> list[str]:
    """The panels that fit these runs: loss always; accuracy when a run has one (not regression); throughput and
    the step-time breakdown when a run recorded windows; bytes sent when a run sent any (more than one rank); the
    sharing panels when a run shares; the learning rate when a run's changed (a schedule, `lr_decay`)."""
    windows = [w for run in runs for w in run.windows]
    fits = {"loss": True,
            "accuracy": any(r["test_accuracy"] is not None for run in runs for r in run.epochs),
            "throughput": bool(windows),
            "step time": bool(windows),
            "bytes": any(w["bytes_sent_per_step"] > 0 for w in windows),
            "tau": any("tau" in w for w in windows),
            "sparsity": any("sparsity" in w for w in windows),
            "learning rate": any(len({w["lr"] for w in run.windows if "lr" in w}) > 1 for run in runs)}
    return [name for name, fit in fits.items() if fit]


PANELS = {"loss": ("loss per epoch: train solid, test dashed", "epoch", "loss"),
          "accuracy": ("test accuracy per epoch", "epoch", "accuracy"),
          "throughput": ("throughput (all ranks)", "step", "samples/s"),
          "step time": ("time per step: compute, MPI not hidden, input wait", "step", "ms per step"),
          "bytes": ("bytes sent per step per rank", "step", "bytes"),
          "tau": ("sharing: threshold tau", "step", "tau"),
          "sparsity": ("sharing: sparsity of all messages", "step", "sent / (ranks x params)"),
          "learning rate": ("learning rate (optimizer.schedule)", "step", "lr")}


def _report_figure(runs: list[Run]):
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
    names = report_panels(runs)
    columns = 3 if len(names) <= 6 else 4  # at most 7 panels: two rows, the picture's size fixed
    fig = Figure(figsize=REPORT_SIZE, layout="constrained")
    axes = dict(zip(names, fig.subplots(2, columns).ravel()))
    for ax in list(fig.axes)[len(names):]:
        ax.remove()
    for name, ax in axes.items():
        title, xlabel, ylabel = PANELS[name]
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3)
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        epoch = [r["epoch"] + 1 for r in run.epochs]
        axes["loss"].plot(epoch, [r["train_loss"] for r in run.epochs], "o-", color=color, label=run.label)
        axes["loss"].plot(epoch, [r["test_loss"] for r in run.epochs], "s--", color=color)
        if "accuracy" in axes:
            accuracy = [np.nan if r["test_accuracy"] is None else r["test_accuracy"] for r in run.epochs]
            axes["accuracy"].plot(epoch, accuracy, "o-", color=color, label=run.label)
        step = [r["global_step"] for r in run.windows]
        for name, key in (("throughput", "samples_per_s"), ("bytes", "bytes_sent_per_step"), ("tau", "tau"),
                          ("sparsity", "sparsity"), ("learning rate", "lr")):
            if name in axes and run.windows and all(key in r for r in run.windows):
                axes[name].plot(step, [r[key] for r in run.windows], ".-", color=color, label=run.label)
        if "step time" in axes and run.windows:
            _draw_step_time(axes["step time"], step_time_breakdown(run.windows), run, color, alone=len(runs) == 1)
    for ax in axes.values():
        if ax.lines or ax.collections:
            ax.legend(fontsize="small")
    for name in ("loss", "accuracy"):
        if name in axes:
            axes[name].xaxis.set_major_locator(MaxNLocator(integer=True))
    for name in ("bytes", "tau", "sparsity"):
        if name in axes and any(y > 0 for line in axes[name].lines for y in line.get_ydata()):
            axes[name].set_yscale("log")
    named = [f"{run.label}: rank {w['straggler']['rank']} on {w['straggler']['host']} "
             f"({w['straggler']['ratio']:.1f}x the median from step {w['global_step']})"
             for run in runs for w in run.windows if "straggler" in w]
    if named:  # mpitrain/training/stragglers.py
        fig.suptitle("stragglers: " + "; ".join(named[:4]) + (" ..." if len(named) > 4 else ""), color="C3")
    return fig


def _draw_step_time(ax, parts: dict, run: Run, color: str, alone: bool) -> None:
    """One run: its step time stacked (compute, MPI not hidden, input wait) under a line of its communication's
    whole span; several runs: each part a line style in the run's color."""
    x = parts["global_step"]
    if alone:
        ax.stackplot(x, parts["compute"], parts["mpi"], parts["input"], labels=["compute", "MPI (not hidden)",
                                                                                "input wait"], alpha=0.7)
        ax.plot(x, parts["comm"], "k--", label="communication, start to end (hidden part included)")
        return
    ax.plot(x, parts["compute"], "-", color=color, label=f"{run.label}: compute (MPI dashed, input wait dotted)")
    ax.plot(x, parts["mpi"], "--", color=color)
    ax.plot(x, parts["input"], ":", color=color)


def _report_html(runs: list[Run], image_base64: str) -> str:
    header = "".join(f"<th>{name}</th>" for name in ["run", "sync", *SUMMARY_COLUMNS])
    rows = []
    for run in runs:
        values = [run.name, run.mode, *[(run.summary or {}).get(key, "unfinished") for key in SUMMARY_COLUMNS.values()]]
        cells = [html.escape(f"{v:.4g}" if isinstance(v, float) else str(v)) for v in values]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    stragglers = "".join(
        f"<p>Straggler: {html.escape(run.label)}: rank {w['straggler']['rank']} on "
        f"{html.escape(str(w['straggler']['host']))} took {w['straggler']['busy_ms']:.1f} ms per step outside MPI, "
        f"{w['straggler']['ratio']:.1f}x the median rank's, in the windows up to step {w['global_step']}</p>\n"
        for run in runs for w in run.windows if "straggler" in w)
    evaluations = "".join(
        f"<h2>{html.escape(run.label)}: {html.escape(os.path.basename(picture)[:-4])}</h2>\n"
        f"<p><img alt=\"{html.escape(os.path.basename(picture))}\" src=\"data:image/png;base64,{_base64(picture)}\"></p>\n"
        for run in runs for picture in run.pictures)
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>mpitrain report</title>"
            "<style>body{font-family:sans-serif} table{border-collapse:collapse} "
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style></head><body>\n"
            f"<h1>mpitrain report: {html.escape(', '.join(r.label for r in runs))}</h1>\n"
            f"<table><tr>{header}</tr>\n" + "\n".join(rows) + "</table>\n" + stragglers +
            f"<p><img alt=\"loss, accuracy, throughput and communication per run\" "
            f"src=\"data:image/png;base64,{image_base64}\"></p>\n{evaluations}</body></html>\n")


def class_names(source: str, num_classes: int) -> list[str]:
    """Fashion-MNIST's names for a dataset made from it (by its manifest `source`), else the indices."""
    if "fashion" in source.lower() and num_classes == len(FASHION_MNIST_CLASSES):
        return list(FASHION_MNIST_CLASSES)
    return [str(c) for c in range(num_classes)]


def write_confusion_png(confusion: np.ndarray, names: list[str], path: str, title: str) -> None:
    """The confusion matrix (rows: true class) shaded by row fraction (recall), with counts up to 20 classes."""
    from matplotlib.figure import Figure
    size = max(5.0, 0.6 * len(names) + 2)
    fig = Figure(figsize=(size + 1, size), layout="constrained")
    ax = fig.subplots()
    totals = confusion.sum(axis=1, keepdims=True)
    image = ax.imshow(confusion / np.maximum(totals, 1), cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, label="fraction of the true class")
    ticks = np.arange(len(names))
    ax.set_xticks(ticks, names, rotation=45, ha="right")
    ax.set_yticks(ticks, names)
    ax.set(xlabel="predicted", ylabel="true", title=title)
    if len(names) <= 20:
        for (true, predicted), count in np.ndenumerate(confusion):
            ax.text(predicted, true, str(count), ha="center", va="center", fontsize="small",
                    color="white" if count > 0.5 * totals[true, 0] else "black")
    fig.savefig(path, dpi=REPORT_DPI)


def write_curves_png(found: list[dict], names: list[str], metrics: dict, path: str, title: str) -> None:
    """ROC and precision-recall curves of binary or multilabel targets: `found` one dict per column as
    `mpitrain.training.scores.curves` gives them, `metrics` the `target_metrics` of the same rows (for the legends)."""
    curves_figure(curve_points(found), names, metrics, title).savefig(path, dpi=REPORT_DPI)


def write_scatter_png(labels: np.ndarray, predictions: np.ndarray, names: list[str], metrics: dict, path: str,
                      title: str) -> None:
    """Predicted against true values of regression targets, (rows, outputs) each; `metrics` their
    `target_metrics` (for the R² of each panel)."""
    scatter_figure(labels, predictions, names, metrics, title).savefig(path, dpi=REPORT_DPI)


def curve_points(found: list[dict], limit: int = MAX_CURVE_POINTS) -> list[dict]:
    """The points `curves_figure` draws, one dict per column of `found` (`mpitrain.training.scores.curves`, whose
    points are scikit-learn's `roc_curve` and `precision_recall_curve`), the first `MAX_CURVES` columns:
    {"fpr", "tpr", "recall", "precision"}, each curve cut to at most `limit` of its points, evenly spaced by index
    with both ends kept."""
    return [{**dict(zip(("fpr", "tpr"), _thinned(limit, c["roc"]["fpr"], c["roc"]["tpr"]))),
             **dict(zip(("recall", "precision"), _thinned(limit, c["pr"]["recall"], c["pr"]["precision"])))}
            for c in found[:MAX_CURVES]]


def _thinned(limit: int, *arrays: np.ndarray) -> list[np.ndarray]:
    """The arrays (of one length) at no more than `limit` indices, evenly spaced, the first and last kept."""
    n = len(arrays[0])
    if n <= limit:
        return list(arrays)
    keep = np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64))
    return [a[keep] for a in arrays]


def curves_figure(points: list[dict], names: list[str], metrics: dict, title: str):
    """ROC curves (left, beside the chance diagonal) and precision-recall curves (right), one line per column of
    `points` (`curve_points`), in `names`' order, labelled with the column's AUC and average precision."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(12, 5.5), layout="constrained")
    roc, pr = fig.subplots(1, 2)
    auc, average_precision = (value if isinstance(value, list) else [value]  # binary: one number
                              for value in (metrics.get("auc"), metrics.get("average_precision")))
    for j, (point, name) in enumerate(zip(points, names)):
        roc.plot(point["fpr"], point["tpr"], color=f"C{j % 10}", label=f"{name} (AUC {_figure(auc[j])})")
        pr.plot(point["recall"], point["precision"], color=f"C{j % 10}", drawstyle="steps-post",
                label=f"{name} (AP {_figure(average_precision[j])})")
    roc.plot([0, 1], [0, 1], ":", color="gray", label="chance")
    shown = f" ({len(points)} of {len(names)} labels)" if len(points) < len(names) else ""
    roc.set(title=f"ROC{shown}", xlabel="false positive rate", ylabel="true positive rate", xlim=(0, 1),
            ylim=(0, 1.02))
    pr.set(title=f"precision-recall{shown}", xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02))
    for ax in (roc, pr):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower right" if ax is roc else "lower left")
    fig.suptitle(title)
    return fig


def scatter_points(labels: np.ndarray, predictions: np.ndarray, limit: int = MAX_SCATTER_POINTS, seed: int = 0) \
        -> tuple[np.ndarray, np.ndarray]:
    """The (true, predicted) rows `scatter_figure` draws: all of them, or a sample of `limit` rows (seeded, in
    row order) when there are more."""
    if len(labels) <= limit:
        return labels, predictions
    keep = np.sort(np.random.default_rng(seed).choice(len(labels), limit, replace=False))
    return labels[keep], predictions[keep]


def scatter_figure(labels: np.ndarray, predictions: np.ndarray, names: list[str], metrics: dict, title: str):
    """Predicted against true values, one panel per output (the first `MAX_SCATTER_PANELS`), with the diagonal
    where they are equal and the output's R²; the title says how many of the `metrics["rows"]` scored are drawn."""
    from matplotlib.figure import Figure
    true, predicted = scatter_points(labels, predictions)
    panels = min(true.shape[1], MAX_SCATTER_PANELS)
    fig = Figure(figsize=(4.5 * panels + 1, 4.8), layout="constrained")
    r2 = metrics.get("r2_per_output") or [None] * true.shape[1]
    for j, ax in enumerate(np.atleast_1d(fig.subplots(1, panels))):
        ax.scatter(true[:, j], predicted[:, j], s=6, alpha=0.4, linewidths=0)
        low = float(min(true[:, j].min(), predicted[:, j].min()))
        high = float(max(true[:, j].max(), predicted[:, j].max()))
        ax.plot([low, high], [low, high], ":", color="gray")
        ax.set(title=f"{names[j]}: R² {_figure(r2[j])}", xlabel="true", ylabel="predicted")
        ax.grid(alpha=0.3)
    shown = f" (outputs 1-{panels} of {true.shape[1]})" if panels < true.shape[1] else ""
    scored = metrics.get("rows", len(labels))  # the histogram mode's `labels` are a sample already
    sampled = f", {len(true)} of {scored} rows drawn" if len(true) < scored else ""
    fig.suptitle(f"{title}{shown}{sampled}")
    return fig


def _figure(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"
