"""The step before the first timed one (`mpitrain.training.loop._warm_up`): it compiles the step's kernels and fills
the workspace on a batch of zeros, and leaves the parameters, the running statistics (batch norm's) and the
gradients as they were, so training goes on bit for bit."""
import types

import numpy as np

from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.layers import Dense, Dropout
from mpitrain.nn.model import Sequential
from mpitrain.training.accumulation import Accumulated
from mpitrain.training.loop import _warm_up


class ZeroBatches:
    """Batches of zeros; `warm_up` counted."""

    def __init__(self, rows: int):
        self.rows, self.warmed = rows, 0

    def warm_up(self):
        self.warmed += 1

    def zeros(self):
        return np.zeros((self.rows, 4), np.float32), np.zeros(self.rows, np.int32)


def test_the_warm_up_step_changes_no_state_and_takes_one_micro_batch():
    model = Sequential([Dense(6), BatchNorm(), Dropout(0.3), Dense(3)], (4,))
    model.init_params(0, "xavier")
    model.stats[...] = np.random.default_rng(0).random(model.stats.size)
    model.grads[...] = 1.0
    params, stats = model.params.copy(), model.stats.copy()
    run = types.SimpleNamespace(model=model)
    batches = ZeroBatches(32)
    _warm_up(run, batches, Accumulated(4, model), (0, 0, 0, 0))
    assert batches.warmed == 1  # the batch's own kernels too
    assert np.array_equal(model.params, params) and np.array_equal(model.stats, stats)
    assert not model.grads.any()
    shapes = {shape for _, _, shape, _, _ in model.workspace.table()}
    assert (8, 6) in shapes and (32, 6) not in shapes  # a micro-batch's arrays (32 rows / accumulate 4)
