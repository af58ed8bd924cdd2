"""The ONNX emitters of self-attention and of the transformer block (its parts' emitters and the residual Adds).
Attention: MatMul, Reshape and Transpose into heads, the masked Softmax of the scaled
scores (a sequence's padded keys, and with `causal` the later ones, set to -inf by Where), the heads' outputs side
by side through the output projection."""
from __future__ import annotations

import math

import numpy as np

from mpitrain.nn.attention import Attention
from mpitrain.nn.onnx.graph import EMITTERS, emits
from mpitrain.nn.onnx.sequence import step_index
from mpitrain.nn.transformer import Transformer


def _seen_keys(graph, x, layer, name: str) -> str | None:
    """(N or 1, 1, T, T) bool: key j is seen by query i (a valid step, and with `causal` j <= i); None when every
    key is seen."""
    if graph.lengths is None and not layer.causal:
        return None
    index, seen = step_index(graph, x, name), None
    if graph.lengths is not None:
        lengths = graph.node("Reshape", [graph.lengths, graph.constant(f"{name}/per_row", [-1, 1, 1, 1], np.int64)],
                             f"{name}/lengths")
        seen = graph.node("Less", [index, lengths], f"{name}/valid_keys")
    if layer.causal:
        queries = graph.node("Unsqueeze", [index, graph.constant(f"{name}/column", [1], np.int64)], f"{name}/queries")
        earlier = graph.node("LessOrEqual", [index, queries], f"{name}/earlier")
        seen = earlier if seen is None else graph.node("And", [seen, earlier], f"{name}/seen")
    return seen


@emits(Attention)
def attention(graph, layer, x, name, input_shape):
    features, heads, width = layer.features, layer.heads, layer.width
    qkv = graph.node("Add", [graph.node("MatMul", [x, graph.constant(f"{name}/W", layer.params["W"])], f"{name}/qkv"),
                             graph.constant(f"{name}/b", layer.params["b"])], f"{name}/qkv")
    split = graph.node("Transpose", [graph.node("Reshape", [qkv, graph.constant(f"{name}/heads_shape",
                                                                               [0, 0, 3, heads, width], np.int64)],
                                                f"{name}/qkv")], f"{name}/qkv", perm=[2, 0, 3, 1, 4])
    q, k, v = (graph.node("Gather", [split, graph.constant(f"{name}/{part}_index", i, np.int64)], f"{name}/{part}",
                          axis=0) for i, part in enumerate("qkv"))
    keys = graph.node("Transpose", [k], f"{name}/keys", perm=[0, 1, 3, 2])
    scores = graph.node("Mul", [graph.node("MatMul", [q, keys], f"{name}/scores"),
                                graph.constant(f"{name}/scale", 1 / math.sqrt(width))], f"{name}/scores")
    seen = _seen_keys(graph, x, layer, name)
    if seen is not None:
        scores = graph.node("Where", [seen, scores, graph.constant(f"{name}/never", -np.inf)], f"{name}/masked")
    weights = graph.node("Softmax", [scores], f"{name}/weights", axis=-1)
    heads_out = graph.node("Transpose", [graph.node("MatMul", [weights, v], f"{name}/heads")], f"{name}/heads",
                           perm=[0, 2, 1, 3])
    joined = graph.node("Reshape", [heads_out, graph.constant(f"{name}/joined_shape", [0, 0, features], np.int64)],
                        f"{name}/joined")
    return graph.node("Add", [graph.node("MatMul", [joined, graph.constant(f"{name}/W_out", layer.params["W_out"])],
                                         f"{name}/out"), graph.constant(f"{name}/b_out", layer.params["b_out"])], name)


@emits(Transformer)
def transformer(graph, layer, x, name, input_shape):
    """The block's parts, each by its own emitter (named NAME/PART), and the residual Adds."""
    def run(parts, value):
        for part in parts:
            value = EMITTERS[type(layer.parts[part])](graph, layer.parts[part], value, f"{name}/{part}", input_shape)
        return value

    attend, feed = layer.ATTEND, layer.FEED
    if layer.norm_first:
        y = graph.node("Add", [x, run(["norm1", *attend], x)], f"{name}/attended")
        return graph.node("Add", [y, run(["norm2", *feed], y)], name)
    y = run(["norm1"], graph.node("Add", [x, run(attend, x)], f"{name}/attended"))
    return run(["norm2"], graph.node("Add", [y, run(feed, y)], f"{name}/fed"))
