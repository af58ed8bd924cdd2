"""`sync.deterministic: true`: `allreduce` whose sums do not depend on the number of ranks, so the same config on 1,
2, 3 or 4 ranks (the global batch fixed) ends with byte-identical parameters.

Three things make a run on R ranks differ from one on 1 rank, and each is taken away:

- **The gradient's sum.** Each rank's batch gradient is a float sum over its rows, and the Allreduce adds the
  ranks' in MPI's order. Here the step's rows are cut into micro-batches of `sync.deterministic_rows` rows, the
  same cut of the global batch at any rank count (`mpitrain.data.order` gives rank r the global batch's rows
  [r G/R, (r+1) G/R)), and their gradients are summed exactly in fixed point (`fixed_point.ExactMean`).
- **The running statistics.** Batch norm normalizes each micro-batch by its own statistics (ghost batch norm,
  Hoffer et al. 2017), and every micro-batch moves the step's starting running statistics; their exact mean is the
  step's new statistics (the same as one move by the micro-batches' mean statistics), the same on every rank.
- **The random draws.** Dropout and augmentation are keyed by the micro-batch's place in the global batch, not by
  the rank (`mpitrain.training.deterministic`, `mpitrain.data.augment`).

What it costs: a forward and backward per micro-batch (small ones run below the CPU's or GPU's best speed), every
micro-batch's gradient kept until the step's end, and int64 on the wire (twice float32's bytes); no overlap with
backward. docs/sync-modes.md#deterministic has the measured price and when to pay it.
"""
from __future__ import annotations

from mpitrain.base.errors import ConfigError
from mpitrain.parallel.sync.base import Synchronizer, apply_update
from mpitrain.parallel.sync.fixed_point import ExactMean


class DeterministicSync(Synchronizer):
    """`allreduce` with `sync.deterministic`: the stepper trains the step's micro-batches one by one and hands each
    to `add_micro`; `step` replaces the gradients and the running statistics by their exact mean over every
    rank's micro-batches, then updates. Parameters, statistics and updater state are identical on every rank at
    every step: nothing is rank-local, and nothing is averaged at an epoch's end (a float mean of identical
    values could round)."""

    rank_local = ()

    @property
    def micro_rows(self) -> int:
        """The rows of each micro-batch whose gradient `add_micro` takes (`sync.deterministic_rows`)."""
        return self.config.deterministic_rows

    def start(self, model, updater) -> None:
        if model.sparse_tables:
            raise ConfigError("sync.deterministic is true, but the model has embedding tables, whose gradients go by "
                              "the rows each batch touched; expected sync.deterministic: false")
        super().start(model, updater)
        self.exact = ExactMean(self.comm, model.layout + model.stats_layout, model.xp)

    def add_micro(self, model) -> None:
        """Keep the gradients and running statistics a micro-batch's forward and backward left. Not a collective."""
        self.exact.add(model.grads, model.stats)

    def step(self, model, updater) -> None:
        """The exact mean of the kept micro-batches into `grads` and `stats`, then the update. A collective."""
        self.exact.mean_(model.grads, model.stats)
        apply_update(model, updater)

    def average_stats(self, model) -> None:
        """Nothing: the running statistics are the same bits on every rank already."""
