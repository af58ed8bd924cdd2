"""LSTM and GRU layers (mpitrain/nn/recurrent.py) against the sequence layer contract (docs/sequences.md): float64
gradients against central differences, masked and unmasked; results that do not depend on the batch's padding or
companions; the config's layer entries; the ONNX emitters under onnxruntime."""
import itertools

import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.nn.model import LAYER_TYPES, Sequential, build_model, check_layer_spec
from mpitrain.nn.recurrent import GRU, LSTM
from mpitrain.testing.gradients import check_sequence_layer_gradients, padded_steps

VARIANTS = [(cls, return_sequences, bidirectional)
            for cls, return_sequences, bidirectional in itertools.product((LSTM, GRU), (False, True), (False, True))]
NAMES = [f"{cls.__name__}-{'sequences' if rs else 'last'}-{'bi' if bi else 'forward'}" for cls, rs, bi in VARIANTS]


def bound_layer(cls, return_sequences, bidirectional, features, dtype="float64", units=4, seed=0):
    """A layer bound to a one-layer model's flat buffers, its parameters drawn and perturbed (biases non-zero)."""
    layer = cls(units, return_sequences=return_sequences, bidirectional=bidirectional)
    model = Sequential([layer], (None, features), "softmax_cross_entropy", np, dtype)
    model.init_params(seed, "xavier")
    model.params += np.random.default_rng(seed).normal(0, 0.1, model.n_params).astype(dtype)
    return layer, model


@pytest.mark.parametrize("cls, return_sequences, bidirectional", VARIANTS, ids=NAMES)
@pytest.mark.parametrize("lengths", [[5, 2, 3, 1], [5, 5, 5]], ids=["ragged", "full"])
def test_gradients_equal_central_differences(cls, return_sequences, bidirectional, lengths):
    check_sequence_layer_gradients(cls(4, return_sequences=return_sequences, bidirectional=bidirectional),
                                   features=3, lengths=lengths, steps=5)


@pytest.mark.parametrize("cls, return_sequences, bidirectional", VARIANTS, ids=NAMES)
def test_a_sequence_gives_the_same_results_whatever_its_batch_and_padding(cls, return_sequences, bidirectional):
    """Sequences a (4 steps) and b (2 steps) alone, then beside two companions in a longer batch whose padding holds
    large values and NaN: the same outputs at valid steps, parameter gradients and input gradients (within 1e-6);
    the input gradients are zero at padded steps."""
    rng = np.random.default_rng(1)
    features = 3
    a, b = rng.normal(size=(4, features)), rng.normal(size=(2, features))
    weights_a, weights_b = rng.normal(size=(4, 8)), rng.normal(size=(2, 8))  # of each valid output
    layer, model = bound_layer(cls, return_sequences, bidirectional, features)
    width = layer.output_shape((None, features))[-1]

    def run(sequences, steps, where):
        """Forward and backward on `sequences` at rows `where` (others: companions of random lengths), padded with
        garbage to `steps`; a loss weighting the outputs of a and b alone. (outputs, param grads, input grads)."""
        lengths = rng.integers(1, steps + 1, size=max(where) + 1)
        x = rng.normal(0, 1e3, size=(len(lengths), steps, features))
        dy = np.zeros((len(lengths), steps, width) if return_sequences else (len(lengths), width))
        for row, sequence, weights in zip(where, sequences, (weights_a, weights_b)):
            lengths[row] = len(sequence)
            x[row, :len(sequence)] = sequence
            if return_sequences:
                dy[row, :len(sequence)] = weights[:, :width]
            else:
                dy[row] = weights[0, :width]
        x[where[1], len(b):] = np.nan
        layer.lengths = lengths
        y = layer.forward(x, training=True).copy()
        dx = layer.backward(dy)
        assert (dx[padded_steps(lengths, steps)] == 0).all()
        outputs = [y[row, :len(s)] if return_sequences else y[row] for row, s in zip(where, sequences)]
        return outputs, model.grads.copy(), [dx[row, :len(s)].copy() for row, s in zip(where, sequences)]

    (outputs, grads, dx), (outputs_beside, grads_beside, dx_beside) = run([a, b], 4, [0, 1]), run([a, b], 7, [3, 1])
    for expected, got in zip([*outputs, grads, *dx], [*outputs_beside, grads_beside, *dx_beside]):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9, equal_nan=False)


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_without_lengths_every_step_is_valid(cls):
    layer, _ = bound_layer(cls, True, True, features=2)
    x = np.random.default_rng(2).normal(size=(3, 4, 2))
    unmasked = layer.forward(x, training=False).copy()
    layer.lengths = np.array([4, 4, 4])
    np.testing.assert_array_equal(layer.forward(x, training=False), unmasked)
    layer.lengths = np.array([4, 2, 4])
    assert not np.allclose(layer.forward(x, training=False)[1, :2, 4:], unmasked[1, :2, 4:])  # backward direction


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_the_workspace_keeps_one_buffer_per_array_whatever_the_length(cls):
    layer, model = bound_layer(cls, True, True, features=2)
    rng = np.random.default_rng(3)
    for steps in (6, 3, 5, 6, 2):
        layer.lengths = np.full(4, steps)
        y = layer.forward(rng.normal(size=(4, steps, 2)), training=True)
        layer.backward(np.ones_like(y))
        if steps == 6:
            arrays, nbytes = len(model.workspace.arrays), model.workspace.nbytes
    assert (len(model.workspace.arrays), model.workspace.nbytes) == (arrays, nbytes)


def test_initialization_orthogonal_recurrent_blocks_and_the_forget_gate_bias():
    units, features = 6, 5
    for cls in (LSTM, GRU):
        layer, model = bound_layer(cls, False, True, features, units=units)
        model.init_params(4, "xavier")
        for d in ("", "_reverse"):
            recurrent = layer.params[f"R{d}"]
            for gate in range(cls.gates):
                block = recurrent[:, gate * units:(gate + 1) * units]
                np.testing.assert_allclose(block.T @ block, np.eye(units), atol=1e-12)
            limit = np.sqrt(6 / (features + cls.gates * units))
            assert np.abs(layer.params[f"W{d}"]).max() <= limit
            bias = layer.params[f"b{d}" if cls is LSTM else f"bW{d}"]
            forget = np.zeros(cls.gates * units, bool)
            if cls is LSTM:
                forget[2 * units:3 * units] = True  # gates i, o, f, c
            assert (bias[forget] == 1).all() and (bias[~forget] == 0).all()
        assert model.decay_mask.sum() == 2 * (features + units) * cls.gates * units  # W and R, both directions


def test_config_entries_build_recurrent_layers_and_refuse_bad_arguments():
    spec = {"type": "lstm", "units": 6, "return_sequences": True, "bidirectional": True}
    check_layer_spec(spec, "model.layers[0]")
    layers = [LAYER_TYPES[s["type"]](**{k: v for k, v in s.items() if k != "type"})
              for s in (spec, {"type": "gru", "units": 5}, {"type": "dense", "units": 9})]
    model = Sequential(layers, (None, 3), "softmax_cross_entropy", np)
    assert model.output_shape == (9,)
    assert [shape for _, shape in model.layout[:8]] == [(3, 24), (6, 24), (24,), (3, 24), (6, 24), (24,),
                                                        (12, 15), (5, 15)]
    assert model.layer_specs()[:2] == [{**spec, "init": None}, {"type": "gru", "units": 5, "return_sequences": False,
                                                                "bidirectional": False, "init": None}]
    with pytest.raises(ConfigError, match=r"model.layers\[1\].bidirectional is 'yes', expected true or false"):
        check_layer_spec({"type": "gru", "units": 3, "bidirectional": "yes"}, "model.layers[1]")
    with pytest.raises(ConfigError, match=r"model.layers\[0\].units"):
        check_layer_spec({"type": "lstm", "units": 0}, "model.layers[0]")
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(lstm\) on inputs of shape \[5\]: expected sequences"):
        build_model(ModelConfig(layers=[{"type": "lstm", "units": 4}, {"type": "dense", "units": 2}]), (5,), 2, np)


@pytest.mark.parametrize("cls, return_sequences, bidirectional", VARIANTS, ids=NAMES)
def test_onnx_runtime_gives_the_layers_outputs(cls, return_sequences, bidirectional):
    """The layer's emitter alone in a graph of inputs x (N, T, F) float32 and lengths (N,) int64: onnxruntime's
    outputs equal the layer's float32 forward at valid steps within 1e-5, ragged lengths."""
    check_onnx_runtime(cls, return_sequences, bidirectional, np.array([6, 2, 4, 1, 5]))


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_onnx_runtime_without_lengths_runs_every_step(cls):
    check_onnx_runtime(cls, True, True, None)


def check_onnx_runtime(cls, return_sequences, bidirectional, lengths, steps=6, features=3):
    """ONNX Runtime on the graph of the layer's emitter alone (input lengths unless `lengths` is None) against the
    layer's forward on 5 sequences, at valid steps."""
    import onnx
    import onnxruntime as ort

    from mpitrain.nn.onnx import OPSET, OnnxGraph, emit_layer
    layer, _ = bound_layer(cls, return_sequences, bidirectional, features, dtype="float32", units=5)
    x = np.random.default_rng(5).normal(size=(5, steps, features)).astype(np.float32)
    layer.lengths = lengths
    expected = layer.forward(x, training=False)
    graph = OnnxGraph(np.float32)
    helper, tensor = onnx.helper, onnx.TensorProto
    inputs, feed = [helper.make_tensor_value_info("x", tensor.FLOAT, ["N", "T", features])], {"x": x}
    if lengths is not None:
        graph.lengths, feed["lengths"] = "lengths", lengths
        inputs.append(helper.make_tensor_value_info("lengths", tensor.INT64, ["N"]))
    output = emit_layer(graph, layer, "x", "00_rnn", (None, features))
    width = expected.shape[-1]
    outputs = [helper.make_tensor_value_info(output, tensor.FLOAT, ["N", "T", width] if return_sequences else ["N", width])]
    proto = helper.make_model(helper.make_graph(graph.nodes, "rnn", inputs, outputs, graph.initializers),
                              opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, feed)
    assert got.shape == expected.shape
    valid = ~padded_steps(lengths, steps) if return_sequences and lengths is not None else slice(None)
    np.testing.assert_allclose(got[valid], expected[valid], rtol=1e-5, atol=1e-5)
