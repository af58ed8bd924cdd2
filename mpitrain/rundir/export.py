"""A trained model as an ONNX graph: stored dataset rows in, probabilities (or regression's values) out.

    mpitrain export runs/fashion_lenet --out lenet.onnx                     # a run's newest checkpoint
    export_onnx(model, manifest, "model.onnx", normalize=True)              # a model built in Python

The graph (opset 17, built with `onnx.helper`, weights as initializers named like the
checkpoint's layout, e.g. `00_dense/W`) takes rows as the dataset stores them, uint8 or float32
of shape [N, *feature_shape] with a symbolic batch N, and first applies the manifest's scaling
as `mpitrain.data.reader.Batches` does (Cast, Mul, Add), so onnxruntime gives `mpitrain predict`'s
outputs. It ends by the target kind (`OUTPUT_HEADS`): class targets in a Softmax (output `probabilities`), binary
and multilabel targets in a Sigmoid (`probabilities`), regression targets in the values themselves (`values`).
`metadata_props` record where the model came from (run dir, checkpoint, the manifest's sha256) and the manifest's
feature and target description, which `mpitrain score` reads.

The graph is built by emitters that each append a part to an `OnnxGraph` and return the name of that part's
output: `emit_input_scaling`, one per layer type (`emit_layer`, `LAYER_EMITTERS`) and `emit_output_head`. A graph
model (`model.graph`) goes node by node (`emit_nodes`): its column groups are Slices of the row, its sequence
columns inputs of their own (`onnx_sequence_inputs`: `NAME` and `NAME_lengths` each), an embedding is a Gather per
categorical column, concat and add are Concat and Add. A table's raw records are encoded into the rows the graph
takes (numbers standardized, categories as ids) by `mpitrain.data.encoding.TableEncoder` from the manifest's
`columns`, which the metadata carries: Spark scoring does it; another runtime applies the same mapping (docs/tables.md).
"""
from __future__ import annotations

import json
import os

import numpy as np

from mpitrain import __version__
from mpitrain.base.errors import ConfigError, MpitrainError
from mpitrain.base.files import write_file
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import AvgPool2D, Conv2D, MaxPool2D
from mpitrain.nn.embedding import Embedding
from mpitrain.nn.layers import Dense, Dropout, Flatten, ReLU, Sigmoid, Tanh, is_sequence
from mpitrain.nn.losses import check_loss_fits
from mpitrain.nn.merge import Add, Concat
from mpitrain.nn.recurrent import GRU, LSTM
from mpitrain.nn.sequence import Conv1D, GlobalAvgPool1D, GlobalMaxPool1D
from mpitrain.nn.tokens import TokenEmbedding
from mpitrain.rundir.directory import check_output

OPSET = 17
INPUT = "x"
LENGTHS = "lengths"  # a sequence model's second input: each row's steps (docs/sequences.md)
# A model of several inputs (a graph on sequence columns beside each other or fixed features) takes `x` (the fixed
# features, when there are any) and per sequence column its values, named as the column, and its lengths, so named:
LENGTHS_SUFFIX = "_lengths"
# The graph's last operator and its output's name, by target kind (`Manifest.target`).
OUTPUT_HEADS = {"class": ("Softmax", "probabilities"), "binary": ("Sigmoid", "probabilities"),
                "multilabel": ("Sigmoid", "probabilities"), "regression": (None, "values"),
                "reconstruction": (None, "reconstruction")}  # an autoencoder's: Sigmoid under binary_cross_entropy
# The manifest's description of rows and targets, in metadata "manifest".
MANIFEST_KEYS = ("feature_shape", "feature_dtype", "scale", "offset", "mean", "std", "num_classes", "class_names",
                 "target", "target_names", "source", "seed", "transforms", "columns", "sequences", "step_target")


def require_onnx():
    """The onnx module, or a one-line error saying which extra installs it."""
    try:
        import onnx
    except ImportError:
        raise ConfigError("ONNX export needs the onnx package (pip install 'mpitrain[onnx]')") from None
    return onnx


class OnnxGraph:
    """An ONNX graph under construction: nodes and initializers appended in order, each node's output named
    `NAME/OP` after the node. Every emitter takes the graph and its input's name and returns its output's name.
    `lengths` is the name of the (N,) int64 lengths tensor of the current input when it is a sequence (N, T, F)
    (docs/sequences.md): a sequence layer's emitter reads it and sets its output's (None: not a sequence); a graph
    model's emitter (`emit_nodes`) keeps each value's and sets it before each node."""

    def __init__(self, dtype: np.dtype):
        self.onnx, self.dtype = require_onnx(), np.dtype(dtype)
        self.nodes, self.initializers = [], []
        self.lengths: str | None = None  # a sequence's (N,) int64 lengths tensor, while the values are a sequence

    def constant(self, name: str, value, dtype=None) -> str:
        """An initializer `name` holding `value` (numpy or cupy) in `dtype`, by default the graph's."""
        array = np.ascontiguousarray(_host(value), dtype=self.dtype if dtype is None else dtype)
        self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attributes) -> str:
        """Append operator `op` on `inputs` (names of earlier outputs, inputs or initializers); its output's name."""
        output = f"{name}/{op}"
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [output], name=output, **attributes))
        return output


def _host(array) -> np.ndarray:
    """A numpy copy of a numpy or cupy array (a model may live on a GPU)."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


def _pads(g) -> list[int]:
    """ONNX pads [top, left, bottom, right] of a `kernels.im2col.Geometry`: its own top and left, and at the
    bottom and right exactly what its last window reaches past the image (none for `valid`)."""
    (kh, kw), s = g.kernel, g.stride
    return [g.pad_top, g.pad_left, max((g.out_height - 1) * s + kh - g.height - g.pad_top, 0),
            max((g.out_width - 1) * s + kw - g.width - g.pad_left, 0)]


def _dense(graph, layer, x, name, input_shape):
    if is_sequence(input_shape):  # each step's features: MatMul on (N, T, F)
        product = graph.node("MatMul", [x, graph.constant(f"{name}/W", layer.params["W"])], name)
        return graph.node("Add", [product, graph.constant(f"{name}/b", layer.params["b"])], name)
    if len(input_shape) > 1:
        x = graph.node("Flatten", [x], name, axis=1)
    return graph.node("Gemm", [x, graph.constant(f"{name}/W", layer.params["W"]),
                               graph.constant(f"{name}/b", layer.params["b"])], name)


def _conv(graph, layer, x, name, input_shape):
    g = layer.g
    return graph.node("Conv", [x, graph.constant(f"{name}/W", layer.params["W"]),
                               graph.constant(f"{name}/b", layer.params["b"])], name,
                      kernel_shape=list(g.kernel), strides=[g.stride, g.stride], pads=_pads(g))


def _pool(op: str, **attributes):
    def emit(graph, layer, x, name, input_shape):
        g = layer.g
        return graph.node(op, [x], name, kernel_shape=list(g.kernel), strides=[g.stride, g.stride], pads=_pads(g),
                          **attributes)
    return emit


def _batchnorm(graph, layer, x, name, input_shape):
    """Inference mode with the running statistics; on dense (N, F) inputs F is the channel axis."""
    return graph.node("BatchNormalization", [x, graph.constant(f"{name}/gamma", layer.params["gamma"]),
                                             graph.constant(f"{name}/beta", layer.params["beta"]),
                                             graph.constant(f"{name}/mean", layer.stats["mean"]),
                                             graph.constant(f"{name}/var", layer.stats["var"])], name,
                      epsilon=float(layer.eps))


def _columns(graph, x, start: int, stop: int, name: str) -> str:
    """Columns [start, stop) of the rows `x` (N, k): a Slice."""
    return graph.node("Slice", [x, graph.constant(f"{name}/starts", [start], np.int64),
                                graph.constant(f"{name}/ends", [stop], np.int64),
                                graph.constant(f"{name}/axes", [1], np.int64)], name)


def _embedding(graph, layer, x, name, input_shape):
    """Per categorical column: its ids (Slice, Cast to int64) Gather their table's rows, (N, 1, dim); the columns
    joined (N, columns, dim) with one dim, else side by side and flattened (N, sum of dims), as the layer gives."""
    rows = []
    for j, table in enumerate(layer.tables):
        ids = graph.node("Cast", [_columns(graph, x, j, j + 1, f"{name}/{j}")], f"{name}/{j}",
                         to=graph.onnx.TensorProto.INT64)
        rows.append(graph.node("Gather", [graph.constant(f"{name}/{table.name}", layer.params[table.name]), ids],
                               f"{name}/{j}", axis=0))
    if len(layer.output_shape(input_shape)) == 2:
        return graph.node("Concat", rows, name, axis=1)
    return graph.node("Flatten", [graph.node("Concat", rows, name, axis=2)], name, axis=1)


def _recurrent(op: str, **attributes):
    """ONNX `LSTM`/`GRU` (layout 0: time-major, so the sequences are transposed in and out) on (N, T, F) rows, with
    `sequence_lens` from `graph.lengths`: (N, T, H * directions) with `return_sequences` (ONNX's Y, zero at padded
    steps), else the last states (N, H * directions) (Y_h: forward after lengths-1, backward after step 0).
    The layer's weights are ONNX's transposed, stacked by direction (`_onnx_biases`). Without `graph.lengths`
    every sequence is T steps long."""
    def emit(graph, layer, x, name, input_shape):
        directions = layer.directions
        inputs = [graph.node("Transpose", [x], name, perm=[1, 0, 2])]
        inputs += [graph.constant(f"{name}/{w}", np.stack([_host(layer.params[f"{w}{d}"]).T for d in directions]))
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


def _valid_steps(graph, x, name: str) -> str:
    """(N, T, 1) bool: True at the valid steps of the sequences `x` (N, T, F) of lengths `graph.lengths`."""
    steps = graph.node("Gather", [graph.node("Shape", [x], f"{name}/steps"), graph.constant(f"{name}/time_axis", 1,
                                                                                              np.int64)],
                       f"{name}/steps", axis=0)
    index = graph.node("Range", [graph.constant(f"{name}/zero", 0, np.int64), steps,
                                 graph.constant(f"{name}/one", 1, np.int64)], f"{name}/steps")
    lengths = graph.node("Unsqueeze", [graph.lengths, graph.constant(f"{name}/row_axis", [1], np.int64)],
                         f"{name}/lengths")
    return graph.node("Unsqueeze", [graph.node("Less", [index, lengths], f"{name}/valid"),
                                    graph.constant(f"{name}/feature_axis", [2], np.int64)], f"{name}/valid")


def _masked(graph, x, name: str, fill: float) -> str:
    """`x` (N, T, F) with its padded steps set to `fill` (Where, so whatever the padding holds); `x` itself without
    lengths (every step valid)."""
    if graph.lengths is None:
        return x
    return graph.node("Where", [_valid_steps(graph, x, name), x, graph.constant(f"{name}/fill", fill)], name)


def _token_embedding(graph, layer, x, name, input_shape):
    """Gather of the table's rows by the ids (N, T, 1) as int64, padded steps read as id 0 (their values are free)."""
    ids = graph.node("Cast", [_masked(graph, x, f"{name}/input", 0.0)], f"{name}/ids", to=graph.onnx.TensorProto.INT64)
    ids = graph.node("Squeeze", [ids, graph.constant(f"{name}/feature_axis", [2], np.int64)], f"{name}/ids")
    return graph.node("Gather", [graph.constant(f"{name}/table", layer.params["table"]), ids], name, axis=0)


def _conv1d(graph, layer, x, name, input_shape):
    """Mask, then Conv over (N, F, T) with the layer's pads, stride and dilation (`Conv1D`: the same for every
    sequence, so one Conv serves ragged batches); the output lengths from `graph.lengths` as `output_lengths`."""
    x = graph.node("Transpose", [_masked(graph, x, f"{name}/input", 0.0)], f"{name}/input", perm=[0, 2, 1])
    y = graph.node("Conv", [x, graph.constant(f"{name}/W", _host(layer.params["W"]).transpose(2, 1, 0)),
                            graph.constant(f"{name}/b", layer.params["b"])], name,
                   kernel_shape=[layer.kernel], strides=[layer.stride], dilations=[layer.dilation],
                   pads=[layer.pad_left, layer.pad_right])
    if graph.lengths is not None:
        shift = graph.constant(f"{name}/shift", layer.pad_left + layer.pad_right - layer.span + layer.stride, np.int64)
        graph.lengths = graph.node("Div", [graph.node("Add", [graph.lengths, shift], f"{name}/lengths"),
                                           graph.constant(f"{name}/stride", layer.stride, np.int64)], f"{name}/lengths")
    return graph.node("Transpose", [y], name, perm=[0, 2, 1])


def _global_max_pool(graph, layer, x, name, input_shape):
    x = _masked(graph, x, f"{name}/input", -np.inf)
    graph.lengths = None
    return graph.node("ReduceMax", [x], name, axes=[1], keepdims=0)


def _global_avg_pool(graph, layer, x, name, input_shape):
    """The valid steps' sum over the lengths (as floats); without lengths, ReduceMean over all steps."""
    if graph.lengths is None:
        return graph.node("ReduceMean", [x], name, axes=[1], keepdims=0)
    total = graph.node("ReduceSum", [_masked(graph, x, f"{name}/input", 0.0),
                                     graph.constant(f"{name}/time_axis", [1], np.int64)], name, keepdims=0)
    lengths = graph.node("Cast", [graph.lengths], f"{name}/lengths",
                         to=graph.onnx.helper.np_dtype_to_tensor_dtype(graph.dtype))
    graph.lengths = None
    return graph.node("Div", [total, graph.node("Unsqueeze", [lengths, graph.constant(f"{name}/row_axis", [1], np.int64)],
                                                f"{name}/lengths")], name)


def _onnx_biases(layer, d: str) -> np.ndarray:
    """ONNX's B of direction `d` of a recurrent layer: the input bias, then the recurrent bias (zero for an LSTM,
    whose one bias is the input side's)."""
    recurrent = _host(layer.params[f"{layer.recurrent_bias}{d}"]) if layer.recurrent_bias else \
        np.zeros(layer.gates * layer.units)
    return np.concatenate([_host(layer.params[f"{layer.input_bias}{d}"]), recurrent])


def _same(op: str):
    return lambda graph, layer, x, name, input_shape: graph.node(op, [x], name)


# One emitter per layer type, matched exactly (a subclass may compute something else):
# emitter(graph, layer, input name, node name, the layer's input shape less the batch) -> output name.
LAYER_EMITTERS = {Dense: _dense, Conv2D: _conv, MaxPool2D: _pool("MaxPool"),
                  AvgPool2D: _pool("AveragePool", count_include_pad=1), BatchNorm: _batchnorm,
                  ReLU: _same("Relu"), Tanh: _same("Tanh"), Sigmoid: _same("Sigmoid"),
                  Flatten: lambda graph, layer, x, name, input_shape: graph.node("Flatten", [x], name, axis=1),
                  Dropout: _same("Identity"), Embedding: _embedding,  # dropout is the identity at inference
                  LSTM: _recurrent("LSTM"), GRU: _recurrent("GRU", linear_before_reset=1),
                  Conv1D: _conv1d, GlobalMaxPool1D: _global_max_pool, GlobalAvgPool1D: _global_avg_pool,
                  TokenEmbedding: _token_embedding}


def check_exportable(layers, where: str = "layer") -> None:
    """A one-line error naming the first of `layers` that has no emitter (one of the user's own Layer classes)."""
    for index, layer in enumerate(layers):
        if type(layer) not in LAYER_EMITTERS and type(layer) not in (Concat, Add):  # a graph's merges: emit_nodes
            raise MpitrainError(f"{where} {index} of the model is a {type(layer).__name__}, which has no ONNX "
                                f"export; exportable layers are {sorted(cls.__name__ for cls in LAYER_EMITTERS)}")


def emit_layer(graph: OnnxGraph, layer, x: str, name: str, input_shape: tuple[int, ...]) -> str:
    """Append `layer` (one of `LAYER_EMITTERS`' types; `check_exportable` first) on input `x`, whose rows have
    `input_shape`, as nodes named `name/OP`; the name of its output."""
    return LAYER_EMITTERS[type(layer)](graph, layer, x, name, tuple(input_shape))


def emit_input_scaling(graph: OnnxGraph, x: str, scale, shift, name: str = "input") -> str:
    """Stored values to the model's: Cast to the graph's dtype, Mul by `scale`, Add `shift` (numbers or arrays that
    broadcast over a row), as `mpitrain.data.reader` prepares a batch."""
    x = graph.node("Cast", [x], name, to=graph.onnx.helper.np_dtype_to_tensor_dtype(graph.dtype))
    x = graph.node("Mul", [x, graph.constant(f"{name}/scale", scale)], name)
    return graph.node("Add", [x, graph.constant(f"{name}/shift", shift)], name)


def emit_nodes(graph: OnnxGraph, model, x: str | None, sequences: dict[str, tuple[str, str]]) -> str:
    """A graph model's nodes (`mpitrain.nn.graph.Graph`) on the scaled rows `x` and the `sequences` ({column:
    (values name, lengths name)}): each column group a Slice of the row (the whole row when it is the one input),
    each node's layers on its inputs' outputs (an embedding one Gather per column), concat a Concat along the last
    axis, add a chain of Adds; each value's lengths kept (`graph.lengths` set to a node's input's before its
    layers, a merge's output has its inputs' one lengths); the output node's output name."""
    values, shapes, lengths = {}, {}, {}
    for name, group in model.groups.items():
        values[name] = x if model.whole_row else _columns(graph, x, group.start, group.stop, f"input/{name}")
        shapes[name], lengths[name] = group.shape, None
    for name, (value, steps) in sequences.items():
        values[name], shapes[name], lengths[name] = value, model.sequences[name], steps
    for index, node in enumerate(model.nodes):
        inputs = [values[name] for name in node.inputs]
        graph.lengths = lengths[node.inputs[0]]
        if isinstance(node.merge, Concat):
            value = graph.node("Concat", inputs, node.name, axis=-1)
            shape = node.merge.merged_shape([shapes[name] for name in node.inputs])
        elif isinstance(node.merge, Add):
            value = inputs[0]
            for k, other in enumerate(inputs[1:]):
                value = graph.node("Add", [value, other], f"{node.name}/{k}")
            shape = shapes[node.inputs[0]]
        else:
            value, shape = inputs[0], shapes[node.inputs[0]]
            for k, layer in enumerate(node.layers):  # named as the model's layout names them
                value = emit_layer(graph, layer, value, model.names[model.first_layer[index] + k], shape)
                shape = layer.output_shape(shape)
        values[node.name], shapes[node.name] = value, shape
        lengths[node.name] = graph.lengths if is_sequence(shape) else None
    return values[model.nodes[-1].name]


def onnx_sequence_inputs(manifest) -> dict[str, tuple[str, str]]:
    """The ONNX inputs of a graph model's sequence columns (docs/export.md): {column: (values input, lengths
    input)}, `x` and `lengths` for the one column of a dataset of it alone (as a `layers:` model's), else the
    column's name and NAME_lengths; a name clash (a column named `x` beside fixed features, or NAME_lengths beside
    NAME) is refused naming it."""
    if manifest.input_shape[0] is None:
        return {manifest.sequences[0]["name"]: (INPUT, LENGTHS)}
    named = {column["name"]: (column["name"], column["name"] + LENGTHS_SUFFIX) for column in manifest.sequences}
    names = [name for pair in named.values() for name in pair] + ([INPUT] if manifest.feature_shape != (0,) else [])
    clash = next((name for name in names if names.count(name) > 1), None)
    if clash is not None:
        raise MpitrainError(f"ONNX export: the dataset's sequence columns {list(named)} and fixed features give two "
                            f"inputs named {clash!r} (a column's values take its name, its lengths NAME"
                            f"{LENGTHS_SUFFIX}, the fixed features {INPUT!r}); expected columns named apart")
    return named


def emit_output_head(graph: OnnxGraph, x: str, target: str, loss: str = "") -> str:
    """The model's last output `x` as the graph's output for a target kind (`OUTPUT_HEADS`): Softmax, Sigmoid or
    the values, cast to float32, under the output's name (`probabilities`, `values` or `reconstruction`: an
    autoencoder's, through a Sigmoid under its `loss` binary_cross_entropy, as `mpitrain predict` gives it)."""
    op, output = OUTPUT_HEADS[target]
    if target == "reconstruction" and loss == "binary_cross_entropy":
        op = "Sigmoid"
    if op is not None:
        x = graph.node(op, [x], "output", **({"axis": -1} if op == "Softmax" else {}))
    if graph.dtype != np.float32:
        x = graph.node("Cast", [x], "output", to=graph.onnx.TensorProto.FLOAT)
    graph.nodes.append(graph.onnx.helper.make_node("Identity", [x], [output], name=f"output/{output}"))
    return output


def onnx_model(model, manifest, normalize: bool = True, metadata: dict | None = None):
    """The ONNX ModelProto of `model` (a Sequential) for rows of the dataset of `manifest`.

    `normalize` is the run's `data.normalize`; `metadata` ({key: text}) goes into
    `metadata_props` beside the manifest's description. A layer ONNX cannot express
    (one of the user's own Layer classes) is refused by name, and so is a loss that does not fit the manifest's
    target (the graph's head follows the target: `OUTPUT_HEADS`).
    """
    from mpitrain.data.reader import input_scaling

    onnx = require_onnx()
    helper = onnx.helper
    check_exportable(model.layers)
    target = "reconstruction" if model.reconstruction else manifest.target
    if not model.reconstruction:
        check_loss_fits(model.loss, target, "ONNX export")
    if manifest.input_shape != tuple(model.input_shape):
        raise MpitrainError(f"the model takes inputs of shape {list(model.input_shape)}, the manifest's rows have "
                            f"shape {list(manifest.input_shape)}")
    graph = OnnxGraph(model.params.dtype)
    sequence = manifest.input_shape[0] is None  # inputs x (N, T, F) padded and LENGTHS (N,): docs/sequences.md
    columns = onnx_sequence_inputs(manifest) if manifest.sequences else {}  # {column: (values, lengths)}
    if sequence:
        graph.lengths = LENGTHS
        x = INPUT
    elif manifest.feature_shape == (0,):  # sequence columns without fixed features: no input x
        x = None
    else:
        x = emit_input_scaling(graph, INPUT, *input_scaling(manifest, normalize))
    if hasattr(model, "nodes"):
        x = emit_nodes(graph, model, x, columns)
    else:
        shape = tuple(model.input_shape)
        for layer, name in zip(model.layers, model.names):
            x = emit_layer(graph, layer, x, name, shape)
            shape = layer.output_shape(shape)
    output = emit_output_head(graph, x, target, model.loss)
    inputs = [helper.make_tensor_value_info(INPUT, helper.np_dtype_to_tensor_dtype(np.dtype(manifest.feature_dtype)),
                                            ["N", *manifest.feature_shape])]  # N: any batch size
    if manifest.sequences:  # T: any padded length, each column's own
        inputs = inputs if manifest.feature_shape != (0,) and not sequence else []
        for column in manifest.sequences:
            values, lengths = columns[column["name"]]
            inputs += [helper.make_tensor_value_info(values, onnx.TensorProto.FLOAT,
                                                     ["N", _steps(manifest, column["name"]), column["features"]]),
                       helper.make_tensor_value_info(lengths, onnx.TensorProto.INT64, ["N"])]
    per_step = model.output_shape[0] is None  # a class per step: (N, T, classes) of the first column's steps
    outputs = [helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT,
                                             ["N", _steps(manifest, manifest.sequences[0]["name"]),
                                              model.output_shape[1]] if per_step else
                                             ["N", model.output_shape[0]])]
    proto = helper.make_model(helper.make_graph(graph.nodes, "mpitrain", inputs, outputs, graph.initializers),
                              opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mpitrain")
    proto.producer_version = __version__
    description = {key: getattr(manifest, key) for key in MANIFEST_KEYS}
    description["feature_shape"] = list(description["feature_shape"])
    props = {"normalize": json.dumps(bool(normalize)), "manifest": json.dumps(description), **(metadata or {})}
    helper.set_model_props(proto, {key: str(value) for key, value in props.items()})
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _steps(manifest, column: str) -> str:
    """The symbolic padded length of a sequence column's input: `T`, or `T_NAME` among several inputs."""
    return "T" if manifest.input_shape[0] is None else f"T_{column}"


def export_onnx(model, manifest, path: str, normalize: bool = True, metadata: dict | None = None,
                overwrite: bool = False):
    """Write `onnx_model(model, manifest, normalize, metadata)` to `path` (a temporary file, then a rename); an
    existing `path` is refused unless `overwrite` (`write_model`)."""
    check_output(path, overwrite)
    proto = onnx_model(model, manifest, normalize, metadata)
    write_model(proto, path, overwrite)
    return proto


def export_run(run_dir: str, checkpoint: str | None = None):
    """The ONNX model of a run's checkpoint (default: its newest), built on one process with numpy.

    The config the checkpoint recorded rebuilds its model and input scaling as `mpitrain eval` does
    (`mpitrain.rundir.checkpointer.checkpoint_config`); the checkpoint must have been taken on the
    run's dataset as it is now, since the graph bakes in its manifest.
    """
    from mpitrain.data.shards import MANIFEST_NAME, read_manifest, sha256_file
    from mpitrain.nn.graph import build_network
    from mpitrain.parallel.backend import Backend
    from mpitrain.rundir.checkpointer import Checkpointer, checkpoint_config, chosen_checkpoint

    run_dir = os.path.abspath(run_dir)
    chosen = chosen_checkpoint(run_dir, checkpoint)
    config = checkpoint_config(run_dir, chosen)
    manifest = read_manifest(config.data.path)
    sha256 = sha256_file(os.path.join(config.data.path, MANIFEST_NAME))
    model = build_network(config.model, manifest, np)  # the recorded config: resolved
    checkpoint = Checkpointer(run_dir, None, Backend("numpy", np), sha256, config.data.path) \
        .restore(model, chosen).path
    return onnx_model(model, manifest, config.data.normalize,
                      {"run_dir": run_dir, "checkpoint": os.path.abspath(checkpoint), "manifest_sha256": sha256,
                       "dataset": config.data.path})


def write_model(proto, path: str, overwrite: bool = False) -> None:
    """Write an ONNX model to `path`: complete or absent (`mpitrain.base.files.write_file`). An existing `path` is refused
    unless `overwrite`, and a path inside a run's checkpoints/ or a dataset folder always
    (`mpitrain.rundir.directory.check_output`)."""
    check_output(path, overwrite)
    data = proto.SerializeToString()
    write_file(path, lambda f: f.write(data), binary=True, size=len(data))


def describe_tensor(value_info) -> str:
    """A graph input or output as `dtype[dims]`, e.g. `uint8[N, 1, 28, 28]`."""
    tensor = value_info.type.tensor_type
    dtype = np.dtype(require_onnx().helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
    return f"{dtype}[{', '.join(str(d.dim_param or d.dim_value) for d in tensor.shape.dim)}]"


def metadata(proto) -> dict[str, str]:
    """An ONNX model's metadata_props as a dict."""
    return {prop.key: prop.value for prop in proto.metadata_props}


def input_rows_shape(proto) -> tuple[str, tuple[int, ...]]:
    """(numpy dtype name, feature shape) of the rows an exported graph takes (its one input, less the batch)."""
    onnx = require_onnx()
    graph = proto.graph
    if any(i.name == LENGTHS or i.name.endswith(LENGTHS_SUFFIX) for i in graph.input):
        raise MpitrainError(f"the ONNX model reads sequences (inputs {[i.name for i in graph.input]}), which scoring "
                            "does not read yet; expected a model of fixed-size rows (score sequences with "
                            "`mpitrain predict`)")
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise MpitrainError(f"the ONNX model has {len(graph.input)} inputs and {len(graph.output)} outputs; "
                            "expected one input (rows) and one output (probabilities or values)")
    tensor = graph.input[0].type.tensor_type
    dims = [d.dim_value for d in tensor.shape.dim[1:]]
    if not dims or not all(dims):
        raise MpitrainError(f"the ONNX model's input {graph.input[0].name!r} has shape "
                            f"{[d.dim_param or d.dim_value for d in tensor.shape.dim]}; expected [N, fixed sizes...]")
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
    return dtype, tuple(dims)


def output_width(proto) -> int:
    """The columns of an exported graph's output [N, K]: classes, or a target's columns."""
    dims = proto.graph.output[0].type.tensor_type.shape.dim
    if len(dims) != 2 or not dims[1].dim_value:
        raise MpitrainError(f"the ONNX model's output {proto.graph.output[0].name!r} has "
                            f"{len(dims)} dimensions; expected [N, columns]")
    return dims[1].dim_value
