"""A training step on its batch: whole, by truncated backpropagation through time (`train.tbptt_steps`), or in
micro-batches (`train.accumulate`). Every stepper has the one method the loop calls:

    stepper = batch_stepper(config.train.tbptt_steps, model, comm, config.train.accumulate)
    loss, correct = stepper.step(model, x, y, key, grads_ready, sync, updater)   # a collective: the sync step(s)
"""
from __future__ import annotations

import typing

from mpitrain.training.accumulation import Accumulated
from mpitrain.training.tbptt import TruncatedBPTT


class Stepper(typing.Protocol):
    def step(self, model, x, y, key: tuple, grads_ready, sync, updater):
        """Train on batch (`x`, `y`) and update (a collective: the sync steps of `model.trainable`); (mean loss,
        correct) on the device; `key` seeds dropout (`Network.train_batch`)."""


class WholeBatch:
    """A step as one forward and backward on the whole batch, then the sync step."""

    def step(self, model, x, y, key: tuple, grads_ready, sync, updater):
        """Train on batch (`x`, `y`) and update (a collective: the sync step); (mean loss, correct) on the device;
        `key` seeds dropout (`Network.train_batch`)."""
        loss, correct = model.train_batch(x, y, key=key, grads_ready=grads_ready)
        sync.step(model.trainable, updater)
        return loss, correct


def batch_stepper(steps: int, model, comm, accumulate: int = 1) -> Stepper:
    """The step of `train.tbptt_steps` `steps` and `train.accumulate`: truncated BPTT over `comm`, micro-batches
    accumulated, or whole batches. (The config refuses both at once.)"""
    if steps:
        return TruncatedBPTT(steps, model, comm)
    if accumulate > 1:
        return Accumulated(accumulate, model)
    return WholeBatch()
