"""The [CLS] token (`cls_token`, `cls_pool`): float64 gradients against central differences on padded sequences,
the pooled output's independence of padding, the lengths one step longer (a graph refuses to merge it with its
column step by step), positions counting the token, and the config's checks. ONNX: tests/unit/rundir/
test_export_sequence.py."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.nn.attention import Attention
from mpitrain.nn.cls_token import ClsPool, ClsToken
from mpitrain.nn.graph import build_network
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import build_model
from mpitrain.nn.segments import check_layers
from mpitrain.nn.transformer import Transformer
from mpitrain.testing.gradients import check_sequence_gradients, sequence_model, sequences
from tests.unit.nn.test_graph_sequences import manifest

RAGGED = np.array([5, 1, 3])


@pytest.mark.parametrize("lengths", [RAGGED, None], ids=["masked", "unmasked"])
def test_gradients_on_padded_sequences(lengths):
    check_sequence_gradients([Dense(4), ClsToken(), Attention(heads=2), ClsPool(), Dense(3)], features=3,
                             lengths=lengths, steps=6)


def test_the_token_is_step_zero_and_the_lengths_grow_by_one():
    layer = ClsToken()
    layer.bind({"token": np.array([7.0, 8.0])}, {"token": np.zeros(2)})
    x = np.arange(12.0).reshape(2, 3, 2)
    y = layer.forward(x, training=True)
    np.testing.assert_array_equal(y[:, 0], [[7, 8], [7, 8]])
    np.testing.assert_array_equal(y[:, 1:], x)
    np.testing.assert_array_equal(layer.output_lengths(np.array([3, 1])), [4, 2])
    dx = layer.backward(np.arange(16.0).reshape(2, 4, 2))
    np.testing.assert_array_equal(layer.grads["token"], [0 + 8, 1 + 9])
    np.testing.assert_array_equal(dx, np.arange(16.0).reshape(2, 4, 2)[:, 1:])


def test_the_pooled_token_does_not_depend_on_padding():
    model = sequence_model([Dense(4), ClsToken(), Transformer(heads=2, ff_units=6), ClsPool(), Dense(3)], 3)
    rng = np.random.default_rng(2)
    x, lengths = rng.normal(size=(2, 5, 3)), np.array([5, 2])
    short = model.forward(sequences(x, lengths), training=False).copy()
    garbage = np.concatenate([x, rng.normal(0, 100, size=(2, 6, 3))], axis=1)
    garbage[1, 2:] = rng.normal(0, 100, size=(9, 3))
    np.testing.assert_allclose(model.forward(sequences(garbage, lengths), training=False), short, rtol=0, atol=1e-12)


def test_positions_after_the_token_count_it():
    layers = [{"type": "cls_token"}, {"type": "positional"}, {"type": "attention"}, {"type": "cls_pool"},
              {"type": "dense", "units": 2}]
    model = build_model(ModelConfig(layers=layers), (None, 4), 2, np, sequence={"longest": 9, "shortest": 2})
    assert model.layers[1].max_steps == 10
    graph = [{"name": "t", "type": "cls_token", "input": "a"}, {"name": "p", "type": "positional", "input": "t"},
             {"name": "q", "type": "positional", "input": "a"}, {"name": "c", "type": "cls_pool", "input": "p"},
             {"name": "g", "type": "global_avg_pool", "input": "q"}, {"name": "j", "type": "concat", "inputs": ["c", "g"]},
             {"name": "out", "type": "dense", "input": "j", "units": 3}]
    model = build_network(ModelConfig(graph=graph), manifest(features=(0,), columns=(("a", 2),)), np)
    assert [model.layers[i].max_steps for i in (1, 2)] == [21, 20]  # the column's longest is 20


def test_config_checks():
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(cls_token\) on inputs of shape \[4\]: a cls_token "
                                          r"layer takes sequences \(None, features\), got inputs of shape \[4\]"):
        build_model(ModelConfig(layers=[{"type": "cls_token"}, {"type": "dense", "units": 2}]), (4,), 2, np)
    graph = [{"name": "t", "type": "cls_token", "input": "a"}, {"name": "j", "type": "concat", "inputs": ["t", "a"]},
             {"name": "p", "type": "cls_pool", "input": "j"}, {"name": "out", "type": "dense", "input": "p", "units": 3}]
    with pytest.raises(ConfigError, match=r"\(j, concat\) .*merges sequences of different lengths"):
        build_network(ModelConfig(graph=graph), manifest(features=(0,), columns=(("a", 2),)), np)
    with pytest.raises(ConfigError, match=r"\(cls_token\) cannot be cut into segments: it puts a step before"):
        check_layers(4, [{"type": "cls_token"}], [])
