"""ONNX emitters of the element-wise and dense layers: dense, the activations, flatten, dropout."""
from __future__ import annotations

import math

from mpitrain.nn.layers import GELU, Dense, Dropout, Flatten, GELUTanh, ReLU, Sigmoid, SiLU, Tanh, is_sequence
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


def _half_x_one_plus(graph, x, value: str, name: str) -> str:
    """x 0.5 (1 + value): both GELUs' last steps."""
    half = graph.node("Mul", [graph.node("Add", [value, graph.constant(f"{name}/one", 1.0)], name),
                              graph.constant(f"{name}/half", 0.5)], f"{name}/half_sum")
    return graph.node("Mul", [x, half], name)


@emits(GELU)
def gelu(graph, layer, x, name, input_shape):
    """x 0.5 (1 + erf(x / sqrt 2)): opset 17 has Erf but no Gelu (opset 20 has)."""
    scaled = graph.node("Mul", [x, graph.constant(f"{name}/sqrt_half", math.sqrt(0.5))], f"{name}/scaled")
    return _half_x_one_plus(graph, x, graph.node("Erf", [scaled], name), name)


@emits(GELUTanh)
def gelu_tanh(graph, layer, x, name, input_shape):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    cube = graph.node("Mul", [graph.node("Mul", [x, x], f"{name}/square"), x], f"{name}/cube")
    inner = graph.node("Add", [x, graph.node("Mul", [cube, graph.constant(f"{name}/cubic", 0.044715)],
                                             f"{name}/cubic_term")], f"{name}/inner")
    scaled = graph.node("Mul", [inner, graph.constant(f"{name}/scale", math.sqrt(2 / math.pi))], f"{name}/scaled")
    return _half_x_one_plus(graph, x, graph.node("Tanh", [scaled], name), name)


@emits(SiLU)
def silu(graph, layer, x, name, input_shape):
    """x sigmoid(x)."""
    return graph.node("Mul", [x, graph.node("Sigmoid", [x], name)], name)


@emits(Flatten)
def flatten(graph, layer, x, name, input_shape):
    return graph.node("Flatten", [x], name, axis=1)
