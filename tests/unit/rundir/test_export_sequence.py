"""The sequence layers' ONNX emitters under onnxruntime: conv1d, the global pools over time and dense per step, on
ragged float32 batches with garbage in the padding, equal to the layers' forward at valid steps within 1e-5."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mpitrain.nn.attention import Attention
from mpitrain.nn.cls_token import ClsPool, ClsToken
from mpitrain.nn.layernorm import LayerNorm
from mpitrain.nn.layers import Dense
from mpitrain.nn.onnx import OPSET, OnnxGraph, emit_layer
from mpitrain.nn.positional import Positional
from mpitrain.nn.sequence import Conv1D, GlobalAvgPool1D, GlobalMaxPool1D
from mpitrain.nn.transformer import Transformer
from mpitrain.testing.gradients import padded_batch, sequence_model, sequences, set_sequence_lengths

FEATURES = 3


def layers_graph(model, masked: bool):
    """An ONNX model of `model`'s layers' emitters alone: input `x` (N, T, F) float32 and, when `masked`, `lengths`
    (N,) int64; outputs the last layer's output and, for a sequence, its lengths."""
    graph = OnnxGraph(np.float32)
    graph.lengths = "lengths" if masked else None
    y, shape = "x", model.input_shape
    for layer, name in zip(model.layers, model.names):
        y = emit_layer(graph, layer, y, name, shape)
        shape = layer.output_shape(shape)
    float32, int64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    inputs = [onnx.helper.make_tensor_value_info("x", float32, ["N", "T", FEATURES])]
    if masked:
        inputs.append(onnx.helper.make_tensor_value_info("lengths", int64, ["N"]))
    outputs = [onnx.helper.make_tensor_value_info(y, float32, ["N", *(("steps", shape[1]) if shape[0] is None
                                                                      else shape)])]
    if graph.lengths is not None:
        outputs.append(onnx.helper.make_tensor_value_info(graph.lengths, int64, ["N"]))
    proto = onnx.helper.make_model(onnx.helper.make_graph(graph.nodes, "layers", inputs, outputs, graph.initializers),
                                   opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(proto, full_check=True)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


LAYERS = {
    **{f"conv1d {padding} stride {stride} dilation {dilation}": lambda p=padding, s=stride, d=dilation:
       [Conv1D(4, 3, stride=s, dilation=d, padding=p, activation="tanh")]
       for padding in ("causal", "same", "valid") for stride, dilation in ((1, 1), (2, 2), (2, 1))},
    "dense per step": lambda: [Dense(4, activation="sigmoid")],
    "layernorm per step": lambda: [Dense(4), LayerNorm(activation="tanh")],
    "positional learned": lambda: [Dense(4), Positional(max_steps=16), GlobalAvgPool1D()],
    "attention": lambda: [Dense(4), Attention(heads=2), GlobalMaxPool1D()],
    "attention causal per step": lambda: [Positional("sinusoidal", max_steps=16), Attention(heads=3, causal=True)],
    "transformer pre-LN": lambda: [Dense(4), Transformer(heads=2, ff_units=6, rate=0.1), GlobalAvgPool1D()],
    "transformer post-LN causal": lambda: [Dense(6), Transformer(heads=3, ff_units=4, norm_first=False, causal=True)],
    "cls token, transformer, cls pool": lambda: [Dense(4), ClsToken(), Positional(max_steps=17),
                                                 Transformer(heads=2, ff_units=6), ClsPool()],
    "cls token per step": lambda: [ClsToken(), Attention(heads=3)],  # the lengths one more
    "positional sinusoidal": lambda: [Positional("sinusoidal", max_steps=13), Dense(3)],  # batches padded past it
    "global max pool": lambda: [GlobalMaxPool1D()],
    "global avg pool": lambda: [GlobalAvgPool1D()],
    "conv1d then max pool": lambda: [Conv1D(4, 2, stride=2, padding="same", activation="relu"), Dense(5),
                                     GlobalMaxPool1D(), Dense(2)],
    "conv1d then avg pool": lambda: [Conv1D(4, 3, dilation=2, padding="valid"), GlobalAvgPool1D()],
}


@pytest.mark.parametrize("masked", [True, False], ids=["ragged", "unmasked"])
@pytest.mark.parametrize("case", sorted(LAYERS))
def test_emitters_give_the_layers_forward(case, masked):
    model = sequence_model(LAYERS[case](), FEATURES, dtype="float32")
    rng = np.random.default_rng(4)
    x, lengths = padded_batch([rng.normal(size=(n, FEATURES)) for n in (13, 5, 9, 6)], 16)
    x = x.astype(np.float32)
    if not masked:
        x, lengths = x[:, :5], None
    out_lengths = set_sequence_lengths(model.layers, model.input_shape, lengths)
    expected = model.forward(sequences(x, lengths), training=False)
    feeds = {"x": x, **({"lengths": lengths} if masked else {})}
    got = layers_graph(model, masked).run(None, feeds)
    assert got[0].shape == expected.shape
    if expected.ndim == 3 and masked:
        np.testing.assert_array_equal(got[1], out_lengths)
        for b, n in enumerate(out_lengths):
            np.testing.assert_allclose(got[0][b, :n], expected[b, :n], rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-5)
