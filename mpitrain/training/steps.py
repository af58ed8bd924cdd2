"""A training step on its batch: whole, by truncated backpropagation through time (`train.tbptt_steps`), in
micro-batches (`train.accumulate`), or in micro-batches summed exactly (`sync.deterministic`). Every stepper has
the methods the loop calls:

    stepper = batch_stepper(config.train.tbptt_steps, model, comm, config.train.accumulate, sync, rank_rows)
    loss, correct = stepper.step(model, x, y, key, grads_ready, sync, updater)   # a collective: the sync step(s)
    stepper.micro_rows(rows)                  # the rows of one forward and backward (the warm-up's)
"""
from __future__ import annotations

import typing

from mpitrain.training.accumulation import Accumulated
from mpitrain.training.deterministic import DeterministicStep
from mpitrain.training.tbptt import TruncatedBPTT


class Stepper(typing.Protocol):
    def step(self, model, x, y, key: tuple, grads_ready, sync, updater):
        """Train on batch (`x`, `y`) and update (a collective: the sync steps of `model.trainable`); (mean loss,
        correct) on the device; `key`, (seed, rank, epoch, step), seeds dropout (`Network.train_batch`)."""

    def micro_rows(self, rows: int) -> int:
        """The rows of one forward and backward of a step of `rows` rows."""


class WholeBatch:
    """A step as one forward and backward on the whole batch, then the sync step."""

    def step(self, model, x, y, key: tuple, grads_ready, sync, updater):
        """Train on batch (`x`, `y`) and update (a collective: the sync step); (mean loss, correct) on the device;
        `key` seeds dropout (`Network.train_batch`)."""
        loss, correct = model.train_batch(x, y, key=key, grads_ready=grads_ready)
        sync.step(model.trainable, updater)
        return loss, correct

    def micro_rows(self, rows: int) -> int:
        return rows


def batch_stepper(steps: int, model, comm, accumulate: int = 1, sync=None, rank_rows: int = 0) -> Stepper:
    """The step of `train.tbptt_steps` `steps`, `train.accumulate` and `sync` (its `micro_rows`): truncated BPTT over
    `comm`, micro-batches accumulated, micro-batches of `rank_rows` summed exactly, or whole batches. (The config
    refuses any two at once.)"""
    if sync is not None and sync.micro_rows:
        return DeterministicStep(model, comm, sync.micro_rows, rank_rows)
    if steps:
        return TruncatedBPTT(steps, model, comm)
    if accumulate > 1:
        return Accumulated(accumulate, model)
    return WholeBatch()
