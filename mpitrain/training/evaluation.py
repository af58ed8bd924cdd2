"""Distributed evaluation and inference: each rank scores its own rows, the sums are Allreduced.

Class targets are scored by a fused kernel into a confusion matrix and the loss. Binary, multilabel and
regression targets (`Manifest.target`) are scored by the model's own loss, their accuracy
from the loss's correct count (regression has none). Every kind keeps the outputs the loss reads as
probabilities or values (`outputs_of`) for the metrics of their kind (class targets: log loss, F1, AUC and
average precision one-vs-rest per class and macro): exact up to `MAX_EXACT_ROWS` rows in all, in the histogram
mode above (`mpitrain.training.distributed_scores`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.data.units import Units
from mpitrain.kernels.loss import score
from mpitrain.nn.losses import sigmoid, softmax
from mpitrain.rundir.report import MAX_SCATTER_POINTS
from mpitrain.training.distributed_scores import gather_predictions, histogram_scores, root_metrics
from mpitrain.training.scores import MAX_EXACT_ROWS, decisions

EVAL_BATCH_SIZE = 256  # rows per batch when scoring: no gradients are kept, so larger than a training batch


@dataclass
class Evaluation:
    """Over all ranks: a confusion matrix (class targets; rows: true class, columns: predicted) or the rows and
    correct predictions counted (other targets), the summed loss, and a target kind's further metrics."""

    confusion: np.ndarray | None
    loss_sum: float
    counted: int = 0  # rows, for targets without a confusion matrix
    correct: float | None = None  # binary and multilabel targets; regression has no accuracy
    metrics: dict = field(default_factory=dict)
    # other targets, on rank 0, for the pictures: every rank's (labels, outputs) the metrics were computed from (in
    # the histogram mode, regression's: an evenly spaced sample of them), and the histogram mode's ROC and
    # precision-recall curves (`mpitrain.training.scores.curves` of the predictions gives the exact mode's)
    predictions: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    curves: list | dict | None = field(default=None, repr=False)

    @property
    def rows(self) -> int:
        return int(self.confusion.sum()) if self.confusion is not None else self.counted

    @property
    def accuracy(self) -> float | None:
        if self.confusion is not None:
            return float(np.trace(self.confusion)) / self.rows
        return None if self.correct is None else self.correct / self.rows

    @property
    def loss(self) -> float:
        return self.loss_sum / self.rows

    def figures(self) -> dict:
        """Its figures by name, which a schedule's or early stopping's `monitor` names: loss, accuracy and the
        target kind's metrics (auc, f1, r2, rmse, ...)."""
        return {"loss": self.loss, "accuracy": self.accuracy, **self.metrics}

    def to_dict(self) -> dict:
        if self.confusion is None:
            return {"accuracy": self.accuracy, "loss": self.loss, "rows": self.rows, **self.metrics}
        true_counts, predicted_counts = self.confusion.sum(axis=1), self.confusion.sum(axis=0)
        hits = np.diag(self.confusion)
        return {
            **self.metrics, "accuracy": self.accuracy, "loss": self.loss, "rows": self.rows,
            "precision": [float(h / p) if p else 0.0 for h, p in zip(hits, predicted_counts)],
            "recall": [float(h / t) if t else 0.0 for h, t in zip(hits, true_counts)],
            "confusion": self.confusion.tolist(),
        }


def outputs_of(logits, target: str, loss: str = ""):
    """What the model's outputs mean for a target kind: class probabilities (softmax), probabilities (sigmoid) of
    binary and multilabel labels, the values themselves for regression; an autoencoder's reconstruction of its input
    (`reconstruction`) is the values, or their sigmoids under the `loss` binary_cross_entropy."""
    if target == "class":
        return softmax(logits)
    if target == "reconstruction":
        return sigmoid(logits) if loss == "binary_cross_entropy" else logits
    return logits if target == "regression" else sigmoid(logits)


def scored_as(target: str) -> str:
    """The kind whose metrics score a target kind (`mpitrain.training.scores.KINDS`): a reconstruction is scored as
    regression's values (MSE, RMSE, MAE, R²), over every feature of every row."""
    return "regression" if target == "reconstruction" else target


def batched_logits(model, rows, to_input, batch_size: int, until=None):
    """Yield (logits, labels) over this rank's rows (`mpitrain.data.stream.EvalRows`) in order, the last batch possibly
    short. The inputs go into the model's workspace (`to_input(stored, out)`) and the logits are the model's: used
    before the next; labels are a host array, likewise reused. An autoencoder's (`model.reconstruction`) labels are
    its inputs, flattened, as training gives them to its loss. `until` (a node: `Network.forward`'s) yields that
    node's activations instead of the logits, beside the dataset's labels. A model with a class per step yields
    its valid steps as rows: (steps, C) logits and (steps,) classes, in row order then step order. A model with
    sharded tables makes every rank run as many forwards (`Network.padding_batches`: a collective)."""
    ws = model.workspace.part("evaluation")
    padding = model.padding_batches(-(-len(rows) // batch_size))
    for stored, labels in rows.batches(batch_size):
        x = to_input(stored, ws("input", (len(stored), *model.input_shape), model.params.dtype)
                     if isinstance(stored, np.ndarray) else None)  # a padded batch of sequences: `ModelInput`'s
        if model.reconstruction and until is None:
            labels = _host(x).reshape(len(x), -1)
        logits = model.forward(x, training=False, until=until)
        if logits.ndim == 3 and until is None:  # a class per step (docs/sequences.md): each valid step is a row
            valid = labels >= 0
            logits, labels = logits[model.xp.asarray(valid)], labels[valid]
        yield logits, labels
    for _ in range(padding):
        model.run_empty_batch()


def scored_batches(model, rows, to_input, batch_size: int, units: Units):
    """`batched_logits` with each batch's labels twice: as the loss reads them (the model's units) and in `units`,
    the data's, beside which the outputs are scored (their `units.to_data`)."""
    for logits, labels in batched_logits(model, rows, to_input, batch_size):
        if model.reconstruction:  # the labels are the model's input, in its units
            yield logits, labels, units.to_data(labels)
        else:
            yield logits, units.to_model(labels), labels


def _host(array):
    """A numpy array of a numpy or cupy array."""
    return array.get() if hasattr(array, "get") else array


def evaluate(model, rows, to_input, batch_size: int, comm, num_classes: int, backend, target: str = "class",
             max_exact_rows: int | None = None, class_metrics: bool = False) -> Evaluation:
    """Evaluate on every rank's rows; a collective, so every rank must call it. `target`: the dataset's kind
    (`Manifest.target`); other kinds than class go to `evaluate_targets` (with `max_exact_rows`). Class targets get
    their confusion matrix and loss, allocating no array (the training loop's evaluation after each epoch), and with
    `class_metrics` (`mpitrain eval`) also the kind's ranking metrics from the softmax outputs: log loss, F1, AUC and
    average precision per class and macro (`kind_metrics`).

    Each batch's loss and (label, prediction) counts are added up on the device by one fused
    kernel (`mpitrain.kernels.loss.score`, counts in float64: exact below 2**53 rows); one copy
    brings them to the host and one Allreduce sums them over the ranks, with a count of ranks
    whose rows could not be read (a shard gone or damaged): then every rank raises that rank's
    error, instead of the others waiting for it.
    """
    if target != "class":
        return evaluate_targets(model, rows, to_input, batch_size, comm, backend, target, max_exact_rows)
    size = num_classes * num_classes
    totals = backend.xp.zeros(size + 2, dtype=np.float64)  # the counts, the loss sum, the ranks that failed to read
    outputs, labels, failure = [], [], None
    try:
        for logits, batch_labels in batched_logits(model, rows, to_input, batch_size):
            score(logits, backend.to_device(batch_labels), totals[:size], totals[size:size + 1])
            if class_metrics:
                outputs.append(backend.to_host(outputs_of(logits, target)).astype(np.float64))
                labels.append(batch_labels.astype(np.int64))
    except DataError as e:
        failure = str(e)
    totals = backend.to_host(totals)
    totals[-1] = failure is not None
    comm.allreduce_(totals)
    if totals[-1]:  # the messages cross only when a rank failed
        comm.raise_first_failure(failure, DataError)
    confusion = totals[:size].astype(np.int64).reshape(num_classes, num_classes)
    if not class_metrics:
        return Evaluation(confusion, float(totals[size]))
    labels = np.concatenate(labels or [np.empty(0, np.int64)])
    outputs = np.concatenate(outputs or [np.empty((0, num_classes))]).reshape(-1, num_classes)
    metrics, _, _ = kind_metrics(comm, target, labels, outputs, int(confusion.sum()), max_exact_rows)
    return Evaluation(confusion, float(totals[size]), metrics=metrics)


def evaluate_targets(model, rows, to_input, batch_size: int, comm, backend, target: str,
                     max_exact_rows: int | None = None) -> Evaluation:
    """Evaluate binary, multilabel or regression targets on every rank's rows (a collective): the model's loss and
    correct count summed by one Allreduce (with the rows, and the ranks that failed to read theirs, as `evaluate`),
    then the target kind's metrics over every rank's outputs: up to `max_exact_rows` rows in all (default
    `MAX_EXACT_ROWS`) exact, gathered on rank 0; above, in the histogram mode, where no row leaves its rank but
    regression's sample for the picture (`mpitrain.training.distributed_scores`)."""
    totals = np.zeros(4)  # loss sum, correct, rows, ranks that failed to read
    outputs, labels, failure = [], [], None
    units = to_input.output_units(model.reconstruction, model.loss)
    try:
        for logits, loss_labels, batch_labels in scored_batches(model, rows, to_input, batch_size, units):
            loss, correct, _ = model.loss_fn(logits, backend.to_device(loss_labels), model.loss_ws)
            totals[:3] += (float(loss) * len(batch_labels), float(correct), len(batch_labels))
            outputs.append(units.to_data(backend.to_host(outputs_of(logits, target, model.loss)).astype(np.float64)))
            labels.append(batch_labels.astype(np.float64))
    except DataError as e:
        failure = str(e)
    totals[3] = failure is not None
    comm.allreduce_(totals)
    if totals[3]:
        comm.raise_first_failure(failure, DataError)
    width, scored = model.output_shape[0], int(totals[2])  # every rank's rows: all decide the mode alike
    labels, outputs = (np.concatenate(parts or [np.empty((0, width))]).reshape(-1, width) for parts in (labels, outputs))
    kind = scored_as(target)
    metrics, gathered, found = kind_metrics(comm, kind, labels, outputs, scored, max_exact_rows)
    return Evaluation(None, float(totals[0]), scored, None if kind == "regression" else float(totals[1]),
                      metrics, gathered if comm.rank == 0 else None, found if comm.rank == 0 else None)


def kind_metrics(comm, target: str, labels, outputs, scored: int, max_exact_rows: int | None = None):
    """A target kind's metrics of every rank's (labels, outputs), `scored` rows in all (a collective): up to
    `max_exact_rows` (default `MAX_EXACT_ROWS`) exact, gathered on rank 0; above, in the histogram mode, where no row
    leaves its rank but regression's sample for the picture. Returns (metrics, rank 0's gathered predictions or
    None, the histogram mode's curves or None)."""
    limit = MAX_EXACT_ROWS if max_exact_rows is None else max_exact_rows
    if scored <= limit:
        gathered = gather_predictions(comm, labels, outputs, limit)
        return root_metrics(comm, target, *gathered), gathered, None
    metrics, found = histogram_scores(comm, target, labels, outputs)
    step = -(-scored // MAX_SCATTER_POINTS)
    gathered = gather_predictions(comm, labels[::step], outputs[::step]) if target == "regression" else None
    return metrics, gathered, found


def predict(model, rows, to_input, batch_size: int, backend, target: str = "class") \
        -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(predicted, outputs, labels) of this rank's rows, host arrays, by target kind (`mpitrain.rundir.outputs`
    lists them): `outputs` float32 (rows, outputs) as `outputs_of` gives them (probabilities, or regression's values),
    `predicted` their `decisions` (the class, 0/1 labels, or the values), labels int32 (rows,) for class targets,
    float32 (rows, outputs) otherwise."""
    outputs, labels = [], []
    width, units = model.output_shape[0], to_input.output_units(model.reconstruction, model.loss)
    for logits, _, batch_labels in scored_batches(model, rows, to_input, batch_size, units):
        outputs.append(units.to_data(backend.to_host(outputs_of(logits, target, model.loss))).astype(np.float32))
        labels.append(batch_labels.copy() if target == "class" else
                      np.array(batch_labels, np.float32).reshape(-1, width))  # a copy: the batch is reused
    empty = np.empty(0, np.int32) if target == "class" else np.empty((0, width), np.float32)
    outputs = np.concatenate(outputs) if outputs else np.empty((0, width), np.float32)
    return decisions(scored_as(target), outputs), outputs, np.concatenate(labels or [empty])
