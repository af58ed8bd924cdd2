"""A training step by truncated backpropagation through time (`train.tbptt_steps`, K; docs/sequences.md,
"Truncated backpropagation through time"); `mpitrain.training.steps` picks it.

    stepper = TruncatedBPTT(K, model, comm)
    loss, correct = stepper.step(model, x, y, key, grads_ready, sync, updater)

Truncated, a batch's sequences are cut into segments of K steps (`mpitrain.nn.segments`); each segment is a
forward that starts from the recurrent layers' states at the end of the segment before (zeros for the first), a
backward over the segment alone, then the sync step (a parameter update). A step is still one batch.

Every rank runs the same number of segments, so the same collectives: ceil(L / K), L the longest sequence of the
global batch, agreed by one Allreduce (MAX) of each rank's longest per step. A rank whose sequences all ended
before a segment takes that segment's sync step with a zero gradient, without a forward. The step's loss and
correct count are the segments', weighted by their valid steps: the mean over the batch's valid steps, as an
ordinary step's (each segment's at the parameters it ran with).
"""
from __future__ import annotations

from mpitrain.base.errors import ConfigError
from mpitrain.nn.segments import Segments


def check_dataset(steps: int, manifest, path: str) -> None:
    """Refuse truncated BPTT (`steps` > 0) on a dataset without a class per step (`manifest.step_target`): a target
    per sequence has its loss at each sequence's end, so the segments before it would update on no gradient (an
    updater with momentum would still move). A ConfigError naming the key. Not a collective."""
    if steps and not manifest.step_target:
        raise ConfigError(f"train.tbptt_steps is {steps}, but {path} has no class per step (a --label column of a "
                          "class per step beside the sequence: docs/sequences.md); expected train.tbptt_steps: 0")


class TruncatedBPTT:
    """A step in segments of `steps` time steps of `model`'s batches (the module's docstring), the count agreed
    over `comm`."""

    def __init__(self, steps: int, model, comm):
        self.segments, self.comm = Segments(model, steps), comm

    def micro_rows(self, rows: int) -> int:
        """The rows of one forward and backward of a step of `rows` rows: all of them, segment by segment."""
        return rows

    def step(self, model, x, y, key: tuple, grads_ready, sync, updater):
        """Train on batch (`x` a SequenceBatch, `y` its classes per step) segment by segment, a sync step after each.
        A collective: one Allreduce of the longest sequence, then as many sync steps on every rank. Returns the
        (loss, correct) of the batch's valid steps on the device; segment 0 seeds dropout with `key`, segment s > 0
        with `(*key, s)`, so a batch of one segment is exactly an ordinary step."""
        longest = int(x.lengths.max())  # the one copy to the host a step on a GPU makes here
        loss_sum = correct_sum = valid = 0
        try:
            for s in range(self.segments.count(self.comm.max(longest))):
                if s * self.segments.steps >= longest:  # this rank's sequences have ended; the other ranks' go on
                    model.grads[...] = 0
                    sync.step(model.trainable, updater)
                    continue
                batch, classes = self.segments.cut(x, y, s)
                loss, correct = model.train_batch(batch, classes, key=(*key, s) if s else key, grads_ready=grads_ready)
                self.segments.keep()
                sync.step(model.trainable, updater)
                steps = batch.lengths.sum()
                loss_sum, correct_sum, valid = loss_sum + loss * steps, correct_sum + correct * steps, valid + steps
        finally:
            self.segments.reset()
        return (loss_sum / valid).astype(loss.dtype), (correct_sum / valid).astype(loss.dtype)
