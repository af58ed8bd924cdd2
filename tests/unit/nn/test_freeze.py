"""Frozen layers (`freeze: true`): they lie first in the flat buffers, backward computes no gradient for the ones
below the first trainable layer, the updater and the synchronizer see the trainable part alone (so a frozen
parameter keeps its value under AdamW's weight decay), the trainable layers' gradients are the unfrozen model's,
and a config says freeze as it says any argument."""
import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.base.errors import ConfigError
from mpitrain.config.on_resume import first_change
from mpitrain.config.sections import ModelConfig, OptimizerConfig, SyncConfig
from mpitrain.nn.graph import build_graph
from mpitrain.nn.model import Sequential, build_model
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.training.steps import WholeBatch
from tests.unit.nn.test_graph import GROUPS, table_rows

LAYERS = [{"type": "dense", "units": 6, "activation": "tanh"}, {"type": "dense", "units": 5, "activation": "relu"},
          {"type": "dense", "units": 3}]


def mlp(frozen=(), dtype="float64"):
    layers = [{**spec, **({"freeze": True} if i in frozen else {})} for i, spec in enumerate(LAYERS)]
    model = build_model(ModelConfig(layers=layers, dtype=dtype), (4,), 3, np)
    model.init_params(0, "xavier")
    return model


def batch(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)), rng.integers(0, 3, n).astype(np.int32)


def same_values(frozen_model, model):
    """Copy `model`'s parameters into `frozen_model` by name (their buffers are in other orders)."""
    for a, b in zip(frozen_model.layers, model.layers):
        for name in a.params:
            a.params[name][...] = b.params[name]


def test_frozen_layers_lie_first_and_the_trainable_part_views_the_rest():
    model = mlp(frozen=[1])
    names = [name for name, _ in model.layout]
    assert names == ["02_dense/W", "02_dense/b", "00_dense/W", "00_dense/b", "04_dense/W", "04_dense/b"]
    part = model.trainable
    assert model.trainable_start == 6 * 5 + 5 and part.n_params == model.n_params - 35
    assert [name for name, _ in part.layout] == names[2:]
    assert np.shares_memory(part.params, model.params) and np.shares_memory(part.grads, model.grads)
    np.testing.assert_array_equal(part.decay_mask, model.decay_mask[35:])
    plain = mlp()
    assert plain.trainable is plain and plain.trainable_start == 0


def test_no_gradient_below_the_first_trainable_layer_and_the_rest_as_unfrozen():
    x, y = batch()
    plain, frozen = mlp(), mlp(frozen=[0])
    same_values(frozen, plain)
    frozen.grads[...] = np.nan  # what backward writes shows; a frozen layer's gradient is never written
    starts = []
    plain.train_batch(x, y)
    loss, _ = frozen.train_batch(x, y, grads_ready=starts.append)
    assert np.isnan(frozen.grads[:frozen.trainable_start]).all()
    for a, b in zip(frozen.layers[2:], plain.layers[2:]):
        for name in a.grads:
            np.testing.assert_allclose(a.grads[name], b.grads[name], rtol=1e-12)
    assert starts == sorted(starts, reverse=True) and starts[-1] == 0  # in the trainable part's coordinates


def test_a_frozen_middle_layer_passes_its_input_gradient_down():
    x, y = batch(1)
    plain, frozen = mlp(), mlp(frozen=[1])
    same_values(frozen, plain)
    plain.train_batch(x, y)
    frozen.train_batch(x, y)
    for i in (0, 4):  # the layers below and above the frozen one
        for name in frozen.layers[i].grads:
            np.testing.assert_allclose(frozen.layers[i].grads[name], plain.layers[i].grads[name], rtol=1e-12)


@pytest.mark.parametrize("mode", ["allreduce", "averaging", "sharing"])
def test_a_frozen_layer_keeps_its_values_under_adamw_in_every_mode(mode):
    model = mlp(frozen=[0], dtype="float32")
    before = {name: value.copy() for name, value in model.layers[0].params.items()}
    trained_before = model.layers[4].params["W"].copy()
    part = model.trainable
    updater = create_updater(OptimizerConfig(type="adamw", lr=0.05, weight_decay=0.5), part.params, part.decay_mask)
    sync = create_synchronizer(SyncConfig(mode=mode, threshold=1e-3),
                               Communicator(MPI.COMM_SELF).for_backend(create_backend("numpy"), False))
    sync.start(part, updater)
    assert updater.state.size == 2 * part.n_params  # no moments for frozen parameters
    for step in range(5):
        x, y = batch(step)
        WholeBatch().step(model, x.astype(np.float32), y, (0, 0, 0, step), None, sync, updater)
    sync.end_epoch(part, updater)
    for name, value in model.layers[0].params.items():
        np.testing.assert_array_equal(value, before[name])
    assert not np.array_equal(model.layers[4].params["W"], trained_before)


def test_a_frozen_graph_embedding_is_no_table_of_the_trainable_part():
    groups = GROUPS
    graph = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 3, "freeze": True},
             {"name": "flat", "type": "flatten", "input": "emb"},
             {"name": "joined", "type": "concat", "inputs": ["flat", "numeric"]},
             {"name": "hidden", "type": "dense", "input": "joined", "units": 5, "activation": "relu"},
             {"name": "out", "type": "dense", "input": "hidden", "units": 1}]
    model = build_graph(ModelConfig(graph=graph, loss="binary_cross_entropy", dtype="float64"), groups, (3,), 1, np)
    assert model.trainable.sparse_tables == [] and model.trainable.dense_start == 0
    assert model.trainable_start == 6 * 3 + 4 * 3
    unfrozen = build_graph(ModelConfig(graph=[{k: v for k, v in node.items() if k != "freeze"} for node in graph],
                                       loss="binary_cross_entropy"), groups, (3,), 1, np)
    assert len(unfrozen.trainable.sparse_tables) == 2 and unfrozen.trainable.dense_start == 30
    rng = np.random.default_rng(0)
    x = table_rows(rng, 4)
    model.init_params(0, "xavier")
    model.grads[...] = np.nan
    model.train_batch(x, rng.integers(0, 2, (4, 1)).astype(np.float64))
    assert np.isnan(model.grads[:30]).all() and np.isfinite(model.trainable.grads).all()  # the node is not run back


def test_freeze_is_checked_and_written_back():
    with pytest.raises(ConfigError, match=r"model.layers\[1\].freeze is 'yes', expected true or false"):
        build_model(ModelConfig(layers=[LAYERS[0], {**LAYERS[1], "freeze": "yes"}, LAYERS[2]]), (4,), 3, np)
    with pytest.raises(ConfigError, match="every layer with parameters is frozen"):
        build_model(ModelConfig(layers=[{**spec, "freeze": True} for spec in LAYERS]), (4,), 3, np)
    specs = mlp(frozen=[0]).layer_specs()
    assert specs[0]["freeze"] is True and all("freeze" not in spec for spec in specs[1:])
    again = Sequential(build_model(ModelConfig(layers=specs), (4,), 3, np).layers, (4,))
    assert again.trainable_start == 4 * 6 + 6


def test_a_resume_may_not_change_what_is_frozen():
    layers = [{"type": "dense", "units": 4}, {"type": "dense", "units": 3}]
    frozen = [{**layers[0], "freeze": True}, layers[1]]
    assert first_change({"model": {"layers": layers}}, {"model": {"layers": frozen}}, mid_epoch=False)[::3] == \
        ("model.layers[0].freeze", "refused")
