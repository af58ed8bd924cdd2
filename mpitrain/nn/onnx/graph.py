"""An ONNX graph under construction, and the registry of layer emitters (`emits`).

    graph = OnnxGraph(np.float32)
    y = graph.node("Relu", [x], "01_relu")                                 # "01_relu/Relu"
    w = graph.constant("00_dense/W", layer.params["W"])                    # an initializer

    @emits(Dense)                                                          # in a family's module, beside its kin
    def dense(graph, layer, x, name, input_shape) -> str: ...

An emitter appends one layer's part to the graph and returns the name of its output. The emitters live one module
per family of layers in this folder (`mpitrain.nn.onnx`), each registering its layer classes here; the model-level
graph (inputs, scaling, head, metadata) is `mpitrain.rundir.export`'s.
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import ConfigError

OPSET = 17
# One emitter per layer class, matched exactly (a subclass may compute something else):
# emitter(graph, layer, input name, node name, the layer's input shape less the batch) -> output name.
EMITTERS: dict[type, object] = {}


def emits(*classes):
    """Decorator: the emitter of the layer `classes`. Not a collective."""
    def register(emitter):
        for cls in classes:
            assert cls not in EMITTERS, f"two ONNX emitters for {cls.__name__}"
            EMITTERS[cls] = emitter
        return emitter
    return register


def require_onnx():
    """The onnx module, or a one-line error saying which extra installs it."""
    try:
        import onnx
    except ImportError:
        raise ConfigError("ONNX export needs the onnx package (pip install 'mpitrain[onnx]')") from None
    return onnx


def host(array) -> np.ndarray:
    """A numpy copy of a numpy or cupy array (a model may live on a GPU)."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


class OnnxGraph:
    """An ONNX graph under construction: nodes and initializers appended in order, each node's output named
    `NAME/OP` after the node. Every emitter takes the graph and its input's name and returns its output's name.
    `lengths` is the name of the (N,) int64 lengths tensor of the current input when it is a sequence (N, T, F)
    (docs/sequences.md): a sequence layer's emitter reads it and sets its output's (None: not a sequence); a graph
    model's emitter (`mpitrain.nn.onnx.network.emit_nodes`) keeps each value's and sets it before each node."""

    def __init__(self, dtype: np.dtype):
        self.onnx, self.dtype = require_onnx(), np.dtype(dtype)
        self.nodes, self.initializers = [], []
        self.lengths: str | None = None  # a sequence's (N,) int64 lengths tensor, while the values are a sequence
        self.input_lengths: list = []  # a merge's inputs' lengths (`emit_nodes`), each a name or None
        self.integers: set[str] = set()  # the int64 inputs (ids, a column of integers), which only id layers take

    def numbers(self, x: str, name: str) -> str:
        """`x` for a layer that reads numbers: itself, or an integer input Cast to the graph's dtype (as
        `mpitrain.nn.layers.as_numbers` converts it)."""
        if x not in self.integers:
            return x
        return self.node("Cast", [x], f"{name}/numbers", to=self.onnx.helper.np_dtype_to_tensor_dtype(self.dtype))

    def constant(self, name: str, value, dtype=None) -> str:
        """An initializer `name` holding `value` (numpy or cupy) in `dtype`, by default the graph's; a number is a
        scalar (0-d: what Range and a Gather that drops its axis take), not an array of one."""
        array = np.array(host(value), dtype=self.dtype if dtype is None else dtype, order="C")
        self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attributes) -> str:
        """Append operator `op` on `inputs` (names of earlier outputs, inputs or initializers); its output's name."""
        output = f"{name}/{op}"
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [output], name=output, **attributes))
        return output

    def columns(self, x: str, start: int, stop: int, name: str) -> str:
        """Columns [start, stop) of the rows `x` (N, k): a Slice."""
        return self.node("Slice", [x, self.constant(f"{name}/starts", [start], np.int64),
                                   self.constant(f"{name}/ends", [stop], np.int64),
                                   self.constant(f"{name}/axes", [1], np.int64)], name)
