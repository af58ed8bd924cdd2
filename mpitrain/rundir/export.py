"""A trained model as an ONNX graph: stored dataset rows in, probabilities (or regression's values) out.

    mpitrain export runs/fashion_lenet --out lenet.onnx                     # a run's newest checkpoint
    export_onnx(model, manifest, "model.onnx", normalize=True)              # a model built in Python

The graph (opset 17, built with `onnx.helper`, weights as initializers named like the
checkpoint's layout, e.g. `00_dense/W`) takes rows as the dataset stores them, uint8 or float32
of shape [N, *feature_shape] with a symbolic batch N, and first applies the manifest's scaling
as `mpitrain.data.reader.Batches` does (Cast, Mul, Add), so onnxruntime gives `mpitrain predict`'s
outputs. It ends by the target kind (`OUTPUT_HEADS`): class targets in a Softmax (output `probabilities`), binary
and multilabel targets in a Sigmoid (`probabilities`), regression targets in the values themselves (`values`).
A model whose initializers pass `EXTERNAL_DATA_BYTES` (a sharded table of 10^8 rows: protobuf holds at most
2 GiB in one message) is written with ONNX's external data: the large initializers go to `PATH.data` beside it,
which onnxruntime reads from the model's folder (`write_model`). `metadata_props` record where the model came from
(run dir, checkpoint, the manifest's sha256) and the manifest's feature and target description, which
`mpitrain score` reads.

The graph is built by emitters that each append a part to an `OnnxGraph` and return the name of that part's
output: `emit_input_scaling` here, the layers' own (`mpitrain.nn.onnx`, one module per family of layers, beside
which a new layer's goes) and `emit_output_head` here. A graph model (`model.graph`) goes node by node
(`mpitrain.nn.onnx.emit_nodes`): its numbers are the row `x`, a table's categorical ids the int64 input
`categorical` (`IDS`), its sequence columns inputs of their own (`onnx_sequence_inputs`: `NAME` and `NAME_lengths`
each); an embedding is a Gather per categorical column, concat and add are Concat and Add. A table's raw records are encoded into the rows the graph
takes (numbers standardized, categories as ids) by `mpitrain.data.encoding.TableEncoder` from the manifest's
`columns`, which the metadata carries: Spark scoring does it; another runtime applies the same mapping (docs/tables.md).
"""
from __future__ import annotations

import json
import os

import numpy as np

from mpitrain import __version__
from mpitrain.base.errors import MpitrainError
from mpitrain.base.files import write_file
from mpitrain.data.units import IDENTITY, Units, output_units
from mpitrain.nn.losses import check_loss_fits
from mpitrain.nn.onnx import OPSET, OnnxGraph, check_exportable, emit_layers, emit_nodes, require_onnx
from mpitrain.rundir.directory import check_output

INPUT = "x"
LENGTHS = "lengths"  # a sequence model's second input: each row's steps (docs/sequences.md)
# A model of several inputs (a graph on sequence columns beside each other or fixed features) takes `x` (the fixed
# features, when there are any) and per sequence column its values, named as the column, and its lengths, so named:
LENGTHS_SUFFIX = "_lengths"
# A table's categorical ids: an input of their own, int64 [N, categorical columns], beside `x` (its numbers).
IDS = "categorical"
# The graph's last operator and its output's name, by target kind (`Manifest.target`).
OUTPUT_HEADS = {"class": ("Softmax", "probabilities"), "binary": ("Sigmoid", "probabilities"),
                "multilabel": ("Sigmoid", "probabilities"), "regression": (None, "values"),
                "reconstruction": (None, "reconstruction")}  # an autoencoder's: Sigmoid under binary_cross_entropy
# Protobuf serializes at most 2 GiB; a model whose initializers hold more than this many bytes keeps them in
# PATH.data (ONNX's external data), each initializer of at least EXTERNAL_TENSOR_BYTES.
EXTERNAL_DATA_BYTES = 2**31 - 2**27
EXTERNAL_TENSOR_BYTES = 1024
# The manifest's description of rows and targets, in metadata "manifest".
MANIFEST_KEYS = ("feature_shape", "feature_dtype", "scale", "offset", "mean", "std", "num_classes", "class_names",
                 "target", "target_names", "source", "seed", "transforms", "columns", "sequences", "step_target")


def emit_input_scaling(graph: OnnxGraph, x: str, scale, shift, name: str = "input") -> str:
    """Stored values to the model's: Cast to the graph's dtype, Mul by `scale`, Add `shift` (numbers or arrays that
    broadcast over a row), as `mpitrain.data.reader` prepares a batch."""
    x = graph.node("Cast", [x], name, to=graph.onnx.helper.np_dtype_to_tensor_dtype(graph.dtype))
    x = graph.node("Mul", [x, graph.constant(f"{name}/scale", scale)], name)
    return graph.node("Add", [x, graph.constant(f"{name}/shift", shift)], name)


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


def emit_output_head(graph: OnnxGraph, x: str, target: str, loss: str = "", units: Units = IDENTITY) -> str:
    """The model's last output `x` as the graph's output for a target kind (`OUTPUT_HEADS`): Softmax, Sigmoid or
    the values, cast to float32, under the output's name (`probabilities`, `values` or `reconstruction`: an
    autoencoder's, through a Sigmoid under its `loss` binary_cross_entropy, as `mpitrain predict` gives it). Values
    come back in the data's `units` (`mpitrain.data.units`: a Mul by std and an Add of the mean), as predict's do."""
    op, output = OUTPUT_HEADS[target]
    if target == "reconstruction" and loss == "binary_cross_entropy":
        op = "Sigmoid"
    if op is not None:
        x = graph.node(op, [x], "output", **({"axis": -1} if op == "Softmax" else {}))
    if not units.identity:
        x = graph.node("Mul", [x, graph.constant("output/std", units.std)], "output")
        x = graph.node("Add", [x, graph.constant("output/mean", units.mean)], "output")
    if graph.dtype != np.float32:
        x = graph.node("Cast", [x], "output", to=graph.onnx.TensorProto.FLOAT)
    graph.nodes.append(graph.onnx.helper.make_node("Identity", [x], [output], name=f"output/{output}"))
    return output


def onnx_model(model, manifest, normalize: bool = True, metadata: dict | None = None,
               standardize_targets: bool = True):
    """The ONNX ModelProto of `model` (a Sequential) for rows of the dataset of `manifest`.

    `normalize` and `standardize_targets` are the run's `data.` keys; `metadata` ({key: text}) goes into
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
    if manifest.id_columns:  # the categorical ids: an int64 input of their own, of no lengths
        columns = {IDS: (IDS, None), **columns}
    if sequence:
        graph.lengths = LENGTHS
        x = INPUT
    elif manifest.feature_shape == (0,):  # sequence columns without fixed features: no input x
        x = None
    else:
        x = emit_input_scaling(graph, INPUT, *input_scaling(manifest, normalize))
    graph.integers = {IDS} if manifest.id_columns else set()  # the int64 inputs, which only id layers take
    graph.integers |= {columns[c["name"]][0] for c in manifest.sequences if manifest.values_dtype(c).kind in "iu"}
    x = emit_nodes(graph, model, x, columns) if hasattr(model, "nodes") else emit_layers(graph, model, x)
    units = output_units(manifest, normalize, standardize_targets, model.reconstruction, model.loss)
    output = emit_output_head(graph, x, target, model.loss, units)
    inputs = [helper.make_tensor_value_info(INPUT, helper.np_dtype_to_tensor_dtype(np.dtype(manifest.feature_dtype)),
                                            ["N", *manifest.feature_shape])]  # N: any batch size
    inputs = inputs if manifest.feature_shape != (0,) and not sequence else []
    if manifest.id_columns:
        inputs.append(helper.make_tensor_value_info(IDS, onnx.TensorProto.INT64, ["N", manifest.id_columns]))
    if manifest.sequences:  # T: any padded length, each column's own
        for column in manifest.sequences:
            values, lengths = columns[column["name"]]
            stored = manifest.values_dtype(column)  # a bag's ids, a column of integers: int64 here
            kind = onnx.TensorProto.INT64 if stored.kind in "iu" else onnx.TensorProto.FLOAT
            inputs += [helper.make_tensor_value_info(values, kind,
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
    props = {"normalize": json.dumps(bool(normalize)), "standardize_targets": json.dumps(bool(standardize_targets)),
             "manifest": json.dumps(description), **(metadata or {})}
    helper.set_model_props(proto, {key: str(value) for key, value in props.items()})
    if initializer_bytes(proto) <= EXTERNAL_DATA_BYTES:  # a larger one is checked once written (`write_model`)
        onnx.checker.check_model(proto, full_check=True)
    return proto


def initializer_bytes(proto) -> int:
    """The bytes of a model's initializers, in the message or in external data."""
    return sum(len(tensor.raw_data) + sum(int(entry.value) for entry in tensor.external_data if entry.key == "length")
               for tensor in proto.graph.initializer)


def _steps(manifest, column: str) -> str:
    """The symbolic padded length of a sequence column's input: `T`, or `T_NAME` among several inputs."""
    return "T" if manifest.input_shape[0] is None else f"T_{column}"


def export_onnx(model, manifest, path: str, normalize: bool = True, metadata: dict | None = None,
                overwrite: bool = False, standardize_targets: bool = True):
    """Write `onnx_model(model, manifest, normalize, metadata, standardize_targets)` to `path` (a temporary file,
    then a rename); an existing `path` is refused unless `overwrite` (`write_model`)."""
    check_output(path, overwrite)
    proto = onnx_model(model, manifest, normalize, metadata, standardize_targets)
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
    from mpitrain.parallel.sharded_tables import attach_sharded_tables
    from mpitrain.rundir.checkpointer import Checkpointer, checkpoint_config, chosen_checkpoint

    run_dir = os.path.abspath(run_dir)
    chosen = chosen_checkpoint(run_dir, checkpoint)
    config = checkpoint_config(run_dir, chosen)
    manifest = read_manifest(config.data.path)
    sha256 = sha256_file(os.path.join(config.data.path, MANIFEST_NAME))
    model = build_network(config.model, manifest, np)  # the recorded config: resolved
    attach_sharded_tables(model, None)  # a sharded table, whole on this one process
    checkpoint = Checkpointer(run_dir, None, Backend("numpy", np), sha256, config.data.path) \
        .restore(model, chosen).path
    return onnx_model(model, manifest, config.data.normalize,
                      {"run_dir": run_dir, "checkpoint": os.path.abspath(checkpoint), "manifest_sha256": sha256,
                       "dataset": config.data.path}, config.data.standardize_targets)


def write_model(proto, path: str, overwrite: bool = False) -> None:
    """Write an ONNX model to `path`: complete or absent (`mpitrain.base.files.write_file`). An existing `path` is refused
    unless `overwrite`, and a path inside a run's checkpoints/ or a dataset folder always
    (`mpitrain.rundir.directory.check_output`)."""
    check_output(path, overwrite)
    large = initializer_bytes(proto) > EXTERNAL_DATA_BYTES
    if large:  # the initializers first, to PATH.data, then the model that names it
        chunks = _to_external_data(proto, os.path.basename(path) + ".data")
        write_file(path + ".data", lambda f: f.writelines(chunks), binary=True, size=sum(map(len, chunks)))
    data = proto.SerializeToString()
    write_file(path, lambda f: f.write(data), binary=True, size=len(data))
    if large:
        require_onnx().checker.check_model(path, full_check=True)


def _to_external_data(proto, location: str) -> list[bytes]:
    """Move the initializers of at least EXTERNAL_TENSOR_BYTES out of `proto` into external data at `location` (a
    file name beside the model); returns their bytes, in the file's order."""
    onnx = require_onnx()
    chunks, offset = [], 0
    for tensor in proto.graph.initializer:
        if len(tensor.raw_data) >= EXTERNAL_TENSOR_BYTES:
            chunks.append(tensor.raw_data)
            onnx.external_data_helper.set_external_data(tensor, location, offset, len(tensor.raw_data))
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
            offset += len(chunks[-1])
    return chunks


def describe_tensor(value_info) -> str:
    """A graph input or output as `dtype[dims]`, e.g. `uint8[N, 1, 28, 28]`."""
    tensor = value_info.type.tensor_type
    dtype = np.dtype(require_onnx().helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
    return f"{dtype}[{', '.join(str(d.dim_param or d.dim_value) for d in tensor.shape.dim)}]"


def metadata(proto) -> dict[str, str]:
    """An ONNX model's metadata_props as a dict."""
    return {prop.key: prop.value for prop in proto.metadata_props}


def sequence_inputs(proto, columns: list[str]) -> dict[str, tuple[str, str]]:
    """{column: (values input, lengths input)} of an exported sequence model of the dataset sequence `columns`
    (`onnx_sequence_inputs`' names, read back from its inputs), {} for a model of fixed-size rows; an input
    missing is an MpitrainError naming it."""
    names = [i.name for i in proto.graph.input]
    if not any(name == LENGTHS or name.endswith(LENGTHS_SUFFIX) for name in names):
        return {}
    found = {columns[0]: (INPUT, LENGTHS)} if LENGTHS in names else \
        {column: (column, column + LENGTHS_SUFFIX) for column in columns}
    missing = [name for pair in found.values() for name in pair if name not in names]
    if missing:
        raise MpitrainError(f"the ONNX model has inputs {names}; expected {missing[0]!r} for its dataset's sequence "
                            f"columns {columns}")
    return found


def input_rows_shape(proto) -> tuple[str, tuple[int, ...]]:
    """(numpy dtype name, feature shape) of the rows an exported graph takes (its one input, less the batch); of a
    sequence model (`sequence_inputs`) or a table's with categorical ids (`IDS`), its fixed features' (its input `x`
    beside the columns; (0,) without)."""
    onnx = require_onnx()
    graph, names = proto.graph, [i.name for i in proto.graph.input]
    inputs = [i for i in proto.graph.input if i.name != IDS]
    sequences = any(name == LENGTHS or name.endswith(LENGTHS_SUFFIX) for name in names)
    if sequences:
        inputs = [i for i in inputs if i.name == INPUT] if LENGTHS not in names else []
    if not inputs and (sequences or IDS in names):
        return "float32", (0,)
    if len(inputs) != 1 or len(graph.output) != 1:
        raise MpitrainError(f"the ONNX model has {len(inputs)} inputs and {len(graph.output)} outputs; "
                            "expected one input (rows) and one output (probabilities or values)")
    tensor = inputs[0].type.tensor_type
    dims = [d.dim_value for d in tensor.shape.dim[1:]]
    if not dims or not all(dims):
        raise MpitrainError(f"the ONNX model's input {inputs[0].name!r} has shape "
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
