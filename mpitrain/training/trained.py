"""A trained run restored for scoring: `evaluate_run` and `predict_run`, what `mpitrain eval` and `predict` do.

    result = evaluate_run("runs/fashion_mlp", comm, split="test")   # writes RUN_DIR/eval-test.json and its
                                                                     # picture; returns the scores
    path, rows = predict_run("runs/fashion_mlp", comm, split="test", out="predictions.h5")
    path, rows, tally = predict_records("runs/clicks", comm, "new/clicks.parquet")   # a table model's new records

The picture is the confusion matrix (confusion-SPLIT.png) for class targets, ROC and precision-recall curves
(curves-SPLIT.png) for binary and multilabel targets, predicted against true values (scatter-SPLIT.png) for
regression. Predictions are probabilities or values by target kind (`mpitrain.rundir.outputs`).

Both are collectives: every rank scores its own rows of the split (all of them: no max_rows)
with the run's newest checkpoint (or `checkpoint`), set up from the config that checkpoint recorded
exactly as training set it up (its model, loss, dtype and input transforms, whatever the run's
config.yaml says now: `mpitrain.rundir.checkpointer.checkpoint_config`); rank 0 writes the outputs
(`mpitrain.rundir.outputs`).
"""
from __future__ import annotations

import os

import numpy as np

from mpitrain.base.errors import MpitrainError
from mpitrain.rundir.checkpointer import checkpoint_config, chosen_checkpoint
from mpitrain.rundir.directory import RunDir, check_output
from mpitrain.rundir.outputs import names_of, output_names, write_evaluation, write_predictions
from mpitrain.training.evaluation import EVAL_BATCH_SIZE, evaluate, predict
from mpitrain.training.metrics import figure
from mpitrain.training.records import Tally, encode_records
from mpitrain.training.run import setup_run
from mpitrain.training.scores import curves


class Trained:
    """A run set up as training set it up, a checkpoint's parameters in its model, and this rank's rows of a split."""

    def __init__(self, run_dir: str, comm, split: str, checkpoint: str | None, batch_size: int | None,
                 allow_other_dataset: bool):
        """Restore the run of `run_dir` (a collective): its checkpoint, the config that checkpoint recorded, this rank's
        rows of `split` (None: no split's); `batch_size` None is EVAL_BATCH_SIZE."""
        batch_size = EVAL_BATCH_SIZE if batch_size is None else batch_size
        with comm.agreed_errors():
            if batch_size < 1:
                raise MpitrainError(f"--batch-size is {batch_size}, expected an integer >= 1")
            if not os.path.isdir(run_dir):
                raise MpitrainError(f"{run_dir}: no such run directory; expected a folder written by `mpitrain train`")
            chosen = chosen_checkpoint(run_dir, checkpoint)
            # the run's own folder, wherever it was trained; eval and predict score every row of the split
            config = checkpoint_config(run_dir, chosen, ("data.max_rows=0",))
        self.run = setup_run(config, comm)
        with self.run.comm.agreed_errors():
            self.checkpoint = self.run.checkpointer.restore(self.run.model, chosen, other_dataset=allow_other_dataset)
            self.rows = self.run.reader.eval_rows(split) if split else None
        self.split, self.batch_size = split, batch_size
        self.manifest = self.run.reader.manifest
        self.to_input = self.run.model_input()

    def provenance(self) -> dict:
        """What the scores were computed from: the checkpoint, the split, the dataset, and whether the
        checkpoint was trained on another dataset than the one scored (allowed by allow_other_dataset)."""
        reader = self.run.reader
        return {"checkpoint": self.checkpoint.path, "split": self.split, "dataset": reader.path,
                "manifest_sha256": reader.manifest_sha256,
                "trained_on_manifest_sha256": self.checkpoint.manifest_sha256,
                "other_dataset": self.checkpoint.manifest_sha256 != reader.manifest_sha256}


def evaluate_run(run_dir: str, comm, split: str = "test", checkpoint: str | None = None,
                 batch_size: int | None = None, allow_other_dataset: bool = False,
                 max_exact_rows: int | None = None) -> dict:
    """Evaluate a run's checkpoint on every row of `split` (a collective); rank 0 writes RUN_DIR/eval-SPLIT.json and
    its picture (the confusion matrix, ROC and precision-recall curves, or predicted against true values, by target
    kind). Returns the scores (class targets: accuracy, loss, rows, confusion, precision, recall and the kind's
    metrics: log loss, F1, AUC and average precision one-vs-rest and macro; other targets: accuracy, loss, rows and
    the kind's metrics, exact up to `max_exact_rows` rows, default `MAX_EXACT_ROWS`, and
    in the histogram mode above) with their provenance, the two paths ("json", "picture") and the class names."""
    trained = Trained(run_dir, comm, split, checkpoint, batch_size, allow_other_dataset)
    run, target = trained.run, trained.run.target
    try:
        evaluation = evaluate(run.model, trained.rows, trained.to_input, trained.batch_size, run.comm,
                              trained.manifest.num_classes, run.backend, target, max_exact_rows, class_metrics=True)
    finally:
        run.reader.close()  # the shards' files (a remote store's connections) before the interpreter ends
    result = evaluation.to_dict()
    files = RunDir(run_dir)
    paths = {"json": files.eval_json(split), "picture": files.eval_png(split, target)}
    headline = {"class": "accuracy", "binary": "auc", "multilabel": "auc_macro", "regression": "r2",
                "reconstruction": "mse"}[target]
    with comm.agreed_errors():
        if comm.is_root:
            drawn = {}
            if target in ("binary", "multilabel"):
                found = curves(target, *evaluation.predictions) if evaluation.curves is None else evaluation.curves
                drawn["curves"] = [found] if target == "binary" else found
            elif target in ("regression", "reconstruction"):
                drawn["values"] = evaluation.predictions
                drawn["names"] = output_names(trained.manifest, target)
            write_evaluation(paths["json"], paths["picture"], result, trained.provenance(), trained.manifest,
                             f"{os.path.basename(os.path.abspath(run_dir))}, {split}: "
                             f"{headline} {figure(result[headline])}", **drawn)
    return {**trained.provenance(), **result, **paths, "class_names": names_of(trained.manifest)}


def checked_output(comm, out: str | None, overwrite: bool, default: str) -> tuple[str, bool]:
    """(path, overwrite) of an HDF5 output a collective writes: `out` as `overwrite` allows (refused where
    `mpitrain.rundir.directory.check_output` refuses it, or a folder), else the tool's own `default`, replaced on every call. A
    collective: a refusal is an error on every rank."""
    path, overwrite = (out, overwrite) if out else (default, True)
    with comm.agreed_errors():
        if os.path.isdir(path):
            raise MpitrainError(f"--out {path}: is a folder; expected an HDF5 file path")
        check_output(path, overwrite)
    return path, overwrite


def predict_run(run_dir: str, comm, split: str = "test", out: str | None = None, checkpoint: str | None = None,
                batch_size: int | None = None, allow_other_dataset: bool = False,
                overwrite: bool = False) -> tuple[str, int]:
    """Predict every row of `split` with a run's checkpoint (a collective); rank 0 writes the predictions, the
    model's outputs (probabilities, or regression's values) and the labels to `out` (default
    RUN_DIR/predictions-SPLIT.h5, the tool's own file, replaced on every call; the layout by target kind:
    `mpitrain.rundir.outputs`). An existing `out` is refused unless `overwrite`, and a path inside a run's
    checkpoints/ or a dataset folder always (`mpitrain.rundir.directory.check_output`). Returns the path and the row count."""
    path, overwrite = checked_output(comm, out, overwrite, RunDir(run_dir).predictions(split))
    trained = Trained(run_dir, comm, split, checkpoint, batch_size, allow_other_dataset)
    target = trained.run.target
    try:
        with comm.agreed_errors():
            predicted, outputs, labels = predict(trained.run.model, trained.rows, trained.to_input,
                                                 trained.batch_size, trained.run.backend, target)
    finally:
        trained.run.reader.close()
    parts = comm.gather_obj((predicted, outputs, labels))
    with comm.agreed_errors():
        if comm.is_root:
            check_output(path, overwrite)  # again: something may have appeared there while the ranks predicted
            write_predictions(path, target, *(np.concatenate([p[i] for p in parts]) for i in range(3)),
                              trained.provenance(), None if target == "class" else output_names(trained.manifest, target),
                              per_step=bool(trained.manifest.step_target))
    return path, sum(comm.allgather_obj(len(outputs)))


def predict_records(run_dir: str, comm, records: str, out: str | None = None, checkpoint: str | None = None,
                    batch_size: int | None = None, overwrite: bool = False) -> tuple[str, int, Tally]:
    """Predict new raw records of a table model (a collective): each rank encodes its row groups of the Parquet
    records at `records` by the run's dataset's columns (`mpitrain.training.records`) and scores them with the run's
    checkpoint, its sharded tables' forward included; rank 0 writes `predicted`, the outputs and `row` (each
    prediction's record index in `records`) to `out` (default RUN_DIR/predictions-records.h5, replaced on every
    call), without labels. Returns the path, the rows predicted and the records' `Tally`."""
    path, overwrite = checked_output(comm, out, overwrite, RunDir(run_dir).predictions("records"))
    trained = Trained(run_dir, comm, None, checkpoint, batch_size, allow_other_dataset=False)
    run, target = trained.run, trained.run.target
    try:
        rows, tally = encode_records(records, trained.manifest.columns, run.reader.path, comm)
        with comm.agreed_errors():
            predicted, outputs, _ = predict(run.model, rows, trained.to_input, trained.batch_size, run.backend, target)
    finally:
        run.reader.close()
    parts = comm.gather_obj((rows.index, predicted, outputs))
    with comm.agreed_errors():
        if comm.is_root:
            check_output(path, overwrite)
            index, predicted, outputs = (np.concatenate([p[i] for p in parts]) for i in range(3))
            order = np.argsort(index, kind="stable")
            provenance = {"checkpoint": trained.checkpoint.path, "records": os.path.abspath(records),
                          "dataset": run.reader.path, "manifest_sha256": run.reader.manifest_sha256,
                          "records_read": tally.records, "bad_records": tally.bad}
            write_predictions(path, target, predicted[order], outputs[order], None, provenance,
                              None if target == "class" else output_names(trained.manifest, target), rows=index[order])
    return path, sum(comm.allgather_obj(len(rows))), tally
