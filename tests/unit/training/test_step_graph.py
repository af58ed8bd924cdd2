"""The graphed training step (train.cuda_graph, mpitrain/training/step_graph.py) on the CPU: which runs qualify,
what the graphed step does with its static buffers (through `ReplayGraphs`, the stand-in that leaves outputs and
gradients unwritten at capture as a CUDA capture does), and its fallback when a capture fails. A device replays
real graphs in the GPU check (tests/system/test_gpu_graphs.py)."""
import dataclasses
import logging

import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import OptimizerConfig, SyncConfig
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import Conv2D, MaxPool2D
from mpitrain.nn.layers import DROPOUT_BLOCKER, Dense, Dropout, Flatten
from mpitrain.nn.model import Sequential
from mpitrain.nn.sequence import GlobalAvgPool1D
from mpitrain.nn.transformer import Transformer
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.testing.graph_replay import ReplayGraphs
from mpitrain.training import step_graph
from mpitrain.training.accumulation import Accumulated
from mpitrain.training.step_graph import GraphedStep, graph_blockers, graphed
from mpitrain.training.steps import WholeBatch

SHAPES = [16, 16, 16, 16, 7, 16, 7, 7, 16, 7]  # rows of each step: the full batch and the last short one


def mlp():
    return Sequential([Dense(8, activation="relu"), Dense(3)], (5,), dtype="float64")


def cnn():
    return Sequential([Conv2D(4, kernel=3, activation="relu"), BatchNorm(), MaxPool2D(pool=2), Flatten(), Dense(3)],
                      (1, 8, 8), dtype="float64")


def batches(model, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(rows, *model.input_shape)), rng.integers(0, 3, rows).astype(np.int32))
            for rows in SHAPES]


def trained(model, stepper):
    """Train `model` on `batches(model)` one step each with `stepper`: (params, stats, [(loss, correct)])."""
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(type="adam", lr=0.01), model.params, model.decay_mask)
    sync = create_synchronizer(SyncConfig(mode="allreduce", bucket_mb=0),
                               Communicator(MPI.COMM_SELF).for_backend(create_backend("numpy"), False))
    sync.start(model.trainable, updater)
    results = []
    for step, (x, y) in enumerate(batches(model)):
        loss, correct = stepper.step(model, x, y, (0, 0, 0, step), None, sync, updater)
        results.append((loss, correct))
    return model.params.copy(), model.stats.copy(), [(float(loss), int(correct)) for loss, correct in results]


@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "batchnorm cnn"])
def test_replays_train_as_the_uncaptured_steps_do(build):
    params, stats, results = trained(build(), WholeBatch())
    model = build()
    graphs = ReplayGraphs(kept=[model.stats], poisoned=[model.grads])
    graphed_params, graphed_stats, graphed_results = trained(model, GraphedStep(graphs))
    assert graphs.captures == 2  # each shape after its two eager steps
    assert graphs.launches == 6  # 16 rows: steps 3 (captured), 4, 6 and 9; 7 rows: steps 8 (captured) and 10
    assert np.array_equal(graphed_params, params) and np.array_equal(graphed_stats, stats)
    assert graphed_results == results
    assert not np.array_equal(params, build().params)  # it trained


def test_a_step_returns_its_own_loss_not_the_graphs():
    model = mlp()
    stepper = GraphedStep(ReplayGraphs(poisoned=[model.grads]), warmup=0)
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(type="sgd", lr=0.1), model.params, model.decay_mask)
    sync = create_synchronizer(SyncConfig(mode="allreduce", bucket_mb=0),
                               Communicator(MPI.COMM_SELF).for_backend(create_backend("numpy"), False))
    sync.start(model.trainable, updater)
    (x, y), (x2, y2) = batches(model)[:2]
    first, _ = stepper.step(model, x, y, (0,), None, sync, updater)
    kept = float(first)
    second, _ = stepper.step(model, x2, y2, (0,), None, sync, updater)
    (captured,) = stepper.captured.values()
    assert first is not captured.outputs[0] and float(first) == kept != float(second)


def test_shapes_past_the_limit_and_batches_of_sequences_run_uncaptured():
    params, _, results = trained(mlp(), WholeBatch())
    graphs = ReplayGraphs()
    stepper = GraphedStep(graphs, max_shapes=1)
    graphed_params, _, graphed_results = trained(mlp(), stepper)
    assert graphs.captures == 1 and stepper.eager[((7, 5), "<f8"), ((7,), "<i4")] == 4
    assert np.array_equal(graphed_params, params) and graphed_results == results
    assert step_graph.batch_shape(object(), np.zeros(3)) is None  # a SequenceBatch: no graph


def test_a_failed_capture_runs_uncaptured_or_stops(caplog):
    params, _, results = trained(mlp(), WholeBatch())
    graphs = ReplayGraphs()
    graphs.failure = RuntimeError("cudaErrorStreamCaptureUnsupported")
    stepper = GraphedStep(graphs)
    with caplog.at_level(logging.WARNING, logger="mpitrain.training.step_graph"):
        graphed_params, _, graphed_results = trained(mlp(), stepper)
    assert np.array_equal(graphed_params, params) and graphed_results == results
    assert len(stepper.refused) == 2 and not stepper.captured
    failures = [r.getMessage() for r in caplog.records if "capture failed" in r.getMessage()]
    assert len(failures) == 2 and "cudaErrorStreamCaptureUnsupported" in failures[0]
    with pytest.raises(ConfigError, match=r"train.cuda_graph: true, but the step of batches \(\(16, 5\), '<f8'\)"):
        trained(mlp(), GraphedStep(graphs, required=True))


@dataclasses.dataclass
class Device:
    """A backend as `graph_blockers` reads it."""

    name: str = "cupy"
    on_gpu: bool = True


@pytest.fixture
def nvmath_installed(monkeypatch):
    monkeypatch.setattr(step_graph, "gemm_unavailable", lambda: None)


def test_which_runs_qualify(nvmath_installed):
    model = mlp()
    assert graph_blockers(WholeBatch(), model, Device()) == []
    assert graph_blockers(WholeBatch(), cnn(), Device()) == []
    assert graph_blockers(WholeBatch(), Sequential([Dense(8), Dropout(0.0), Dense(3)], (5,)), Device()) == []
    dropout = Sequential([Dense(8), Dropout(0.5), Dense(3)], (5,))
    assert graph_blockers(WholeBatch(), dropout, Device()) == [f"layer 01_dropout: {DROPOUT_BLOCKER}"]
    transformer = Sequential([Transformer(heads=2, ff_units=8, rate=0.1), GlobalAvgPool1D(), Dense(3)], (None, 4))
    (reason,) = graph_blockers(WholeBatch(), transformer, Device())
    assert reason.startswith("layer 00_transformer: dropout at a rate above 0")
    assert graph_blockers(Accumulated(2, model), model, Device())[0].startswith("a step of several forward")
    assert graph_blockers(WholeBatch(), model, Device("numpy", False)) == [
        "the backend is numpy: a CUDA graph needs the cupy backend on a GPU"]


def test_nvmath_missing_blocks(monkeypatch):
    monkeypatch.setattr(step_graph, "gemm_unavailable", lambda: "nvmath-python is not installed")
    assert graph_blockers(WholeBatch(), mlp(), Device()) == ["nvmath-python is not installed"]


def test_the_setting(nvmath_installed, caplog):
    model, whole = mlp(), WholeBatch()
    graphs = ReplayGraphs()
    assert graphed(False, whole, model, Device(), graphs) is whole
    assert isinstance(graphed("auto", whole, model, Device(), graphs), GraphedStep)
    assert graphed(True, whole, model, Device(), graphs).required
    dropout = Sequential([Dense(8), Dropout(0.5), Dense(3)], (5,))
    with caplog.at_level(logging.INFO, logger="mpitrain.training.step_graph"):
        assert graphed("auto", whole, dropout, Device(), graphs) is whole
    assert "the step runs uncaptured: layer 01_dropout: dropout" in caplog.text
    with pytest.raises(ConfigError, match="train.cuda_graph: true, but the step cannot be captured: layer 01_dropout"):
        graphed(True, whole, dropout, Device(), graphs)
    assert graphed("auto", whole, model, Device("numpy", False), graphs) is whole  # the CPU: silently uncaptured
