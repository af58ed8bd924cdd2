"""The ONNX emitters of self-attention and of the transformer block (its parts' emitters and the residual Adds).
Attention: MatMul, Reshape and Transpose into heads, the masked Softmax of the scaled
scores (a sequence's padded keys, and with `causal` the later ones, set to -inf by Where), the heads' outputs side
by side through the output projection."""
from __future__ import annotations

import math

import numpy as np

from mpitrain.nn.attention import Attention, CrossAttention
from mpitrain.nn.onnx.graph import EMITTERS, emits
from mpitrain.nn.onnx.sequence import step_index
from mpitrain.nn.transformer import Transformer


def _seen_keys(graph, keys, key_lengths, causal: bool, name: str) -> str | None:
    """(N or 1, 1, T, T) bool: key j (a step of the sequences `keys`, of `key_lengths`) is seen by query i (a valid
    step, and with `causal` j <= i); None when every key is seen."""
    if key_lengths is None and not causal:
        return None
    index, seen = step_index(graph, keys, name), None
    if key_lengths is not None:
        lengths = graph.node("Reshape", [key_lengths, graph.constant(f"{name}/per_row", [-1, 1, 1, 1], np.int64)],
                             f"{name}/lengths")
        seen = graph.node("Less", [index, lengths], f"{name}/valid_keys")
    if causal:
        queries = graph.node("Unsqueeze", [index, graph.constant(f"{name}/column", [1], np.int64)], f"{name}/queries")
        earlier = graph.node("LessOrEqual", [index, queries], f"{name}/earlier")
        seen = earlier if seen is None else graph.node("And", [seen, earlier], f"{name}/seen")
    return seen


def _projected(graph, x, weights: str, biases, parts: int, layer, name: str) -> str:
    """(parts, N, heads, T, width): the rows `x` (N, T, F_in) through `weights` plus `biases`, cut into `parts`
    (q, k, v) of `heads` heads."""
    rows = graph.node("Add", [graph.node("MatMul", [x, graph.constant(f"{name}/{weights}", layer.params[weights])],
                                         f"{name}/{weights}"), graph.constant(f"{name}/b_{weights}", biases)],
                      f"{name}/{weights}")
    shape = graph.constant(f"{name}/{weights}_heads", [0, 0, parts, layer.heads, layer.width], np.int64)
    return graph.node("Transpose", [graph.node("Reshape", [rows, shape], f"{name}/{weights}")], f"{name}/{weights}",
                      perm=[2, 0, 3, 1, 4])


def _part(graph, parts: str, index: int, name: str) -> str:
    return graph.node("Gather", [parts, graph.constant(f"{name}_index", index, np.int64)], name, axis=0)


def _attended(graph, layer, q, k, v, seen, name: str) -> str:
    """The output (N, Tq, F) of the heads' queries `q` (N, heads, Tq, width) over keys `k` and values `v`, the
    scores' softmax over the keys `seen` (None: all), through `W_out` and `b_out`."""
    keys = graph.node("Transpose", [k], f"{name}/keys", perm=[0, 1, 3, 2])
    scores = graph.node("Mul", [graph.node("MatMul", [q, keys], f"{name}/scores"),
                                graph.constant(f"{name}/scale", 1 / math.sqrt(layer.width))], f"{name}/scores")
    if seen is not None:
        scores = graph.node("Where", [seen, scores, graph.constant(f"{name}/never", -np.inf)], f"{name}/masked")
    weights = graph.node("Softmax", [scores], f"{name}/weights", axis=-1)
    heads_out = graph.node("Transpose", [graph.node("MatMul", [weights, v], f"{name}/heads")], f"{name}/heads",
                           perm=[0, 2, 1, 3])
    joined = graph.node("Reshape", [heads_out, graph.constant(f"{name}/joined_shape", [0, 0, layer.features],
                                                              np.int64)], f"{name}/joined")
    return graph.node("Add", [graph.node("MatMul", [joined, graph.constant(f"{name}/W_out", layer.params["W_out"])],
                                         f"{name}/out"), graph.constant(f"{name}/b_out", layer.params["b_out"])], name)


@emits(Attention)
def attention(graph, layer, x, name, input_shape):
    qkv = _projected(graph, x, "W", layer.params["b"], 3, layer, name)
    q, k, v = (_part(graph, qkv, i, f"{name}/{part}") for i, part in enumerate("qkv"))
    return _attended(graph, layer, q, k, v, _seen_keys(graph, x, graph.lengths, layer.causal, name), name)


@emits(CrossAttention)
def cross_attention(graph, layer, inputs, name, input_shapes):
    """The queries of `inputs[0]` over the memory `inputs[1]`, whose lengths are `graph.input_lengths[1]`."""
    (x, memory), f = inputs, layer.features
    q = _part(graph, _projected(graph, x, "W_q", layer.params["b"][:f], 1, layer, name), 0, f"{name}/q")
    kv = _projected(graph, memory, "W_kv", layer.params["b"][f:], 2, layer, name)
    k, v = (_part(graph, kv, i, f"{name}/{part}") for i, part in enumerate("kv"))
    return _attended(graph, layer, q, k, v, _seen_keys(graph, memory, graph.input_lengths[1], False, name), name)


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
