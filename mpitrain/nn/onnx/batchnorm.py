"""The ONNX emitters of batch norm and layer norm."""
from __future__ import annotations

from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.layernorm import LayerNorm
from mpitrain.nn.onnx.graph import emits


@emits(BatchNorm)
def batchnorm(graph, layer, x, name, input_shape):
    """Inference mode with the running statistics; on dense (N, F) inputs F is the channel axis."""
    return graph.node("BatchNormalization", [x, graph.constant(f"{name}/gamma", layer.params["gamma"]),
                                             graph.constant(f"{name}/beta", layer.params["beta"]),
                                             graph.constant(f"{name}/mean", layer.stats["mean"]),
                                             graph.constant(f"{name}/var", layer.stats["var"])], name,
                      epsilon=float(layer.eps))


@emits(LayerNorm)
def layernorm(graph, layer, x, name, input_shape):
    """LayerNormalization over the last axis (a row's features, or each step's of a sequence (N, T, F))."""
    return graph.node("LayerNormalization", [x, graph.constant(f"{name}/gamma", layer.params["gamma"]),
                                             graph.constant(f"{name}/beta", layer.params["beta"])], name,
                      axis=-1, epsilon=float(layer.eps))
