"""Truncated BPTT steps (mpitrain/training/tbptt.py) on one rank (COMM_SELF): a segment as long as the batch is
exactly an ordinary step; shorter segments update once each, and the step's loss is the batch's mean over its valid
steps; the segment count is the one the ranks agree on, a rank without steps left updating on zero gradients; a
dataset without a class per step is refused."""
import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import OptimizerConfig, SyncConfig
from mpitrain.nn.layers import Dense, Dropout
from mpitrain.nn.model import Sequential
from mpitrain.nn.recurrent import LSTM
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.testing.sequences import padded_batch, tagged_sequences
from mpitrain.training.steps import WholeBatch, batch_stepper
from mpitrain.training.tbptt import TruncatedBPTT, check_dataset


def one_rank():
    return Communicator(MPI.COMM_SELF).for_backend(create_backend("numpy"), False)


def trainer(lr: float = 0.05, rate: float = 0.3):
    """An LSTM tagger with dropout of `rate` (float64), its Adam updater and an overlapped allreduce on one rank."""
    model = Sequential([LSTM(6, return_sequences=True), Dropout(rate), Dense(2)], (None, 2), dtype="float64")
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(type="adam", lr=lr), model.params, model.decay_mask)
    sync = create_synchronizer(SyncConfig(mode="allreduce", bucket_mb=0), one_rank())
    sync.start(model, updater)
    return model, updater, sync


def batches(count: int = 3, rows: int = 6, seed: int = 0):
    """Batches of the tagged rule (a class per step, -1 at padding), padded to 16 steps."""
    sequences, tags = tagged_sequences(count * rows, seed, lengths=(3, 16))
    for b in range(count):
        yield padded_batch(sequences[b * rows:(b + 1) * rows], tags[b * rows:(b + 1) * rows], 16)


def train(stepper, lr: float = 0.05, rate: float = 0.3, **kwargs):
    model, updater, sync = trainer(lr, rate)
    grads_ready = lambda start: sync.grads_ready(model, start)  # noqa: E731
    results = [stepper(model).step(model, x, y, (0, 0, 0, step), grads_ready, sync, updater)
               for step, (x, y) in enumerate(batches(**kwargs))]
    return model, updater, results


@pytest.mark.parametrize("steps", [16, 40])
def test_a_segment_as_long_as_the_batch_is_an_ordinary_step(steps):
    whole, whole_updater, expected = train(lambda model: WholeBatch())
    truncated, updater, got = train(lambda model: TruncatedBPTT(steps, model, one_rank()))
    np.testing.assert_array_equal(truncated.params, whole.params)  # dropout's keys included
    assert updater.iteration == whole_updater.iteration == 3
    for (loss, correct), (expected_loss, expected_correct) in zip(got, expected):
        np.testing.assert_allclose([loss, correct], [expected_loss, expected_correct], rtol=1e-12)


def test_shorter_segments_update_once_each_and_the_loss_is_the_batchs_mean_over_valid_steps():
    """At a learning rate too small to move anything (and no dropout, whose masks differ by segment), the segments'
    weighted losses are the whole batch's loss (the states carried); at an ordinary one, each segment's update
    changes what the next segment sees."""
    lr = 1e-30
    _, _, expected = train(lambda model: WholeBatch(), lr, rate=0.0)
    _, updater, got = train(lambda model: TruncatedBPTT(5, model, one_rank()), lr, rate=0.0)
    longest = [int(x.lengths.max()) for x, _ in batches()]
    assert updater.iteration == sum(-(-n // 5) for n in longest) > 3
    for (loss, correct), (expected_loss, expected_correct) in zip(got, expected):
        np.testing.assert_allclose([loss, correct], [expected_loss, expected_correct], rtol=1e-12)
    whole, _, _ = train(lambda model: WholeBatch())
    truncated, _, _ = train(lambda model: TruncatedBPTT(5, model, one_rank()))
    assert np.abs(truncated.params - whole.params).max() > 1e-3


class _LongerElsewhere:
    """Another rank's batch holds a sequence of `longest` steps."""

    def __init__(self, longest: int):
        self.longest = longest

    def max(self, value):
        return max(value, self.longest)


class _Recorded:
    """A synchronizer that records the gradient of each of its steps."""

    def __init__(self, sync):
        self.sync, self.grads = sync, []

    def grads_ready(self, model, start):
        self.sync.grads_ready(model, start)

    def step(self, model, updater):
        self.grads.append(model.grads.copy())
        self.sync.step(model, updater)


def test_every_rank_runs_the_agreed_segments_with_zero_gradients_past_its_own_sequences():
    model, updater, sync = trainer()
    recorded = _Recorded(sync)
    x, y = next(batches())
    longest = int(x.lengths.max())
    model.grads[...] = 1.0  # whatever a segment before left there
    loss, correct = TruncatedBPTT(4, model, _LongerElsewhere(37)).step(
        model, x, y, (0, 0, 0, 0), lambda start: recorded.grads_ready(model, start), recorded, updater)
    assert len(recorded.grads) == -(-37 // 4)  # the agreed count, not this rank's
    own = -(-longest // 4)
    assert all(np.abs(g).max() > 0 for g in recorded.grads[:own])
    assert all(not g.any() for g in recorded.grads[own:])
    assert np.isfinite(loss) and 0 <= correct <= len(x)


def test_a_dataset_without_a_class_per_step_is_refused():
    class Manifest:
        step_target = ""
    with pytest.raises(ConfigError, match=r"^train.tbptt_steps is 8, but data/motifs has no class per step .*; "
                                          r"expected train.tbptt_steps: 0$"):
        check_dataset(8, Manifest(), "data/motifs")
    check_dataset(0, Manifest(), "data/motifs")
    Manifest.step_target = "tags"
    check_dataset(8, Manifest(), "data/tagged")
    assert type(batch_stepper(0, None, None)) is WholeBatch
