"""conv1d, the global pools over time and dense per step on padded sequences (docs/sequences.md): gradients against
central differences (float64), the layer contract's masking, output lengths, and the config's checks."""
import math

import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.nn.layernorm import LayerNorm
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import build_model
from mpitrain.nn.sequence import Conv1D, GlobalAvgPool1D, GlobalMaxPool1D
from mpitrain.testing.gradients import (
    check_sequence_gradients,
    padded_batch,
    sequence_gradients,
    sequence_model,
    sequences,
    set_sequence_lengths,
    weighted_loss,
)

RAGGED = np.array([9, 6, 7])  # each at least the span (5) of a 3-tap kernel at dilation 2, padded to 11


@pytest.mark.parametrize("padding", ["causal", "same", "valid"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("lengths", [RAGGED, None], ids=["masked", "unmasked"])
def test_conv1d_gradients(padding, stride, dilation, lengths):
    check_sequence_gradients([Conv1D(3, 3, stride=stride, dilation=dilation, padding=padding, activation="tanh")],
                             features=2, lengths=lengths, steps=11)


@pytest.mark.parametrize("lengths", [np.array([5, 1, 3]), None], ids=["masked", "unmasked"])
@pytest.mark.parametrize("pool", [GlobalMaxPool1D, GlobalAvgPool1D])
def test_global_pool_gradients(pool, lengths):
    check_sequence_gradients([pool()], features=3, lengths=lengths, steps=6)
    check_sequence_gradients([Dense(4, activation="relu"), pool(), Dense(3)], features=2, lengths=lengths, steps=6)


@pytest.mark.parametrize("lengths", [np.array([4, 1, 6]), None], ids=["masked", "unmasked"])
def test_dense_per_step_gradients(lengths):
    model = check_sequence_gradients([Dense(4, activation="sigmoid")], features=3, lengths=lengths, steps=6)
    assert model.layers[0].params["W"].shape == (3, 4) and model.output_shape == (None, 4)


def test_stacked_lengths_through_a_strided_convolution():
    check_sequence_gradients([Conv1D(4, 3, stride=2, padding="same", activation="relu"), Conv1D(3, 2, dilation=2),
                              GlobalMaxPool1D(), Dense(2)], features=2, lengths=np.array([9, 3, 5]), steps=10)


def _reference_conv1d(layer, x, lengths):
    """conv1d by its definition, one output at a time: zero padding, the sequence's padded steps zeroed."""
    w, bias = layer.params["W"], layer.params["b"]
    x = x * (np.arange(x.shape[1]) < lengths[:, None])[:, :, None]
    padded = np.pad(x, ((0, 0), (layer.pad_left, layer.pad_right), (0, 0)))
    out = layer.output_steps(x.shape[1])
    y = np.empty((len(x), out, layer.filters))
    for b in range(len(x)):
        for t in range(out):
            taps = padded[b, t * layer.stride + layer.dilation * np.arange(layer.kernel)]  # (kernel, F)
            y[b, t] = np.einsum("kc,kcf->f", taps, w) + bias
    return y


@pytest.mark.parametrize("padding, left", [("causal", 4), ("same", 2), ("valid", 0)])
def test_conv1d_forward_matches_its_definition_and_output_lengths(padding, left):
    layer = sequence_model([Conv1D(3, 3, stride=2, dilation=2, padding=padding)], 2).layers[0]
    assert layer.pad_left == left
    x, lengths = padded_batch([np.random.default_rng(b).normal(size=(n, 2)) for b, n in enumerate([11, 5, 8])], 11)
    layer.lengths = lengths
    np.testing.assert_allclose(layer.forward(x, training=False), _reference_conv1d(layer, x, lengths), atol=1e-12)
    for n in range(5, 40):
        expected = (n - 5) // 2 + 1 if padding == "valid" else math.ceil(n / 2)
        assert layer.output_steps(n) == expected == layer.output_lengths(np.array([n]))[0]


def test_causal_outputs_see_only_earlier_steps():
    layer = sequence_model([Conv1D(2, 3, dilation=2)], 2).layers[0]
    x = np.random.default_rng(0).normal(size=(1, 12, 2))
    before = layer.forward(x, training=False).copy()
    x[0, 7:] += 1
    after = layer.forward(x, training=False)
    np.testing.assert_array_equal(before[0, :7], after[0, :7])
    assert (before[0, 7:] != after[0, 7:]).all()


def test_valid_refuses_a_sequence_shorter_than_the_span():
    layer = Conv1D(2, 3, dilation=2, padding="valid")
    with pytest.raises(ValueError, match=r"conv1d .*a sequence of 4 steps is shorter than the kernel's span of 5"):
        layer.output_lengths(np.array([7, 4, 9]))
    with pytest.raises(ValueError, match=r"a sequence of 3 steps"):
        sequence_model([layer], 2).layers[0].forward(np.zeros((2, 3, 2)), training=False)


@pytest.mark.parametrize("layers", [
    [Conv1D(4, 3, stride=2, padding="same", activation="relu"), Conv1D(3, 2, dilation=2), Dense(5, activation="tanh"),
     GlobalMaxPool1D(), Dense(2)],
    [Conv1D(4, 3, padding="valid", activation="sigmoid"), GlobalAvgPool1D(), Dense(2)],
    [Dense(3, activation="relu"), Conv1D(3, 3, stride=2, dilation=2, padding="causal")],
    [Dense(4), LayerNorm(activation="relu"), GlobalAvgPool1D(), Dense(2)],
], ids=["max", "avg", "sequence-out", "layernorm"])
def test_padding_invariance(layers):
    """The same sequences beside other companions, padded further with other garbage: the same outputs at valid
    steps and the same parameter gradients (float64, 1e-6)."""
    rng = np.random.default_rng(3)
    ours = [rng.normal(size=(n, 3)) for n in (6, 9)]
    others = [rng.normal(size=(n, 3)) for n in (15, 4)]
    model = sequence_model(layers, 3)
    outputs, grads = [], []
    for batch, steps, seed in (([0, 1], 9, 1), ([2, 0, 3, 1], 17, 2)):
        chosen = [[*ours, *others][i] for i in batch]
        x, lengths = padded_batch(chosen, steps, seed)
        weights = np.zeros((len(batch), 64, 64) if len(model.output_shape) == 2 else (len(batch), 64))
        for row, i in enumerate(batch):
            if i < 2:  # the loss weighs only our two sequences, alike in both batches
                weights[row] = np.random.default_rng(10 + i).normal(size=weights.shape[1:])
        out_lengths = set_sequence_lengths(model.layers, model.input_shape, lengths)
        y = model.forward(sequences(x, lengths), training=True)
        rows = [batch.index(i) for i in (0, 1)]
        outputs.append([y[r, :out_lengths[r]] if y.ndim == 3 else y[r] for r in rows])
        grads.append(sequence_gradients(model, x, lengths, weights)[0])
        assert weighted_loss(model, x, lengths, weights)[0] != 0
    for a, b in zip(*outputs):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    np.testing.assert_allclose(grads[0], grads[1], rtol=0, atol=1e-6)


def test_a_sequence_model_builds_from_its_config():
    layers = [{"type": "conv1d", "filters": 4, "kernel": 3, "dilation": 2, "activation": "relu"},
              {"type": "conv1d", "filters": 4, "kernel": 2, "stride": 2, "padding": "valid"},
              {"type": "dense", "units": 6}, {"type": "global_max_pool"}, {"type": "dense", "units": 3}]
    model = build_model(ModelConfig(layers=layers), (None, 5), 3, np)
    assert [type(layer).__name__ for layer in model.layers] == ["Conv1D", "ReLU", "Conv1D", "Dense",
                                                                "GlobalMaxPool1D", "Dense"]
    assert model.layers[0].kind == "relu" and model.layers[1].fused  # conv1d runs its activation itself
    assert model.layers[0].params["W"].shape == (3, 5, 4) and model.layers[3].params["W"].shape == (4, 6)
    again = build_model(ModelConfig(layers=model.layer_specs()), (None, 5), 3, np)
    assert again.layout == model.layout and again.layer_specs() == model.layer_specs()


@pytest.mark.parametrize("layers, message", [
    ([{"type": "batchnorm"}], r"model.layers\[1\] \(batchnorm\) on inputs of shape \[None, 4\]: a batchnorm layer "
                              r"cannot take a sequence .*padded steps.*global_avg_pool, global_max_pool, or an lstm"),
    ([{"type": "flatten"}], r"model.layers\[1\] \(flatten\) .*cannot take a sequence .*padded length.*global_avg_pool"),
    ([{"type": "conv1d", "filters": 2, "kernel": 3, "padding": "full"}], r"model.layers\[1\].padding is 'full', "
                                                                         r"expected one of .*'causal'"),
    ([{"type": "conv1d", "filters": 2, "kernel": [3, 3]}], r"model.layers\[1\]: kernel \[3, 3\], expected one "
                                                           r"integer"),
    ([{"type": "conv1d", "filters": 2, "kernel": 3, "dilation": 0}], r"model.layers\[1\].dilation is 0, expected an "
                                                                     r"integer in \[1, 1024\]"),
    ([{"type": "conv2d", "filters": 2, "kernel": 3, "padding": "causal"}], r"model.layers\[1\]: padding 'causal', "
                                                                           r"expected one of \('valid', 'same'\)"),
])
def test_config_errors_name_the_layer(layers, message):
    spec = [{"type": "dense", "units": 4}, *layers, {"type": "global_avg_pool"}, {"type": "dense", "units": 3}]
    with pytest.raises(ConfigError, match=message):
        build_model(ModelConfig(layers=spec), (None, 4), 3, np)


def test_sequence_layers_refuse_vectors():
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(global_max_pool\) on inputs of shape \[4\]: a "
                                          r"globalmaxpool1d layer takes sequences \(None, features\)"):
        build_model(ModelConfig(layers=[{"type": "global_max_pool"}, {"type": "dense", "units": 3}]), (4,), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(conv1d\) on inputs of shape \[1, 8, 8\]"):
        build_model(ModelConfig(layers=[{"type": "conv1d", "filters": 3, "kernel": 2}]), (1, 8, 8), 3, np)
