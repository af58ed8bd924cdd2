"""ONNX emitters of the element-wise and dense layers: dense, the activations, flatten, dropout."""
from __future__ import annotations

from mpitrain.nn.layers import Dense, Dropout, Flatten, ReLU, Sigmoid, Tanh, is_sequence
from mpitrain.nn.onnx.graph import emits


@emits(Dense)
def dense(graph, layer, x, name, input_shape):
    if is_sequence(input_shape):  # each step's features: MatMul on (N, T, F)
        product = graph.node("MatMul", [x, graph.constant(f"{name}/W", layer.params["W"])], name)
        return graph.node("Add", [product, graph.constant(f"{name}/b", layer.params["b"])], name)
    if len(input_shape) > 1:
        x = graph.node("Flatten", [x], name, axis=1)
    return graph.node("Gemm", [x, graph.constant(f"{name}/W", layer.params["W"]),
                               graph.constant(f"{name}/b", layer.params["b"])], name)


def _same(op: str):
    """The emitter of a layer that is ONNX operator `op` on its one input."""
    return lambda graph, layer, x, name, input_shape: graph.node(op, [x], name)


emits(ReLU)(_same("Relu"))
emits(Tanh)(_same("Tanh"))
emits(Sigmoid)(_same("Sigmoid"))
emits(Dropout)(_same("Identity"))  # dropout is the identity at inference


@emits(Flatten)
def flatten(graph, layer, x, name, input_shape):
    return graph.node("Flatten", [x], name, axis=1)
