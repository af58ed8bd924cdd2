"""Fine-tuning's start (`model.init_from`, `mpitrain.rundir.checkpointer.copy_matching`): every array of a trained
model whose name and shape match is copied exactly, one of another shape is skipped and named, the rest keep their
fresh values; running statistics too."""
import numpy as np

from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential
from mpitrain.rundir.checkpoint import Checkpoint
from mpitrain.rundir.checkpointer import copy_matching


def trained(model) -> Checkpoint:
    model.init_params(7, "xavier")
    model.params[...] = np.random.default_rng(1).normal(size=model.params.size)
    model.stats[...] = np.random.default_rng(2).random(model.stats.size)
    return Checkpoint(model.params.copy(), np.zeros(0, np.float32), 1, 0, 10, list(model.layout),
                      stats=model.stats.copy(), stats_layout=list(model.stats_layout))


def test_matching_arrays_are_copied_exactly_and_the_others_named():
    encoder = trained(Sequential([Dense(8), BatchNorm(), Dense(3)], (5,)))
    head = Sequential([Dense(8), BatchNorm(), Dense(4), Dense(2)], (5,))  # a new head: 02_dense has 4 units now
    head.init_params(0, "xavier")
    fresh = head.params.copy()
    found = copy_matching(head, encoder, np.asarray)
    assert found["copied"] == ["00_dense/W", "00_dense/b", "01_batchnorm/gamma", "01_batchnorm/beta",
                               "01_batchnorm/mean", "01_batchnorm/var"]
    assert found["skipped"] == ["02_dense/W [8, 3] here [8, 4]", "02_dense/b [3] here [4]"]
    assert found["fresh"] == ["03_dense/W", "03_dense/b"]
    start = 5 * 8 + 8 + 8 + 8  # 00_dense W, b; 01_batchnorm gamma, beta
    np.testing.assert_array_equal(head.params[:start], encoder.params[:start])  # bit for bit
    np.testing.assert_array_equal(head.params[start:], fresh[start:])  # the new head as it was initialized
    np.testing.assert_array_equal(head.stats, encoder.stats)
