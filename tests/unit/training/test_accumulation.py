"""Gradient accumulation (train.accumulate): K micro-batches and one update equal one step of the K times larger
batch, up to the order of summation, for an MLP and for an LSTM on padded sequences; the synchronizer is called once
per step; what accumulation cannot serve is refused with the config or the model."""
import dataclasses

import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import Config, DataConfig, ModelConfig, OptimizerConfig, SyncConfig, TrainConfig
from mpitrain.data.sequences import SequenceBatch
from mpitrain.data.shards import InputGroup
from mpitrain.nn.embedding import Embedding
from mpitrain.nn.graph import build_graph
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential
from mpitrain.nn.recurrent import LSTM
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.training.accumulation import Accumulated, micro_batch
from mpitrain.training.steps import WholeBatch, batch_stepper


class CountingSync:
    """A synchronizer on one rank that counts its steps."""

    def __init__(self):
        self.sync = create_synchronizer(SyncConfig(mode="allreduce", bucket_mb=0),
                                        Communicator(MPI.COMM_SELF).for_backend(create_backend("numpy"), False))
        self.steps = 0

    def step(self, model, updater):
        self.steps += 1
        self.sync.step(model, updater)


def trained(model, stepper, batches):
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(type="adam", lr=0.01), model.params, model.decay_mask)
    sync = CountingSync()
    sync.sync.start(model, updater)
    results = [stepper.step(model, x, y, (0, 0, 0, step), None, sync, updater) for step, (x, y) in enumerate(batches)]
    return model.params.copy(), sync.steps, results


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-11), ("float32", 2e-5)])
def test_four_micro_batches_are_one_step_of_the_four_times_larger_batch(dtype, rtol):
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(24, 5)).astype(dtype), rng.integers(0, 3, 24).astype(np.int32)) for _ in range(4)]
    mlp = lambda: Sequential([Dense(8, activation="tanh"), Dense(3)], (5,), dtype=dtype)  # noqa: E731
    whole, whole_steps, whole_results = trained(mlp(), WholeBatch(), batches)
    model = mlp()
    accumulated, steps, results = trained(model, Accumulated(4, model), batches)
    assert whole_steps == steps == 4  # one synchronized update per step, not per micro-batch
    np.testing.assert_allclose(accumulated, whole, rtol=rtol, atol=rtol * 1e-2)
    assert not np.allclose(accumulated, mlp().params)  # it trained
    for (loss, correct), (whole_loss, whole_correct) in zip(results, whole_results):
        assert float(loss) == pytest.approx(float(whole_loss), rel=rtol) and int(correct) == int(whole_correct)


def test_micro_batches_of_padded_sequences_are_the_whole_batchs_step():
    rng = np.random.default_rng(1)
    lengths = rng.integers(2, 9, size=(3, 8))
    batches = []
    for step in range(3):
        values = rng.normal(size=(8, 9, 2))
        values[np.arange(9)[None, :] >= lengths[step][:, None]] = np.nan  # the padding is never read
        batches.append((SequenceBatch(values, lengths[step]), rng.integers(0, 2, 8).astype(np.int32)))
    lstm = lambda: Sequential([LSTM(5), Dense(2)], (None, 2), dtype="float64")  # noqa: E731
    whole, _, _ = trained(lstm(), WholeBatch(), batches)
    model = lstm()
    accumulated, steps, _ = trained(model, Accumulated(2, model), batches)
    assert steps == 3
    np.testing.assert_allclose(accumulated, whole, rtol=1e-11, atol=1e-13)
    part = micro_batch(batches[0][0], slice(4, 8))
    assert part.values.shape == (4, 9, 2) and list(part.lengths) == list(lengths[0][4:])


def test_what_accumulation_cannot_serve_is_refused():
    groups = {"categorical": InputGroup(0, (2,), (6, 4))}
    graph = build_graph(ModelConfig(graph=[{"name": "emb", "type": "embedding", "input": "categorical", "dim": 2},
                                           {"name": "flat", "type": "flatten", "input": "emb"},
                                           {"name": "out", "type": "dense", "input": "flat", "units": 2}]),
                        groups, (2,), 2, np)
    assert any(isinstance(layer, Embedding) for layer in graph.layers)
    with pytest.raises(ConfigError, match="train.accumulate is 2, but the model has embedding tables"):
        batch_stepper(0, graph, None, 2)
    config = Config(data=DataConfig(path="/d"), model=ModelConfig(layers=[{"type": "dense", "units": 2}]),
                    train=TrainConfig(accumulate=2, tbptt_steps=5))
    with pytest.raises(ConfigError, match="run.yaml: train.accumulate is 2, expected 1 with train.tbptt_steps"):
        config.validate("run.yaml")
    assert dataclasses.replace(TrainConfig(), batch_size=16, accumulate=4).global_batch(2) == 128
    model = Sequential([Dense(2)], (3,))
    with pytest.raises(ConfigError, match="a step has 10 rows on this rank; expected a multiple of it"):
        Accumulated(4, model).step(model, np.zeros((10, 3), np.float32), np.zeros(10, np.int32), (0,), None, None,
                                   None)
