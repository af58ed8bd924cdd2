"""Batch normalization for dense (N, F) and convolutional (N, C, H, W) inputs."""
from __future__ import annotations

import numpy as np

from mpitrain.backend import array_module
from mpitrain.nn.layers import Layer


class BatchNorm(Layer):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta per feature (dense) or per channel (conv).

    Training normalizes with the batch's statistics and moves the running statistics
    towards them (`momentum` keeps the old share); evaluation uses the running ones. They
    live in the model's `stats` buffer, which the synchronizers average across ranks, so
    every replica evaluates alike. The running variance takes the unbiased batch variance.
    """

    def __init__(self, momentum: float = 0.9, eps: float = 1e-5):
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum {momentum!r}, expected a number in [0, 1)")
        if eps <= 0:
            raise ValueError(f"eps {eps!r}, expected a positive number")
        self.momentum, self.eps = momentum, eps

    def param_shapes(self, input_shape):
        if len(input_shape) not in (1, 3):
            raise ValueError(f"a batchnorm layer takes features (F,) or images (C, H, W), got inputs of shape "
                             f"{list(input_shape)}")
        self.axes = (0,) if len(input_shape) == 1 else (0, 2, 3)
        self.shape = (1, input_shape[0]) if len(input_shape) == 1 else (1, input_shape[0], 1, 1)
        return {"gamma": (input_shape[0],), "beta": (input_shape[0],)}

    def stat_shapes(self, input_shape):
        return {"mean": (input_shape[0],), "var": (input_shape[0],)}

    def init_params(self, rng, scheme):
        n = self.params["gamma"].size
        return {"gamma": np.ones(n), "beta": np.zeros(n)}

    def init_stats(self):
        n = self.stats["mean"].size
        return {"mean": np.zeros(n), "var": np.ones(n)}

    def forward(self, x, training):
        xp = array_module(x)
        if training:
            mean = x.mean(axis=self.axes)
            centered = x - mean.reshape(self.shape)
            var = (centered * centered).mean(axis=self.axes)
            m = x.size // mean.size
            self.stats["mean"][...] = self.momentum * self.stats["mean"] + (1 - self.momentum) * mean
            self.stats["var"][...] = self.momentum * self.stats["var"] + (1 - self.momentum) * var * (m / max(m - 1, 1))
        else:
            mean, var = self.stats["mean"], self.stats["var"]
            centered = x - mean.reshape(self.shape)
        self.inv_std = (1 / xp.sqrt(var + self.eps)).astype(x.dtype).reshape(self.shape)
        self.x_hat = centered * self.inv_std
        return self.x_hat * self.params["gamma"].reshape(self.shape) + self.params["beta"].reshape(self.shape)

    def backward(self, dy, input_grad=True):
        (dy * self.x_hat).sum(axis=self.axes, out=self.grads["gamma"])
        dy.sum(axis=self.axes, out=self.grads["beta"])
        if not input_grad:
            return None
        dx_hat = dy * self.params["gamma"].reshape(self.shape)
        mean_dx_hat = dx_hat.mean(axis=self.axes, keepdims=True)
        mean_dx_hat_x_hat = (dx_hat * self.x_hat).mean(axis=self.axes, keepdims=True)
        return (dx_hat - mean_dx_hat - self.x_hat * mean_dx_hat_x_hat) * self.inv_std
