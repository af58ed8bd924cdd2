"""The ONNX emitters of a table's embedding (a graph node on the categorical columns) and of its columns as tokens
(`feature_tokens`)."""
from __future__ import annotations

import numpy as np

from mpitrain.nn.embedding import Embedding
from mpitrain.nn.feature_tokens import FeatureTokens, FeatureTokensWithEmbeddings
from mpitrain.nn.onnx.graph import emits


@emits(Embedding)
def embedding(graph, layer, x, name, input_shape):
    """Per categorical column: its ids (a Slice of the int64 input `categorical`) Gather their table's rows,
    (N, 1, dim); the columns joined (N, columns, dim) with one dim, else side by side and flattened (N, sum of
    dims), as the layer gives."""
    rows = []
    for j, (table, values) in enumerate(layer.whole_tables()):
        ids = graph.columns(x, j, j + 1, f"{name}/{j}")
        rows.append(graph.node("Gather", [graph.constant(f"{name}/{table}", values), ids], f"{name}/{j}", axis=0))
    if len(layer.output_shape(input_shape)) == 2:
        return graph.node("Concat", rows, name, axis=1)
    return graph.node("Flatten", [graph.node("Concat", rows, name, axis=2)], name, axis=1)


def _numeric_tokens(graph, layer, x, name: str) -> str:
    """(N, k, dim): the numbers (N, k) Unsqueezed to (N, k, 1) times their weights (k, dim)."""
    column = graph.node("Unsqueeze", [x, graph.constant(f"{name}/token_axis", [2], np.int64)], f"{name}/numbers")
    return graph.node("Mul", [column, graph.constant(f"{name}/weight", layer.params["weight"])], f"{name}/numeric")


@emits(FeatureTokens)
def feature_tokens(graph, layer, x, name, input_shape):
    """Each number times its weights plus its biases; the tokens are no padded sequence (`graph.lengths` None)."""
    graph.lengths = None
    return graph.node("Add", [_numeric_tokens(graph, layer, x, name), graph.constant(f"{name}/bias",
                                                                                     layer.params["bias"])], name)


@emits(FeatureTokensWithEmbeddings)
def feature_tokens_with_embeddings(graph, layer, inputs, name, input_shapes):
    """The numeric tokens and the embeddings Concatenated on the token axis, plus the biases."""
    numeric, embedded = inputs
    tokens = graph.node("Concat", [_numeric_tokens(graph, layer, numeric, name), embedded], f"{name}/tokens", axis=1)
    graph.lengths = None
    return graph.node("Add", [tokens, graph.constant(f"{name}/bias", layer.params["bias"])], name)
