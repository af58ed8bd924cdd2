"""ONNX emitters of the layers on sequences (N, T, F) of lengths `graph.lengths`: conv1d, the global pools over
time, the token embedding, the embedding bag, and the [CLS] token and its pool, each masking the padded steps it must not read."""
from __future__ import annotations

import numpy as np

from mpitrain.nn.cls_token import ClsPool, ClsToken
from mpitrain.nn.embedding_bag import EmbeddingBag
from mpitrain.nn.onnx.graph import emits, host
from mpitrain.nn.positional import Positional
from mpitrain.nn.sequence import Conv1D, GlobalAvgPool1D, GlobalMaxPool1D
from mpitrain.nn.tokens import TokenEmbedding


def step_index(graph, x, name: str) -> str:
    """(T,) int64: 0, 1, ..., T - 1, the steps of the sequences `x` (N, T, F)."""
    steps = graph.node("Gather", [graph.node("Shape", [x], f"{name}/steps"), graph.constant(f"{name}/time_axis", 1,
                                                                                              np.int64)],
                       f"{name}/steps", axis=0)
    return graph.node("Range", [graph.constant(f"{name}/zero", 0, np.int64), steps,
                                graph.constant(f"{name}/one", 1, np.int64)], f"{name}/steps")


def _valid_steps(graph, x, name: str) -> str:
    """(N, T, 1) bool: True at the valid steps of the sequences `x` (N, T, F) of lengths `graph.lengths`."""
    index = step_index(graph, x, name)
    lengths = graph.node("Unsqueeze", [graph.lengths, graph.constant(f"{name}/row_axis", [1], np.int64)],
                         f"{name}/lengths")
    return graph.node("Unsqueeze", [graph.node("Less", [index, lengths], f"{name}/valid"),
                                    graph.constant(f"{name}/feature_axis", [2], np.int64)], f"{name}/valid")


def _masked(graph, x, name: str, fill: float, dtype=None) -> str:
    """`x` (N, T, F) with its padded steps set to `fill` (of `x`'s `dtype`, by default the graph's; Where, so whatever
    the padding holds); `x` itself without lengths (every step valid)."""
    if graph.lengths is None:
        return x
    return graph.node("Where", [_valid_steps(graph, x, name), x, graph.constant(f"{name}/fill", fill, dtype)], name)


@emits(Positional)
def positional(graph, layer, x, name, input_shape):
    """x + the table's first T rows, T the batch's steps (Shape from 1 to 2, then Slice), zero rows past the table
    (Pad: a batch padded further than max_steps); the learned table or the fixed sinusoids."""
    table = graph.constant(f"{name}/table", layer.params["table"] if layer.params else layer.fixed)
    steps = graph.node("Shape", [x], f"{name}/steps", start=1, end=2)
    rows = graph.node("Slice", [table, graph.constant(f"{name}/first", [0], np.int64), steps,
                                graph.constant(f"{name}/axis", [0], np.int64)], name)
    beyond = graph.node("Max", [graph.node("Sub", [steps, graph.constant(f"{name}/max_steps", [layer.max_steps],
                                                                          np.int64)], f"{name}/beyond"),
                                graph.constant(f"{name}/none", [0], np.int64)], f"{name}/beyond")
    pads = graph.node("Concat", [graph.constant(f"{name}/no_start", [0, 0], np.int64), beyond,
                                 graph.constant(f"{name}/no_feature", [0], np.int64)], f"{name}/pads", axis=0)
    return graph.node("Add", [x, graph.node("Pad", [rows, pads], name)], name)


@emits(TokenEmbedding)
def token_embedding(graph, layer, x, name, input_shape):
    """Gather of the table's rows by the ids (N, T, 1) as int64, padded steps read as id 0 (their values are free)."""
    ids = graph.node("Cast", [x], f"{name}/ids", to=graph.onnx.TensorProto.INT64)  # the input's int64 already, or
    ids = _masked(graph, ids, f"{name}/input", 0, np.int64)  # a float32 column's integers
    ids = graph.node("Squeeze", [ids, graph.constant(f"{name}/feature_axis", [2], np.int64)], f"{name}/ids")
    return graph.node("Gather", [graph.constant(f"{name}/table", layer.params["table"]), ids], name, axis=0)


@emits(Conv1D)
def conv1d(graph, layer, x, name, input_shape):
    """Mask, then Conv over (N, F, T) with the layer's pads, stride and dilation (`Conv1D`: the same for every
    sequence, so one Conv serves ragged batches); the output lengths from `graph.lengths` as `output_lengths`."""
    x = graph.node("Transpose", [_masked(graph, x, f"{name}/input", 0.0)], f"{name}/input", perm=[0, 2, 1])
    y = graph.node("Conv", [x, graph.constant(f"{name}/W", host(layer.params["W"]).transpose(2, 1, 0)),
                            graph.constant(f"{name}/b", layer.params["b"])], name,
                   kernel_shape=[layer.kernel], strides=[layer.stride], dilations=[layer.dilation],
                   pads=[layer.pad_left, layer.pad_right])
    if graph.lengths is not None:
        shift = graph.constant(f"{name}/shift", layer.pad_left + layer.pad_right - layer.span + layer.stride, np.int64)
        graph.lengths = graph.node("Div", [graph.node("Add", [graph.lengths, shift], f"{name}/lengths"),
                                           graph.constant(f"{name}/stride", layer.stride, np.int64)], f"{name}/lengths")
    return graph.node("Transpose", [y], name, perm=[0, 2, 1])


@emits(GlobalMaxPool1D)
def global_max_pool(graph, layer, x, name, input_shape):
    """ReduceMax over the valid steps; an empty sequence's zeros (Where its length is 0)."""
    lengths = graph.lengths
    y = graph.node("ReduceMax", [_masked(graph, x, f"{name}/input", -np.inf)], name, axes=[1], keepdims=0)
    if lengths is None:
        return y
    graph.lengths = None
    empty = graph.node("Equal", [graph.node("Unsqueeze", [lengths, graph.constant(f"{name}/row_axis", [1], np.int64)],
                                            f"{name}/lengths"), graph.constant(f"{name}/none", 0, np.int64)],
                       f"{name}/empty")
    return graph.node("Where", [empty, graph.constant(f"{name}/zero", 0, graph.dtype), y], name)


@emits(GlobalAvgPool1D)
def global_avg_pool(graph, layer, x, name, input_shape):
    """The valid steps' sum over the lengths (as floats, at least 1: an empty sequence's zeros); without lengths,
    ReduceMean over all steps."""
    if graph.lengths is None:
        return graph.node("ReduceMean", [x], name, axes=[1], keepdims=0)
    total = graph.node("ReduceSum", [_masked(graph, x, f"{name}/input", 0.0),
                                     graph.constant(f"{name}/time_axis", [1], np.int64)], name, keepdims=0)
    lengths = graph.node("Cast", [graph.node("Max", [graph.lengths, graph.constant(f"{name}/one", 1, np.int64)],
                                             f"{name}/lengths")], f"{name}/lengths",
                         to=graph.onnx.helper.np_dtype_to_tensor_dtype(graph.dtype))
    graph.lengths = None
    return graph.node("Div", [total, graph.node("Unsqueeze", [lengths, graph.constant(f"{name}/row_axis", [1], np.int64)],
                                                f"{name}/lengths")], name)


@emits(ClsToken)
def cls_token(graph, layer, x, name, input_shape):
    """The token Expanded to (N, 1, F) and Concatenated before the steps; the lengths one more (Add)."""
    rows = graph.node("Slice", [graph.node("Shape", [x], f"{name}/shape"), graph.constant(f"{name}/first", [0],
                                                                                           np.int64),
                                graph.constant(f"{name}/second", [1], np.int64)], f"{name}/rows")
    shape = graph.node("Concat", [rows, graph.constant(f"{name}/one_step", [1, layer.params["token"].shape[0]],
                                                       np.int64)], f"{name}/token_shape", axis=0)
    token = graph.node("Expand", [graph.constant(f"{name}/token", layer.params["token"]), shape], f"{name}/token")
    if graph.lengths is not None:
        graph.lengths = graph.node("Add", [graph.lengths, graph.constant(f"{name}/one", 1, np.int64)],
                                   f"{name}/lengths")
    return graph.node("Concat", [token, x], name, axis=1)


@emits(ClsPool)
def cls_pool(graph, layer, x, name, input_shape):
    """Step 0 of the sequence (Gather on the time axis)."""
    pooled = graph.node("Gather", [x, graph.constant(f"{name}/first", 0, np.int64)], name, axis=1)
    graph.lengths = None
    return pooled


@emits(EmbeddingBag)
def embedding_bag(graph, layer, x, name, input_shape):
    """The bag's ids (int64, padded ones read as 0) Gather their rows (N, T, dim); padded steps masked to 0 (-inf for
    max); ReduceSum over the steps (over the lengths at least 1 for mean), or ReduceMax with empty bags set to 0."""
    ids = graph.node("Cast", [x], f"{name}/ids", to=graph.onnx.TensorProto.INT64)  # the input's int64 already
    ids = _masked(graph, ids, f"{name}/input", 0, np.int64)
    ids = graph.node("Squeeze", [ids, graph.constant(f"{name}/feature_axis", [2], np.int64)], f"{name}/ids")
    rows = graph.node("Gather", [graph.constant(f"{name}/table", layer.params["table"]), ids], f"{name}/rows", axis=0)
    lengths = graph.lengths
    rows = _masked(graph, rows, f"{name}/rows", -np.inf if layer.mode == "max" else 0.0)
    graph.lengths = None
    if layer.mode == "max":
        y = graph.node("ReduceMax", [rows], f"{name}/largest", axes=[1], keepdims=0)
        if lengths is None:
            return y
        empty = graph.node("Equal", [graph.node("Unsqueeze", [lengths, graph.constant(f"{name}/row_axis", [1],
                                                                                        np.int64)], f"{name}/lengths"),
                                     graph.constant(f"{name}/none", 0, np.int64)], f"{name}/empty")
        return graph.node("Where", [empty, graph.constant(f"{name}/zero", 0.0), y], name)
    total = graph.node("ReduceSum", [rows, graph.constant(f"{name}/time_axis", [1], np.int64)], f"{name}/sum",
                       keepdims=0)
    if layer.mode == "sum":
        return total
    if lengths is None:
        steps = graph.node("Shape", [x], f"{name}/steps", start=1, end=2)
    else:
        steps = graph.node("Max", [graph.node("Unsqueeze", [lengths, graph.constant(f"{name}/row_axis", [1],
                                                                                    np.int64)], f"{name}/lengths"),
                                   graph.constant(f"{name}/one", 1, np.int64)], f"{name}/count")
    count = graph.node("Cast", [steps], f"{name}/count", to=graph.onnx.helper.np_dtype_to_tensor_dtype(graph.dtype))
    return graph.node("Div", [total, count], name)
