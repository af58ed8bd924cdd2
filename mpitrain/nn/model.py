"""A sequential model on the flat-buffer contract (`mpitrain.nn.flat`): layers hold views into
ONE parameter buffer and ONE gradient buffer, so averaging either across ranks is a single
collective; batch norm's running statistics have a flat buffer of their own, `stats`.

    model = Sequential([Dense(256, activation="relu"), Dropout(0.2), Dense(10)], input_shape=(1, 28, 28))
    model = Sequential(layers, (13,), loss="huber", loss_options={"delta": 0.5})          # a loss with options
    model = build_model(config.model, manifest.feature_shape, manifest.num_classes, xp)   # from a config
"""
from __future__ import annotations

import inspect
import math

import numpy as np

from mpitrain.errors import ConfigError
from mpitrain.kernels.im2col import PADDINGS
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import AvgPool2D, Conv2D, MaxPool2D
from mpitrain.nn.flat import FlatModel, flat_views
from mpitrain.nn.layers import ACTIVATIONS, INIT_SCHEMES, Dense, Dropout, Flatten, FusesActivation, Layer
from mpitrain.nn.losses import check_loss_options, loss_with_options

LAYER_TYPES = {"dense": Dense, "flatten": Flatten, "conv2d": Conv2D, "maxpool2d": MaxPool2D,
               "avgpool2d": AvgPool2D, "dropout": Dropout, "batchnorm": BatchNorm, **ACTIVATIONS}


class Network(FlatModel):
    """What both model kinds share: layers bound to views of the flat buffers, a loss, a workspace part per layer.

    `layers` are every layer in the order forward runs them, `names` their names (the layout's `NAME/array`, the
    workspace part's), `shapes`/`stat_shapes` their parameter and statistic shapes; `param_order` the order of the
    layers' parameters in the flat buffer (default: the layers'). Subclasses define `forward` and `backward`.
    """

    def __init__(self, layers: list[Layer], names: list[str], shapes: list[dict], stat_shapes: list[dict],
                 loss: str, xp, dtype, loss_options: dict | None, param_order: list[int] | None = None):
        self.layers, self.loss = layers, loss
        self.loss_options = check_loss_options(loss, loss_options or {})
        self.loss_fn = loss_with_options(loss, self.loss_options, xp)
        order = list(range(len(layers))) if param_order is None else param_order
        super().__init__(_layout([names[i] for i in order], [shapes[i] for i in order]),
                         _layout(names, stat_shapes), xp, dtype)
        sizes = [sum(math.prod(s) for s in shapes[i].values()) for i in order]
        starts = np.cumsum([0, *sizes])
        self.grads_start = [0] * len(layers)  # layer i's gradients begin here
        for position, i in enumerate(order):
            self.grads_start[i] = int(starts[position])
        params = dict(zip(order, _per_layer(flat_views(self.params, self.layout), [shapes[i] for i in order])))
        grads = dict(zip(order, _per_layer(flat_views(self.grads, self.layout), [shapes[i] for i in order])))
        for i, (layer, layer_stats) in enumerate(zip(layers, _per_layer(flat_views(self.stats, self.stats_layout),
                                                                         stat_shapes))):
            layer.bind(params[i], grads[i])
            layer.bind_stats(layer_stats)
            layer.ws = self.workspace.part(names[i])
        self.loss_ws = self.workspace.part("loss")

    def init_params(self, seed: int, scheme: str) -> None:
        """Draw initial parameters on the host from `seed`, so every backend starts alike."""
        rng = np.random.default_rng(seed)
        for layer in self.layers:
            for name, value in layer.init_params(rng, scheme).items():
                layer.params[name][...] = self.xp.asarray(value, dtype=self.params.dtype)
            for name, value in layer.init_stats().items():
                layer.stats[name][...] = self.xp.asarray(value, dtype=self.stats.dtype)

    def train_batch(self, x, y, key: tuple = (0,), grads_ready=None):
        """Forward and backward (`grads_ready` as `backward`'s) on one batch; fills `grads`; returns (mean loss,
        correct predictions) as 0-d arrays on the model's device, so a step never waits for the host."""
        loss, correct, dlogits = self.loss_fn(self.forward(x, training=True, key=key), y, self.loss_ws)
        self.backward(dlogits, grads_ready)
        return loss, correct


class Sequential(Network):
    """Layers applied in order, a loss on the last layer's output, flat buffers for all parameters.

    A dense or conv2d layer's `activation` becomes a layer of its own right after it; the
    dense or conv2d layer then runs it fused with its bias add (`FusesActivation.fuse_activation`).
    Every array a step writes is in `workspace` (`mpitrain.nn.workspace`), one part per layer
    (named like the layout, `03_dense`) and one for the loss. `loss_options` are the loss's
    (`mpitrain.nn.losses.LOSS_OPTIONS`: pos_weight, class_weights, delta).
    """

    def __init__(self, layers: list[Layer], input_shape: tuple[int, ...], loss: str = "softmax_cross_entropy",
                 xp=np, dtype="float32", loss_options: dict | None = None):
        layers, self.input_shape = _with_activation_layers(layers), tuple(input_shape)
        shapes, stat_shapes, shape = [], [], self.input_shape
        for layer in layers:
            shapes.append(layer.param_shapes(shape))
            stat_shapes.append(layer.stat_shapes(shape))
            shape = layer.output_shape(shape)
        self.output_shape = shape
        names = [f"{index:02d}_{type(layer).__name__.lower()}" for index, layer in enumerate(layers)]
        super().__init__(layers, names, shapes, stat_shapes, loss, xp, dtype, loss_options)
        _fuse_activations(self.layers)

    def forward(self, x, training: bool = False, key: tuple = (0,)):
        """The logits of `x`; `key` (seed, rank, epoch, step) seeds the step's random layers (dropout)."""
        for index, layer in enumerate(self.layers):
            layer.key = (*key, index)
            x = layer.forward(x, training)
        return x

    def backward(self, dy, grads_ready=None) -> None:
        """Backpropagate down to the first layer with parameters; its input gradient is skipped.

        After each layer, `grads_ready(start)` (if given) learns that `grads[start:]` are final:
        the layers fill the flat buffer from its end, so a synchronizer can send their part meanwhile.
        """
        first = next((i for i, layer in enumerate(self.layers) if layer.params), len(self.layers))
        for i in range(len(self.layers) - 1, first - 1, -1):
            dy = self.layers[i].backward(dy, input_grad=i > first)
            if grads_ready is not None:
                grads_ready(self.grads_start[i])

    def config_entries(self) -> dict:
        """The config keys that build this model again."""
        return {"model.layers": self.layer_specs(), "model.graph": []}

    def layer_specs(self) -> list[dict]:
        """`model.layers` of a config that builds this model again: `{type: NAME, **arguments}` per layer."""
        names = {cls: name for name, cls in LAYER_TYPES.items()}
        specs = []
        for layer in self.layers:
            if type(layer) not in names:
                raise ConfigError(f"a {type(layer).__name__} layer is not one of mpitrain's layer types "
                                  f"{sorted(LAYER_TYPES)}, so a run's config.yaml cannot name it")
            arguments = {name: _plain(getattr(layer, name)) for name in inspect.signature(type(layer)).parameters
                         if name != "activation"}  # activations are layers of their own by now
            specs.append({"type": names[type(layer)], **arguments})
        return specs


def _with_activation_layers(layers: list[Layer]) -> list[Layer]:
    """`layers` with each layer's `activation` (if any) moved into an activation layer right after it."""
    expanded = []
    for layer in layers:
        expanded.append(layer)
        activation = getattr(layer, "activation", "none")
        if activation != "none":
            expanded.append(ACTIVATIONS[activation]())
            layer.activation = "none"
    return expanded


def _fuse_activations(layers: list[Layer]) -> None:
    """Let each layer that can (dense, conv2d) run the activation layer right after it, which then passes through."""
    for layer, after in zip(layers, layers[1:]):
        if type(after) in ACTIVATIONS.values() and isinstance(layer, FusesActivation):
            layer.fuse_activation(after.kind)
            after.fused = True


def _layout(names: list[str], shapes: list[dict]) -> list:
    """[(name, shape)] in buffer order, each name `LAYER/array` (e.g. `00_dense/W`)."""
    return [(f"{layer}/{name}", tuple(s)) for layer, layer_shapes in zip(names, shapes)
            for name, s in layer_shapes.items()]


def _per_layer(views: list, shapes: list[dict]) -> list[dict]:
    """Regroup the flat list of views into one {name: view} per layer."""
    grouped, views = [], iter(views)
    for layer_shapes in shapes:
        grouped.append({name: next(views) for name in layer_shapes})
    return grouped


def _plain(value):
    """A YAML-safe value: tuples become lists."""
    return list(value) if isinstance(value, tuple) else value


def build_model(config, input_shape, num_classes: int, xp, outputs: str = "classes") -> Sequential:
    """Build the model of `config.model` (a ModelConfig) for inputs of `input_shape`.

    Each layer is `{type: NAME, ...keyword arguments}`; a dense or conv2d layer's
    `activation` adds that activation layer after it. The last layer must give
    `num_classes` outputs (one per class, or per target column: `outputs` names them for the
    error). A layer that does not fit its input shape is named.
    """
    layers, shape = [], tuple(input_shape)
    for i, spec in enumerate(config.layers):
        for layer in _with_activation_layers([_layer_from_spec(spec, f"model.layers[{i}]")]):
            try:
                layer.param_shapes(shape)
                shape = layer.output_shape(shape)
            except ValueError as e:
                raise ConfigError(f"model.layers[{i}] ({spec['type']}) on inputs of shape {list(shape)}: {e}") from None
            layers.append(layer)
    model = Sequential(layers, input_shape, config.loss, xp, config.dtype, config.loss_options)
    if model.output_shape != (num_classes,):
        raise ConfigError(f"model.layers: the last layer gives outputs of shape {list(model.output_shape)}, "
                          f"expected [{num_classes}] for the dataset's {num_classes} {outputs}")
    weights = config.loss_options.get("class_weights", [])
    if weights and len(weights) != num_classes:
        raise ConfigError(f"model.loss_options.class_weights has {len(weights)} weights, expected {num_classes}: "
                          "one per class of the dataset")
    return model


def check_layer_spec(spec, key: str) -> None:
    """Refuse a layer entry of a config (`{type: NAME, ...arguments}`) that names an unknown type or argument,
    or an argument value out of range, naming the key (e.g. `model.layers[2].units`) and what was expected."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(f"{key} is {spec!r}, expected a mapping with a 'type' key")
    cls = LAYER_TYPES.get(spec["type"])
    if cls is None:
        raise ConfigError(f"{key}.type is {spec['type']!r}, expected one of {sorted(LAYER_TYPES)}")
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{key}: {e} (a {spec['type']} layer takes {list(inspect.signature(cls).parameters)})") from None
    for name, value in kwargs.items():
        ok, expected = LAYER_ARGUMENTS[name]
        if not ok(value):
            raise ConfigError(f"{key}.{name} is {value!r}, expected {expected}")


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Every layer argument a config may set, with the check it must pass and what is expected.
LAYER_ARGUMENTS = {
    "units": (_count, "an integer >= 1"),
    "filters": (_count, "an integer >= 1"),
    "kernel": (lambda v: _count(v) or isinstance(v, list) and len(v) == 2 and all(map(_count, v)),
               "an integer >= 1 or [height, width]"),
    "pool": (lambda v: _count(v) or isinstance(v, list) and len(v) == 2 and all(map(_count, v)),
             "an integer >= 1 or [height, width]"),
    "stride": (lambda v: v is None or _count(v), "an integer >= 1"),
    "padding": (lambda v: v in PADDINGS, f"one of {PADDINGS}"),
    "rate": (lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "momentum": (lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "eps": (lambda v: _number(v) and v > 0, "a positive number"),
    "activation": (lambda v: v == "none" or v in ACTIVATIONS, f"'none' or one of {sorted(ACTIVATIONS)}"),
    "init": (lambda v: v is None or v in INIT_SCHEMES, f"one of {INIT_SCHEMES}"),
}


def _layer_from_spec(spec, key: str) -> Layer:
    check_layer_spec(spec, key)
    try:
        return LAYER_TYPES[spec["type"]](**{k: v for k, v in spec.items() if k != "type"})
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
