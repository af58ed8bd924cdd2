"""Layers, each with its forward and backward side by side.

A layer declares its parameter shapes; the model hands it views into the one flat
parameter buffer and the one flat gradient buffer (`bind`), so a sync is one collective.
Running statistics that are not trained (batch norm's) live in a third flat buffer, the
model's `stats` (`stat_shapes`, `bind_stats`), averaged across ranks by the synchronizers.
`backward` writes parameter gradients into those views and returns the input gradient
(None when `input_grad` is false: the first layer's input gradient is never used).

A step allocates nothing: every array a layer returns or keeps for backward is an array of
its part of the model's workspace (`self.ws`, `mpitrain.base.workspace`), written with `out=`,
in-place operations and the fused kernels of `mpitrain.kernels.activations`. What forward
returns is overwritten by the next forward of that batch shape.

A dense, conv2d or conv1d layer followed by an activation layer does the activation itself, fused
with its bias add (and in backward the derivative, fused with its bias gradient): the model
calls `fuse_activation` on it and the activation layer passes its input and gradient
through (`fused`). The activation layers stay in the model's list, so layouts, checkpoints,
configs and exports see the same layers either way.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.workspace import Workspace, WorkspacePart
from mpitrain.kernels.activations import (
    INPUT_KINDS,
    KEYED_BITS,
    activation_backward,
    bias_activation,
    dropout,
    keyed_bits_reference,
)
from mpitrain.kernels.gemm import matmul
from mpitrain.kernels.rows import flat_rows

LAYER_CLASSES: dict[str, type] = {}  # every layer type a config names, by that name (`layer_type`)


def layer_type(name: str, graph_only: bool = False):
    """Class decorator: register a Layer as the type a config names `{type: NAME}`, in `model.layers` and
    `model.graph`, or with `graph_only` (a layer that reads a graph's column groups or several inputs) in
    `model.graph` alone. `mpitrain.nn.layer_types` collects them. Not a collective."""
    def register(cls):
        assert name not in LAYER_CLASSES, f"two layer types named {name!r}"
        cls.type_name, cls.graph_only = name, graph_only
        LAYER_CLASSES[name] = cls
        return cls
    return register


class Layer:
    """Base: a layer without parameters that passes shapes through. `type_name` is the name a config gives its
    type (set by `layer_type`; None for a class no config names)."""

    type_name: str | None = None
    graph_only = False
    frozen = False  # `freeze: true`: its parameters neither change nor travel (`Network.trainable`)
    # Truncated BPTT (`mpitrain.nn.segments`): whether each step's output depends on that step's input alone
    # (`per_step`), and otherwise why a segment cannot run the layer (`not_cut`; a recurrent layer carries state).
    per_step = False
    not_cut = "it does not take sequences step by step"

    _ws: WorkspacePart | None = None
    lengths = None  # a sequence input's lengths (B,), set by the model before forward (docs/sequences.md)
    keeps_lengths = True  # `output_lengths` gives the input's lengths back (a graph may merge such sequences)
    joined_by: type | None = None  # the Merge class a graph node of this type builds when it reads several `inputs`
    tables: tuple | list = ()  # its embedding tables whose gradients may travel sparse (`mpitrain.nn.embedding.TableGrad`)
    reads_ids = False  # it takes integer ids as they are (an embedding's); any other layer gets integers as numbers
    collective = False  # its forward and backward are collectives (a sharded embedding's rows live on every rank)
    # Why its training forward and backward cannot be recorded in a CUDA graph (`mpitrain.training.step_graph`):
    # a read of a device value on the host, or a kernel argument that changes from step to step. None: it can.
    capture_blocker: str | None = None

    @property
    def ws(self) -> WorkspacePart:
        """This layer's part of its model's workspace (set by the model); a layer used on its own gets its own."""
        if self._ws is None:
            self._ws = Workspace(np).part(type(self).__name__.lower())
        return self._ws

    @ws.setter
    def ws(self, part: WorkspacePart) -> None:
        self._ws = part

    def param_shapes(self, input_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        return {}

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return input_shape

    def stat_shapes(self, input_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        return {}

    def output_lengths(self, lengths):
        """The lengths of the output sequence of an input sequence of `lengths` (docs/sequences.md): the same."""
        return lengths

    def bind(self, params: dict, grads: dict) -> None:
        self.params, self.grads = params, grads

    def bind_stats(self, stats: dict) -> None:
        self.stats = stats

    def init_params(self, rng: np.random.Generator, scheme: str) -> dict[str, np.ndarray]:
        """Initial values (host arrays) for each parameter, drawn from `rng`."""
        return {}

    def init_stats(self) -> dict[str, np.ndarray]:
        """Initial values (host arrays) of the running statistics."""
        return {}

    def forward(self, x, training: bool):
        raise NotImplementedError

    def backward(self, dy, input_grad: bool = True):
        raise NotImplementedError


class FusesActivation(Layer):
    """A layer (dense, conv2d, conv1d, batchnorm) that can run the activation layer after it itself, fused with its
    bias add (batchnorm: its normalization):
    `kind` is that activation ("none" until the model calls `fuse_activation`)."""

    kind = "none"

    def fuse_activation(self, kind: str) -> None:
        """Run activation `kind` on the output, fused with the bias add (the model's activation layer passes)."""
        self.kind = kind


@layer_type("dense")
class Dense(FusesActivation):
    """y = x W + b on the flattened input; `activation` is expanded by the model builder (and then fused here).

    On a sequence `(None, F)` it is applied to each step's F features (W is (F, units), the output `(None, units)`):
    the batch's (B, T, F) as B*T rows of one GEMM, its arrays from the grow-only workspace (`varying`). Padded steps
    give values nobody reads, and their gradient rows are zero, so they add nothing to W's and b's gradients."""

    per_step = True

    sequence = False  # whether the input is a sequence (None, F): set by `param_shapes`

    def __init__(self, units: int, activation: str = "none", init: str | None = None):
        self.units, self.activation, self.init = units, activation, init

    def param_shapes(self, input_shape):
        self.sequence = is_sequence(input_shape)
        return {"W": (input_shape[-1] if self.sequence else math.prod(input_shape), self.units), "b": (self.units,)}

    def output_shape(self, input_shape):
        return (None, self.units) if is_sequence(input_shape) else (self.units,)

    def init_params(self, rng, scheme):
        fan_in, fan_out = self.params["W"].shape
        return {"W": initial_weights(rng, self.init or scheme, fan_in, fan_out, (fan_in, fan_out)),
                "b": np.zeros(fan_out)}

    def _array(self, name: str, shape, dtype):
        """The workspace array `name`: grow-only for a sequence (its rows change with T), else one per shape."""
        return varying(self.ws, name, shape, dtype) if self.sequence else self.ws(name, shape, dtype)

    def forward(self, x, training):
        self.input_shape = x.shape
        self.x = x.reshape(-1, x.shape[-1]) if self.sequence else x.reshape(len(x), -1)
        self.y = self._array("y", (len(self.x), self.units), x.dtype)
        matmul(self.x, self.params["W"], self.y)
        bias_activation(self.y, self.params["b"], self.kind, self.y)
        return self.y.reshape(*self.input_shape[:2], self.units) if self.sequence else self.y

    def backward(self, dy, input_grad=True):
        dy = dy.reshape(self.y.shape)
        if self.kind != "none":
            dz = self._array("dz", dy.shape, dy.dtype)
            activation_backward(dy, self.y, self.kind, dz)
            dy = dz
        matmul(self.x.T, dy, self.grads["W"])
        dy.sum(axis=0, out=self.grads["b"])
        if not input_grad:
            return None
        dx = self._array("dx", self.x.shape, dy.dtype)
        matmul(dy, self.params["W"].T, dx)
        return dx.reshape(self.input_shape)


class _Activation(Layer):
    """An element-wise activation (`kind`), from its input to a workspace array and back, in one pass each way;
    with `fused` (the layer before runs it, `FusesActivation.fuse_activation`) it passes input and gradient through.
    An activation whose derivative needs its input (`kernels.activations.INPUT_KINDS`: GELU, SiLU) is never fused
    and keeps a reference to its input (the array the layer before returned, left as it is until the next forward)
    for backward; the others keep their output."""

    per_step = True

    kind = "none"
    fused = False

    def forward(self, x, training):
        if self.fused:
            return x
        self.y = self.ws("y", x.shape, x.dtype)
        bias_activation(flat_rows(x), x[:0].reshape(-1), self.kind, flat_rows(self.y))
        self.saved = x if self.kind in INPUT_KINDS else self.y  # what the derivative is taken from
        return self.y

    def backward(self, dy, input_grad=True):
        if self.fused:
            return dy
        dx = self.ws("dx", dy.shape, dy.dtype)
        activation_backward(flat_rows(dy), flat_rows(self.saved), self.kind, flat_rows(dx))
        return dx


@layer_type("relu")
class ReLU(_Activation):
    kind = "relu"


@layer_type("tanh")
class Tanh(_Activation):
    kind = "tanh"


@layer_type("sigmoid")
class Sigmoid(_Activation):
    kind = "sigmoid"


@layer_type("gelu")
class GELU(_Activation):
    """x Phi(x), Phi the standard normal's distribution function (Hendrycks & Gimpel 2016; PyTorch's `nn.GELU()`)."""

    kind = "gelu"


@layer_type("gelu_tanh")
class GELUTanh(_Activation):
    """GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's
    `nn.GELU(approximate="tanh")`, BERT's and GPT-2's)."""

    kind = "gelu_tanh"


@layer_type("silu")
class SiLU(_Activation):
    """x sigmoid(x) (Elfwing et al. 2018, "swish"; PyTorch's `nn.SiLU()`)."""

    kind = "silu"


@layer_type("flatten")
class Flatten(Layer):
    def output_shape(self, input_shape):
        refuse_sequence(input_shape, "flatten", "its size would change with the batch's padded length")
        return (math.prod(input_shape),)

    def forward(self, x, training):
        self.input_shape = x.shape
        return x.reshape(len(x), -1)

    def backward(self, dy, input_grad=True):
        return dy.reshape(self.input_shape)


@layer_type("dropout")
class Dropout(Layer):
    """Zeroes each input with probability `rate` in training and scales the rest by 1/(1-rate).

    The mask is drawn from `key` (the model sets it from seed, rank, epoch, step and the
    layer's index), so a resumed run drops the same units; at evaluation it is the identity.
    The draw is `keyed_bits`, the same on numpy and cupy, so both backends drop the same units;
    the numba kernel draws each element's bits and applies the mask in one pass.
    """

    per_step = True

    key = (0,)

    def __init__(self, rate: float = 0.5):
        if not 0 <= rate < 1:
            raise ValueError(f"rate {rate!r}, expected a number in [0, 1)")
        self.rate = rate

    @property
    def capture_blocker(self) -> str | None:
        return DROPOUT_BLOCKER if self.rate else None

    def forward(self, x, training):
        if not training or self.rate == 0:
            self.mask = None
            return x
        self.mask = self.ws("mask", x.shape, x.dtype)
        y = self.ws("y", x.shape, x.dtype)
        keyed_dropout(flat_rows(x), self.key, self.rate, flat_rows(y), flat_rows(self.mask))
        return y

    def backward(self, dy, input_grad=True):
        if self.mask is None:
            return dy
        dx = self.ws("dx", dy.shape, dy.dtype)
        array_module(dy).multiply(dy, self.mask, out=dx)
        return dx


DROPOUT_BLOCKER = "dropout at a rate above 0: its mask's seed is a kernel argument, so a replay would drop the " \
                  "same units every step"


def keyed_dropout(rows, key: tuple, rate: float, out, mask) -> None:
    """Drop each element of the 2-D `rows` with probability `rate`, the rest scaled by 1/(1-rate), into `out`, the
    mask (0 or the scale) into `mask`: the draw is `key`'s (seed, rank, epoch, step, layer...), the same on numpy and
    cupy. Not a collective."""
    dropout(rows, key_seed(key), math.ceil(rate * 2**KEYED_BITS), 1 / (1 - rate), out, mask)


def key_seed(key: tuple) -> np.uint64:
    """The 64-bit seed of a dropout key (seed, rank, epoch, step, layer)."""
    return np.random.SeedSequence(key).generate_state(1, np.uint64)[0]


def keyed_bits(xp, key: tuple, shape):
    """Uniform random integers in [0, 2**KEYED_BITS), one per element of `shape`, from `key` alone.

    splitmix64 of (seed from `key`, element index) in xp's wrapping uint64 arithmetic: no
    generator state, and numpy and cupy give the same numbers (`kernels.activations`).
    """
    return keyed_bits_reference(xp, key_seed(key), shape)


def is_sequence(shape: tuple) -> bool:
    """Whether a layer's input shape (less the batch) is a sequence `(None, F)` (docs/sequences.md)."""
    return len(shape) == 2 and shape[0] is None


def refuse_sequence(shape: tuple, layer: str, why: str) -> None:
    """A ValueError (the model builder names the layer's key) when a layer that cannot take a sequence gets one."""
    if is_sequence(shape):
        raise ValueError(f"a {layer} layer cannot take a sequence (None, {shape[1]}): {why}; turn the sequence into "
                         "one vector per row first (global_avg_pool, global_max_pool, or an lstm's last state)")


def as_numbers(x, ws: WorkspacePart, name: str, dtype):
    """`x` for a layer that reads numbers: itself, or an integer sequence column's values (ids a token_embedding would
    take as they are) as `dtype` in the grow-only workspace array `name`. Not a collective."""
    if x.dtype.kind not in "iu":
        return x
    out = varying(ws, name, x.shape, dtype)
    out[...] = x
    return out


def varying(ws: WorkspacePart, name: str, shape: tuple, dtype):
    """A workspace array of `shape` whose size changes from batch to batch (a sequence's padded length): the first
    elements of the grow-only buffer `name` (`WorkspacePart.at_least`), reshaped. Not a collective."""
    return ws.at_least(name, math.prod(shape), dtype).reshape(shape)


ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid, "gelu": GELU, "gelu_tanh": GELUTanh, "silu": SiLU}
INIT_SCHEMES = ("xavier", "he")


def initial_weights(rng: np.random.Generator, scheme: str, fan_in: int, fan_out: int, shape) -> np.ndarray:
    """Xavier (Glorot uniform) or He (normal, for ReLU) weights."""
    if scheme == "xavier":
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=shape)
    if scheme == "he":
        return rng.normal(0.0, math.sqrt(2.0 / fan_in), size=shape)
    raise ValueError(f"init scheme {scheme!r}, expected one of {INIT_SCHEMES}")
