"""ONNX emitters of the recurrent layers: LSTM and GRU."""
from __future__ import annotations

import numpy as np

from mpitrain.nn.onnx.graph import emits, host
from mpitrain.nn.recurrent import GRU, LSTM


def _recurrent(op: str, **attributes):
    """ONNX `LSTM`/`GRU` (layout 0: time-major, so the sequences are transposed in and out) on (N, T, F) rows, with
    `sequence_lens` from `graph.lengths`: (N, T, H * directions) with `return_sequences` (ONNX's Y, zero at padded
    steps), else the last states (N, H * directions) (Y_h: forward after lengths-1, backward after step 0).
    The layer's weights are ONNX's transposed, stacked by direction (`_onnx_biases`). Without `graph.lengths`
    every sequence is T steps long."""
    def emit(graph, layer, x, name, input_shape):
        directions = layer.directions
        inputs = [graph.node("Transpose", [x], name, perm=[1, 0, 2])]
        inputs += [graph.constant(f"{name}/{w}", np.stack([host(layer.params[f"{w}{d}"]).T for d in directions]))
                   for w in ("W", "R")]
        inputs.append(graph.constant(f"{name}/B", np.stack([_onnx_biases(layer, d) for d in directions])))
        if graph.lengths is not None:
            inputs.append(graph.node("Cast", [graph.lengths], f"{name}/lengths", to=graph.onnx.TensorProto.INT32))
        output = f"{name}/{op}"
        outputs = [output, ""] if layer.return_sequences else ["", output]  # Y (T, D, N, H) or Y_h (D, N, H)
        graph.nodes.append(graph.onnx.helper.make_node(
            op, inputs, outputs, name=output, hidden_size=layer.units,
            direction="bidirectional" if layer.bidirectional else "forward", **attributes))
        if layer.return_sequences:
            rows = graph.node("Transpose", [output], f"{name}/rows", perm=[2, 0, 1, 3])
            return graph.node("Reshape", [rows, graph.constant(f"{name}/shape", [0, 0, -1], np.int64)], name)
        rows = graph.node("Transpose", [output], f"{name}/rows", perm=[1, 0, 2])
        return graph.node("Reshape", [rows, graph.constant(f"{name}/shape", [0, -1], np.int64)], name)
    return emit


def _onnx_biases(layer, d: str) -> np.ndarray:
    """ONNX's B of direction `d` of a recurrent layer: the input bias, then the recurrent bias (zero for an LSTM,
    whose one bias is the input side's)."""
    recurrent = host(layer.params[f"{layer.recurrent_bias}{d}"]) if layer.recurrent_bias else \
        np.zeros(layer.gates * layer.units)
    return np.concatenate([host(layer.params[f"{layer.input_bias}{d}"]), recurrent])


emits(LSTM)(_recurrent("LSTM"))
emits(GRU)(_recurrent("GRU", linear_before_reset=1))
