"""Gradient accumulation (`train.accumulate`, K): a step as K micro-batches, their gradients averaged, one update.

    stepper = Accumulated(K, model)
    loss, correct = stepper.step(model, x, y, key, grads_ready, sync, updater)   # x: the step's K x B rows

A step's batch holds the rows of one update (K micro-batches of `train.batch_size`); each micro-batch is a forward
and backward of its own, so activations take the memory of one, and its gradient is added to a sum in the
model's workspace. The mean of the K gradients is the gradient of the whole batch's mean loss, up to the order of
summation, and goes to the synchronizer once: every sync mode communicates once per update, as a step of K times
the batch would. The backward hook that overlaps `allreduce` with backward is not passed on (the buckets hold the
sum only after the last micro-batch), so that step's Allreduce is the blocking one. Micro-batch k > 0 seeds
dropout with `(*key, k)`, so K = 1 is exactly an ordinary step. Batch norm normalizes each micro-batch by its own
statistics, as under PyTorch's accumulation.
"""
from __future__ import annotations

from mpitrain.base.errors import ConfigError


def micro_batch(x, rows: slice):
    """Rows `rows` of a batch: an array's, or each part's of a SequenceBatch or Inputs (its padding kept)."""
    if hasattr(x, "columns"):
        return type(x)(x.x[rows], {name: micro_batch(batch, rows) for name, batch in x.columns.items()})
    if hasattr(x, "lengths"):
        return type(x)(x.values[rows], x.lengths[rows])
    return x[rows]


class Accumulated:
    """A step of `micro_batches` micro-batches (the module docstring) of `model`, whose gradient sum is kept in its
    workspace part `accumulation`."""

    def __init__(self, micro_batches: int, model):
        if model.trainable.sparse_tables:
            raise ConfigError(f"train.accumulate is {micro_batches}, but the model has embedding tables, whose "
                              "gradients go by the rows each batch touched; expected train.accumulate: 1 (or a "
                              "larger train.batch_size)")
        self.micro_batches = micro_batches
        grads = model.trainable.grads  # a frozen layer's gradients are no one's
        self.total = model.workspace.part("accumulation")("gradient_sum", grads.shape, grads.dtype)

    def micro_rows(self, rows: int) -> int:
        """The rows of one forward and backward of a step of `rows` rows."""
        return rows // self.micro_batches

    def step(self, model, x, y, key: tuple, grads_ready, sync, updater):
        """Train on the step's rows (`x`, `y`: K micro-batches, this rank's) and update once (a collective: the sync
        step). Returns the micro-batches' mean loss and their correct predictions, on the device."""
        rows = len(y)
        if rows % self.micro_batches:
            raise ConfigError(f"train.accumulate is {self.micro_batches}, but a step has {rows} rows on this rank; "
                              "expected a multiple of it (train.global_batch_size divisible by the ranks x "
                              "train.accumulate)")
        size, trained = rows // self.micro_batches, model.trainable
        loss_sum = correct_sum = 0
        for k in range(self.micro_batches):
            part = slice(k * size, (k + 1) * size)
            loss, correct = model.train_batch(micro_batch(x, part), y[part], key=(*key, k) if k else key)
            if k:
                self.total += trained.grads
            else:
                self.total[...] = trained.grads
            loss_sum, correct_sum = loss_sum + loss, correct_sum + correct
        trained.grads[...] = self.total
        trained.grads /= self.micro_batches
        sync.step(trained, updater)
        return loss_sum / self.micro_batches, correct_sum
