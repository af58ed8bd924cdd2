"""A sequential model that owns ONE flat parameter buffer and ONE flat gradient buffer.

Layers hold views into both, so averaging parameters or gradients across ranks is a
single collective on a contiguous array. Running statistics (batch norm) have a flat
buffer of their own, `stats`, for the same reason.
"""
from __future__ import annotations

import inspect
import math

import numpy as np

from mpitrain.errors import ConfigError
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import AvgPool2D, Conv2D, MaxPool2D
from mpitrain.nn.layers import ACTIVATIONS, INIT_SCHEMES, Dense, Dropout, Flatten, Layer
from mpitrain.nn.losses import LOSSES

LAYER_TYPES = {"dense": Dense, "flatten": Flatten, "conv2d": Conv2D, "maxpool2d": MaxPool2D,
               "avgpool2d": AvgPool2D, "dropout": Dropout, "batchnorm": BatchNorm, **ACTIVATIONS}


class Sequential:
    """Layers applied in order, a loss on the last layer's output, flat buffers for all parameters."""

    def __init__(self, layers: list[Layer], input_shape: tuple[int, ...], loss: str, xp, dtype="float32"):
        self.layers, self.input_shape, self.xp = layers, tuple(input_shape), xp
        self.loss_fn = LOSSES[loss]
        shapes, stat_shapes, shape = [], [], self.input_shape
        for layer in layers:
            shapes.append(layer.param_shapes(shape))
            stat_shapes.append(layer.stat_shapes(shape))
            shape = layer.output_shape(shape)
        self.output_shape = shape
        self.params, self.layout, params = _flat_views(layers, shapes, xp, dtype)
        self.grads, _, grads = _flat_views(layers, shapes, xp, dtype)
        self.stats, self.stats_layout, stats = _flat_views(layers, stat_shapes, xp, dtype)
        self.n_params = self.params.size
        for layer, layer_params, layer_grads, layer_stats in zip(layers, params, grads, stats):
            layer.bind(layer_params, layer_grads)
            layer.bind_stats(layer_stats)
        decay, offset = np.zeros(self.n_params, dtype=dtype), 0
        for name, s in self.layout:
            decay[offset:offset + math.prod(s)] = name.endswith("/W")  # L2 on weights, not biases or BN scales
            offset += math.prod(s)
        self.decay_mask = xp.asarray(decay)

    def init_params(self, seed: int, scheme: str) -> None:
        """Draw initial parameters on the host from `seed`, so every backend starts alike."""
        rng = np.random.default_rng(seed)
        for layer in self.layers:
            for name, value in layer.init_params(rng, scheme).items():
                layer.params[name][...] = self.xp.asarray(value, dtype=self.params.dtype)
            for name, value in layer.init_stats().items():
                layer.stats[name][...] = self.xp.asarray(value, dtype=self.stats.dtype)

    def forward(self, x, training: bool = False, key: tuple = (0,)):
        """The logits of `x`; `key` (seed, rank, epoch, step) seeds the step's random layers (dropout)."""
        for index, layer in enumerate(self.layers):
            layer.key = (*key, index)
            x = layer.forward(x, training)
        return x

    def backward(self, dy) -> None:
        """Backpropagate down to the first layer with parameters; its input gradient is skipped."""
        first = next((i for i, layer in enumerate(self.layers) if layer.params), len(self.layers))
        for i in range(len(self.layers) - 1, first - 1, -1):
            dy = self.layers[i].backward(dy, input_grad=i > first)

    def train_batch(self, x, y, key: tuple = (0,)):
        """Forward and backward on one batch; fills `grads`; returns (mean loss, correct predictions)
        as 0-d arrays on the model's device, so a step never waits for the host."""
        logits = self.forward(x, training=True, key=key)
        loss, dlogits = self.loss_fn(logits, y)
        self.backward(dlogits)
        return loss, (logits.argmax(axis=1) == y).sum()


def _flat_views(layers, shapes, xp, dtype):
    """One zeroed flat buffer for the arrays of `shapes` (a dict per layer), the layout
    [(name, shape)] in buffer order, and each layer's {name: view into the buffer}."""
    buffer = xp.zeros(sum(math.prod(s) for layer_shapes in shapes for s in layer_shapes.values()), dtype=dtype)
    layout, views, offset = [], [], 0
    for index, (layer, layer_shapes) in enumerate(zip(layers, shapes)):
        views.append({})
        for name, s in layer_shapes.items():
            layout.append((f"{index:02d}_{type(layer).__name__.lower()}/{name}", tuple(s)))
            views[-1][name] = buffer[offset:offset + math.prod(s)].reshape(s)
            offset += math.prod(s)
    return buffer, layout, views


def build_model(config, input_shape, num_classes: int, xp) -> Sequential:
    """Build the model of `config.model` (a ModelConfig) for inputs of `input_shape`.

    Each layer is `{type: NAME, ...keyword arguments}`; a dense or conv2d layer's
    `activation` adds that activation layer after it. The last layer must give
    `num_classes` outputs. A layer that does not fit its input shape is named.
    """
    if config.loss not in LOSSES:
        raise ConfigError(f"model.loss is {config.loss!r}, expected one of {sorted(LOSSES)}")
    if config.init not in INIT_SCHEMES:
        raise ConfigError(f"model.init is {config.init!r}, expected one of {INIT_SCHEMES}")
    layers, shape = [], tuple(input_shape)
    for i, spec in enumerate(config.layers):
        for layer in _layer_from_spec(spec, f"model.layers[{i}]"):
            try:
                layer.param_shapes(shape)
                shape = layer.output_shape(shape)
            except ValueError as e:
                raise ConfigError(f"model.layers[{i}] ({spec['type']}) on inputs of shape {list(shape)}: {e}") from None
            layers.append(layer)
    model = Sequential(layers, input_shape, config.loss, xp, config.dtype)
    if model.output_shape != (num_classes,):
        raise ConfigError(f"model.layers: the last layer gives outputs of shape {list(model.output_shape)}, "
                          f"expected [{num_classes}] for the dataset's {num_classes} classes")
    return model


def _layer_from_spec(spec, key: str) -> list[Layer]:
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(f"{key} is {spec!r}, expected a mapping with a 'type' key")
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    cls = LAYER_TYPES.get(spec["type"])
    if cls is None:
        raise ConfigError(f"{key}.type is {spec['type']!r}, expected one of {sorted(LAYER_TYPES)}")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{key}: {e} (a {spec['type']} layer takes {list(inspect.signature(cls).parameters)})") from None
    activation = kwargs.get("activation", "none")
    if activation != "none" and activation not in ACTIVATIONS:
        raise ConfigError(f"{key}.activation is {activation!r}, expected 'none' or one of {sorted(ACTIVATIONS)}")
    init = kwargs.get("init")
    if init is not None and init not in INIT_SCHEMES:
        raise ConfigError(f"{key}.init is {init!r}, expected one of {INIT_SCHEMES}")
    try:
        layer = cls(**kwargs)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    return [layer] if activation == "none" else [layer, ACTIVATIONS[activation]()]
