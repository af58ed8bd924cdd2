"""The ONNX emitter of a table's embedding (a graph node on the categorical columns)."""
from __future__ import annotations

from mpitrain.nn.embedding import Embedding
from mpitrain.nn.onnx.graph import emits


@emits(Embedding)
def embedding(graph, layer, x, name, input_shape):
    """Per categorical column: its ids (Slice, Cast to int64) Gather their table's rows, (N, 1, dim); the columns
    joined (N, columns, dim) with one dim, else side by side and flattened (N, sum of dims), as the layer gives."""
    rows = []
    for j, table in enumerate(layer.tables):
        ids = graph.node("Cast", [graph.columns(x, j, j + 1, f"{name}/{j}")], f"{name}/{j}",
                         to=graph.onnx.TensorProto.INT64)
        rows.append(graph.node("Gather", [graph.constant(f"{name}/{table.name}", layer.params[table.name]), ids],
                               f"{name}/{j}", axis=0))
    if len(layer.output_shape(input_shape)) == 2:
        return graph.node("Concat", rows, name, axis=1)
    return graph.node("Flatten", [graph.node("Concat", rows, name, axis=2)], name, axis=1)
