"""Distributed evaluation and inference: each rank scores its own rows, the sums are Allreduced."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpitrain.backend import to_host
from mpitrain.nn.losses import per_row_cross_entropy, softmax


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
    """Yield (logits, labels) over this rank's rows in order, the last batch possibly short."""
    for start in range(0, len(rows.y), batch_size):
        x = to_input(rows.x[start:start + batch_size])
        yield model.forward(x, training=False), rows.y[start:start + batch_size]


def evaluate(model, rows, to_input, batch_size: int, comm, num_classes: int) -> Evaluation:
    """Evaluate on every rank's rows; a collective, so every rank must call it."""
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    loss_sum = np.zeros(1)
    xp = model.xp
    for logits, labels in batched_logits(model, rows, to_input, batch_size):
        labels_dev = xp.asarray(labels)
        loss_sum += float(per_row_cross_entropy(logits, labels_dev).sum())
        predicted = to_host(logits.argmax(axis=1))
        np.add.at(confusion, (labels, predicted), 1)
    comm.allreduce_(confusion)
    comm.allreduce_(loss_sum)
    return Evaluation(confusion, float(loss_sum[0]))


def predict(model, rows, to_input, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Predicted classes and class probabilities for this rank's rows (host arrays)."""
    classes, probabilities = [], []
    for logits, _ in batched_logits(model, rows, to_input, batch_size):
        probabilities.append(to_host(softmax(logits)).astype(np.float32))
        classes.append(probabilities[-1].argmax(axis=1).astype(np.int32))
    return np.concatenate(classes), np.concatenate(probabilities)
