"""Distributed evaluation and inference: each rank scores its own rows, the sums are Allreduced."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpitrain.errors import DataError
from mpitrain.kernels.loss import score
from mpitrain.nn.losses import softmax

EVAL_BATCH_SIZE = 256  # rows per batch when scoring: no gradients are kept, so larger than a training batch


@dataclass
class Evaluation:
    """A confusion matrix (rows: true class, columns: predicted) and the summed loss, over all ranks."""

    confusion: np.ndarray
    loss_sum: float

    @property
    def rows(self) -> int:
        return int(self.confusion.sum())

    @property
    def accuracy(self) -> float:
        return float(np.trace(self.confusion)) / self.rows

    @property
    def loss(self) -> float:
        return self.loss_sum / self.rows

    def to_dict(self) -> dict:
        true_counts, predicted_counts = self.confusion.sum(axis=1), self.confusion.sum(axis=0)
        hits = np.diag(self.confusion)
        return {
            "accuracy": self.accuracy, "loss": self.loss, "rows": self.rows,
            "precision": [float(h / p) if p else 0.0 for h, p in zip(hits, predicted_counts)],
            "recall": [float(h / t) if t else 0.0 for h, t in zip(hits, true_counts)],
            "confusion": self.confusion.tolist(),
        }


def batched_logits(model, rows, to_input, batch_size: int):
    """Yield (logits, labels) over this rank's rows (`mpitrain.data.stream.EvalRows`) in order, the last batch possibly
    short. The inputs go into the model's workspace (`to_input(stored, out)`) and the logits are the model's: used
    before the next; labels are a host array, likewise reused."""
    ws = model.workspace.part("evaluation")
    for stored, labels in rows.batches(batch_size):
        x = to_input(stored, ws("input", (len(stored), *model.input_shape), model.params.dtype))
        yield model.forward(x, training=False), labels


def evaluate(model, rows, to_input, batch_size: int, comm, num_classes: int, backend) -> Evaluation:
    """Evaluate on every rank's rows; a collective, so every rank must call it.

    Each batch's loss and (label, prediction) counts are added up on the device by one fused
    kernel (`mpitrain.kernels.loss.score`, counts in float64: exact below 2**53 rows); one copy
    brings them to the host and one Allreduce sums them over the ranks, with a count of ranks
    whose rows could not be read (a shard gone or damaged): then every rank raises that rank's
    error, instead of the others waiting for it.
    """
    size = num_classes * num_classes
    totals = backend.xp.zeros(size + 2, dtype=np.float64)  # the counts, the loss sum, the ranks that failed to read
    failure = None
    try:
        for logits, labels in batched_logits(model, rows, to_input, batch_size):
            score(logits, backend.to_device(labels), totals[:size], totals[size:size + 1])
    except DataError as e:
        failure = str(e)
    totals = backend.to_host(totals)
    totals[-1] = failure is not None
    comm.allreduce_(totals)
    if totals[-1]:
        rank, message = next((r, m) for r, m in enumerate(comm.allgather_obj(failure)) if m)
        raise DataError(f"{message} (seen on rank {rank})")
    return Evaluation(totals[:size].astype(np.int64).reshape(num_classes, num_classes), float(totals[size]))


def predict(model, rows, to_input, batch_size: int, backend) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predicted classes, class probabilities and labels of this rank's rows (host arrays)."""
    probabilities, labels = [], []
    for logits, batch_labels in batched_logits(model, rows, to_input, batch_size):
        probabilities.append(backend.to_host(softmax(logits).astype(np.float32)))
        labels.append(batch_labels.copy())
    probabilities = np.concatenate(probabilities) if probabilities else np.empty((0, model.output_shape[0]), np.float32)
    return probabilities.argmax(axis=1).astype(np.int32), probabilities, np.concatenate(labels or [np.empty(0, np.int32)])
