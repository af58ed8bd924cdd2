"""The step of `sync.deterministic` (`mpitrain.parallel.sync.deterministic`): the rank's rows as micro-batches of
`sync.deterministic_rows`, each keyed by its place in the global batch, not by the rank.

    stepper = DeterministicStep(model, comm, sync.micro_rows, rank_rows)
    loss, correct = stepper.step(model, x, y, key, grads_ready, sync, updater)   # a collective: the sync step

Rank r of R holds rows [r G/R, (r+1) G/R) of global batch G (`mpitrain.data.order`), so its micro-batch k is the
global batch's micro-batch r G/(R m) + k whatever R is. That index takes the rank's place in the dropout key
(seed, index, epoch, step) and in the augmentation's (`Batches(augment_rows=m)`). Each micro-batch starts from the
step's running statistics (batch norm's), restored before its forward; the synchronizer keeps what each one
leaves (gradients, statistics) and its step puts their exact mean back.
"""
from __future__ import annotations

from mpitrain.base.errors import ConfigError
from mpitrain.training.accumulation import micro_batch


class DeterministicStep:
    """Steps of `rank_rows` rows on this rank as micro-batches of `rows` (see the module docstring)."""

    def __init__(self, model, comm, rows: int, rank_rows: int):
        if rank_rows % rows:
            raise ConfigError(f"sync.deterministic_rows is {rows}, but each of the {comm.size} ranks trains on "
                              f"{rank_rows} rows per step (train.global_batch_size / ranks); expected a divisor of "
                              f"{rank_rows}")
        self.rows, self.micro_batches = rows, rank_rows // rows
        self.first = comm.rank * self.micro_batches  # this rank's first micro-batch in the global batch
        stats = model.stats
        self.start_stats = model.workspace.part("deterministic")("start_stats", stats.shape, stats.dtype)

    def micro_rows(self, rows: int) -> int:
        """The rows of one forward and backward of a step of `rows` rows."""
        return self.rows

    def step(self, model, x, y, key: tuple, grads_ready, sync, updater):
        """Train on this rank's rows (`x`, `y`) micro-batch by micro-batch and update once (a collective: the sync
        step). `key` is the loop's (seed, rank, epoch, step); each micro-batch's has its global index for the rank.
        Returns the micro-batches' mean loss and their correct predictions, on the device."""
        seed, _, epoch, step = key
        trained = model.trainable
        self.start_stats[...] = model.stats
        loss_sum = correct_sum = 0
        for k in range(self.micro_batches):
            if k:
                model.stats[...] = self.start_stats
            part = slice(k * self.rows, (k + 1) * self.rows)
            loss, correct = model.train_batch(micro_batch(x, part), y[part], key=(seed, self.first + k, epoch, step))
            sync.add_micro(trained)
            loss_sum, correct_sum = loss_sum + loss, correct_sum + correct
        sync.step(trained, updater)
        return loss_sum / self.micro_batches, correct_sum
