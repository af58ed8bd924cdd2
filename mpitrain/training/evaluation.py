"""Distributed evaluation and inference: each rank scores its own rows, the sums are Allreduced."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    """Yield (logits, row range) over this rank's rows in order, the last batch possibly short. The inputs go
    into the model's workspace (`to_input(stored, out)`) and the logits are the model's: used before the next."""
    ws = model.workspace.part("evaluation")
    for start in range(0, len(rows.y), batch_size):
        batch = slice(start, start + batch_size)
        stored = rows.x[batch]
        x = to_input(stored, ws("input", (len(stored), *model.input_shape), model.params.dtype))
        yield model.forward(x, training=False), batch


def evaluate(model, rows, to_input, batch_size: int, comm, num_classes: int, backend) -> Evaluation:
    """Evaluate on every rank's rows; a collective, so every rank must call it.

    Each batch's loss and (label, prediction) counts are added up on the device by one fused
    kernel (`mpitrain.kernels.loss.score`, counts in float64: exact below 2**53 rows); one copy
    brings them to the host and one Allreduce sums them over the ranks.
    """
    labels = backend.to_device(rows.y)
    totals = backend.xp.zeros(num_classes * num_classes + 1, dtype=np.float64)  # the counts, then the loss sum
    for logits, batch in batched_logits(model, rows, to_input, batch_size):
        score(logits, labels[batch], totals[:-1], totals[-1:])
    totals = backend.to_host(totals)
    comm.allreduce_(totals)
    return Evaluation(totals[:-1].astype(np.int64).reshape(num_classes, num_classes), float(totals[-1]))


def predict(model, rows, to_input, batch_size: int, backend) -> tuple[np.ndarray, np.ndarray]:
    """Predicted classes and class probabilities for this rank's rows (host arrays)."""
    batches = batched_logits(model, rows, to_input, batch_size)
    probabilities = backend.to_host(backend.xp.concatenate([softmax(logits).astype(np.float32)
                                                            for logits, _ in batches]))
    return probabilities.argmax(axis=1).astype(np.int32), probabilities
