"""A model's layers as ONNX nodes: a list of layers (`emit_layers`) or a graph's nodes (`emit_nodes`), each layer
by its registered emitter (`mpitrain.nn.onnx.graph.EMITTERS`)."""
from __future__ import annotations

from mpitrain.base.errors import MpitrainError
from mpitrain.nn.layers import is_sequence
from mpitrain.nn.merge import Add, Concat
from mpitrain.nn.onnx.graph import EMITTERS, OnnxGraph


def check_exportable(layers, where: str = "layer") -> None:
    """A one-line error naming the first of `layers` that has no emitter (one of the user's own Layer classes)."""
    for index, layer in enumerate(layers):
        if type(layer) not in EMITTERS and type(layer) not in (Concat, Add):  # a graph's merges: emit_nodes
            raise MpitrainError(f"{where} {index} of the model is a {type(layer).__name__}, which has no ONNX "
                                f"export; exportable layers are {sorted(cls.__name__ for cls in EMITTERS)}")


def emit_layer(graph: OnnxGraph, layer, x: str, name: str, input_shape: tuple[int, ...]) -> str:
    """Append `layer` (one of `EMITTERS`' types; `check_exportable` first) on input `x`, whose rows have
    `input_shape`, as nodes named `name/OP`; the name of its output."""
    x = x if layer.reads_ids else graph.numbers(x, name)
    return EMITTERS[type(layer)](graph, layer, x, name, tuple(input_shape))


def emit_layers(graph: OnnxGraph, model, x: str) -> str:
    """A list of layers' model (`mpitrain.nn.model.Sequential`) on the scaled rows `x`, each layer named as the
    model's layout names it; the last layer's output name."""
    shape = tuple(model.input_shape)
    for layer, name in zip(model.layers, model.names):
        x = emit_layer(graph, layer, x, name, shape)
        shape = layer.output_shape(shape)
    return x


def emit_nodes(graph: OnnxGraph, model, x: str | None, columns: dict[str, tuple[str, str | None]]) -> str:
    """A graph model's nodes (`mpitrain.nn.graph.Graph`) on the scaled rows `x` and the inputs of its `columns`
    ({column: (values name, lengths name)}: the categorical ids, of no lengths, and the sequence columns): each
    other column group a Slice of the row (the whole row when it is the one input),
    each node's layers on its inputs' outputs (an embedding one Gather per column), concat a Concat along the last
    axis, add a chain of Adds, another merge (cross-attention) its emitter on the list of its inputs (their lengths
    `graph.input_lengths`); each value's lengths kept (`graph.lengths` set to a node's input's before its
    layers, a merge's output has its inputs' one lengths); the output node's output name."""
    values, shapes, lengths = {}, {}, {}
    for name, group in model.groups.items():
        if name not in columns:
            values[name] = x if model.whole_row else graph.columns(x, group.start, group.stop, f"input/{name}")
        shapes[name], lengths[name] = group.shape, None
    for name, (value, steps) in columns.items():
        values[name], lengths[name] = value, steps
        shapes[name] = model.sequences[name] if name in model.sequences else shapes[name]
    for index, node in enumerate(model.nodes):
        inputs = [values[name] for name in node.inputs]
        graph.lengths = lengths[node.inputs[0]]
        if node.merge:  # a merge reads numbers (a layer's own emitter converts what it reads: `emit_layer`)
            inputs = [graph.numbers(value, f"{node.name}/{k}") for k, value in enumerate(inputs)]
        if isinstance(node.merge, Concat):
            value = graph.node("Concat", inputs, node.name, axis=-1)
            shape = node.merge.merged_shape([shapes[name] for name in node.inputs])
        elif isinstance(node.merge, Add):
            value = inputs[0]
            for k, other in enumerate(inputs[1:]):
                value = graph.node("Add", [value, other], f"{node.name}/{k}")
            shape = shapes[node.inputs[0]]
        elif node.merge:  # a merge with an emitter of its own, on the list of its inputs
            graph.input_lengths = [lengths[name] for name in node.inputs]
            input_shapes = [shapes[name] for name in node.inputs]
            value = EMITTERS[type(node.merge)](graph, node.merge, inputs, node.name, input_shapes)
            shape = node.merge.merged_shape(input_shapes)
        else:
            value, shape = inputs[0], shapes[node.inputs[0]]
            for k, layer in enumerate(node.layers):  # named as the model's layout names them
                value = emit_layer(graph, layer, value, model.names[model.first_layer[index] + k], shape)
                shape = layer.output_shape(shape)
        values[node.name], shapes[node.name] = value, shape
        lengths[node.name] = graph.lengths if is_sequence(shape) else None
    return values[model.nodes[-1].name]
