"""The run directory: `RunDir` owns every path under it (what is in metrics.jsonl: `metrics_file.py`); a
run directory belongs to one job at a time, and a run's own config.yaml always points at its own folder.

    run = RunDir("runs/fashion_mlp")
    run.config, run.checkpoints, run.checkpoint(epoch, step), run.metrics, run.summary, run.eval_json("test")
    owner = FileLock(run.lock).take()   # rank 0, before anything is written; None: ours until released

The lock is `fcntl.flock` on RUN_DIR/.lock: the operating system releases it when the owning
process dies, however it dies, so a crashed job never leaves it stuck. Beside the lock the
file holds the owner's host and pid, for the message a second job gets.

A run directory copied with `cp -r runs/A runs/B` holds a config.yaml whose `run_dir` still
names A; training `runs/B/config.yaml` must write B, not A. `own_run_dir` says which folder a
config file inside a run directory belongs to.
"""
from __future__ import annotations

import errno
import fcntl
import glob
import logging
import os
import re
import socket
from dataclasses import dataclass

from mpitrain.base.errors import ConfigError, MpitrainError
from mpitrain.base.files import refuse_existing
from mpitrain.config.sections import Config, load_config
from mpitrain.data.shards import MANIFEST_NAME

log = logging.getLogger("mpitrain")
CHECKPOINT_NAME = re.compile(r"ckpt-(\d{4})-(\d{6})\.h5$")  # resume at step SSSSSS of epoch EEEE (0-based)
EVENTS_GLOB = "events.out.tfevents.*"  # TensorBoard's event files (mpitrain.rundir.tensorboard), named by its writer
# `mpitrain eval`'s picture by target kind: the confusion matrix, ROC and precision-recall curves, predicted vs true
EVAL_PICTURES = {"class": "confusion", "binary": "curves", "multilabel": "curves", "regression": "scatter",
                 "reconstruction": "scatter"}


def _in_run_dir(name: str) -> property:
    """A RunDir property: the path of `name` in the run directory."""
    return property(lambda self: os.path.join(self.path, name), doc=f"RUN_DIR/{name}")


@dataclass(frozen=True)
class RunDir:
    """Every path under the run directory `path`; no other module spells a name in it.

    config.yaml (the resolved config the run used), checkpoints/ckpt-EEEE-SSSSSS.h5,
    pretrain/layer-LL.h5 (pretraining's finished layers), metrics.jsonl, summary.json, .lock, and
    the outputs of `mpitrain eval` (eval-SPLIT.json and by target kind confusion-, curves- or
    scatter-SPLIT.png), `predict` (predictions-SPLIT.h5) and `report` (report.png, report.html; also in
    any other folder); earlier-N/ holds the files of an earlier run that a fresh start moved aside.
    """

    path: str

    config = _in_run_dir("config.yaml")
    checkpoints = _in_run_dir("checkpoints")
    metrics = _in_run_dir("metrics.jsonl")
    summary = _in_run_dir("summary.json")
    lock = _in_run_dir(".lock")
    report_png = _in_run_dir("report.png")
    report_html = _in_run_dir("report.html")

    @property
    def best_checkpoint(self) -> str:
        """checkpoints/best.h5: early stopping's best model (never resumed from, never deleted by `keep`)."""
        return os.path.join(self.checkpoints, "best.h5")

    def checkpoint(self, epoch: int, step: int) -> str:
        """The checkpoint that resumes at step `step` of epoch `epoch` (0-based)."""
        return os.path.join(self.checkpoints, f"ckpt-{epoch:04d}-{step:06d}.h5")

    def pretrained_layer(self, index: int) -> str:
        return os.path.join(self.path, "pretrain", f"layer-{index:02d}.h5")

    def eval_json(self, split: str) -> str:
        return os.path.join(self.path, f"eval-{split}.json")

    def eval_png(self, split: str, target: str = "class") -> str:
        """`mpitrain eval`'s picture of a split for a target kind (`EVAL_PICTURES`)."""
        return os.path.join(self.path, f"{EVAL_PICTURES[target]}-{split}.png")

    def eval_pngs(self) -> list[str]:
        """The pictures `mpitrain eval` has left in the run directory, of every split and kind, sorted."""
        return sorted(path for name in set(EVAL_PICTURES.values())
                      for path in glob.glob(os.path.join(glob.escape(self.path), f"{name}-*.png")))

    def embeddings(self, split: str) -> str:
        """`mpitrain predict --embeddings`'s default output (`mpitrain.training.activations`)."""
        return os.path.join(self.path, f"embeddings-{split}.h5")

    def predictions(self, split: str) -> str:
        return os.path.join(self.path, f"predictions-{split}.h5")

    def damaged_checkpoints(self) -> list[str]:
        """The checkpoints set aside as damaged (checkpoints/ckpt-EEEE-SSSSSS.h5.damaged, or .damaged.N), sorted."""
        return sorted(glob.glob(os.path.join(glob.escape(self.checkpoints), "ckpt-*.h5.damaged*")))

    def records(self) -> list[str]:
        """The files that record a run, those that exist: config.yaml, metrics.jsonl, summary.json, the report, the
        outputs of eval and predict (predictions and embeddings), TensorBoard's event files, and the checkpoints set aside as damaged."""
        here = glob.escape(self.path)
        outputs = [*glob.glob(os.path.join(here, "eval-*.json")), *self.eval_pngs(),
                   *glob.glob(os.path.join(here, "predictions-*.h5")),
                   *glob.glob(os.path.join(here, "embeddings-*.h5")), *glob.glob(os.path.join(here, EVENTS_GLOB))]
        paths = [self.config, self.metrics, self.summary, self.report_png, self.report_html, *sorted(outputs)]
        return [path for path in paths if os.path.exists(path)] + self.damaged_checkpoints()

    def move_aside(self, paths: list[str]) -> str:
        """Move `paths` (files in this run directory) into RUN_DIR/earlier-N, the first N no folder has, each at its
        place relative to the run directory (renames: nothing is copied or lost); returns that folder."""
        number = 1
        while os.path.exists(os.path.join(self.path, f"earlier-{number}")):
            number += 1
        folder = os.path.join(self.path, f"earlier-{number}")
        for path in paths:
            moved = os.path.join(folder, os.path.relpath(path, self.path))
            os.makedirs(os.path.dirname(moved), exist_ok=True)
            os.rename(path, moved)
        return folder

    def holds_a_run(self) -> bool:
        """Whether the folder holds a run's files (checkpoints, metrics or a summary)."""
        return any(os.path.exists(p) for p in (self.checkpoints, self.metrics, self.summary))


class FileLock:
    """An exclusive, non-blocking lock on the file `path` (a run directory's `.lock`, an ETL output's), released
    when the process exits. Not a collective: one process (rank 0, the Spark driver) takes it."""

    def __init__(self, path: str):
        self.path = path
        self.fd = None

    def take(self) -> str | None:
        """Take the lock: None once it is ours, else its holder's host and pid (the lock stays theirs)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                return owner
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode(), 0)
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def own_run_dir(config_path: str) -> str | None:
    """The run directory a config file belongs to: its folder when the file is a run's config.yaml
    (the folder holds the run's files), else None (a config of the user's, which names its run_dir)."""
    folder = os.path.dirname(os.path.abspath(config_path))
    run = RunDir(folder)
    return folder if os.path.abspath(config_path) == run.config and run.holds_a_run() else None


def load_run_config(path: str, overrides=()) -> Config:
    """`load_config` for a run: a config file that is a run's own config.yaml (its folder holds the run's files)
    trains that folder whatever its `run_dir` says, so a copied run directory never writes into the original;
    `--set run_dir=...` among `overrides` still wins."""
    own = own_run_dir(path)
    if own:
        log.info("%s is the config of the run in %s: run_dir is that folder", path, own)
        overrides = [f"run_dir={own}", *overrides]
    return load_config(path, overrides)


def dataset_around(folder: str) -> str | None:
    """The dataset folder (one holding manifest.json) that is `folder` or holds it, links followed; else None."""
    folder = os.path.realpath(folder)
    while True:
        if os.path.isfile(os.path.join(folder, MANIFEST_NAME)):
            return folder
        if os.path.dirname(folder) == folder:
            return None
        folder = os.path.dirname(folder)


def check_run_dir_outside_datasets(run_dir: str) -> None:
    """Refuse a run directory that is a dataset folder or inside one: the ETL owns a dataset's folder whole (its
    `--overwrite` replaces it, and would take the run with it), and nothing else writes there."""
    dataset = dataset_around(run_dir)
    if dataset:
        where = "is the dataset folder" if dataset == os.path.realpath(run_dir) else f"is inside the dataset " \
            f"folder {dataset}"
        raise ConfigError(f"{run_dir}: {where}; expected a run_dir outside every dataset (an ETL's --overwrite "
                          "replaces the dataset's folder whole, with what is in it)")


def check_output(path: str, overwrite: bool) -> None:
    """Refuse to write the file `path` a user named (predict, export, report): inside a run's checkpoints/ folder or a
    dataset folder (one holding manifest.json), even with `overwrite`; over an existing file, unless `overwrite`."""
    folder = os.path.dirname(os.path.realpath(path))  # a link is judged by where it points
    while True:
        parent = os.path.dirname(folder)
        if os.path.isfile(os.path.join(folder, MANIFEST_NAME)):
            raise MpitrainError(f"{path}: is inside the dataset folder {folder}; write it elsewhere "
                                "(not even --overwrite writes into a dataset)")
        if folder == RunDir(parent).checkpoints and os.path.isfile(RunDir(parent).config):
            raise MpitrainError(f"{path}: is inside the run's checkpoints folder {folder}; write it elsewhere "
                                "(not even --overwrite writes there)")
        if parent == folder:
            break
        folder = parent
    refuse_existing(path, overwrite)
