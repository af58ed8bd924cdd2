"""Batch normalization for dense (N, F) and convolutional (N, C, H, W) inputs."""
from __future__ import annotations

import numpy as np

from mpitrain.kernels import batchnorm as kernels
from mpitrain.nn.layers import FusesActivation, layer_type, refuse_sequence


@layer_type("batchnorm")
class BatchNorm(FusesActivation):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta per feature (dense) or per channel (conv), then its
    `activation` (as DL4J's BatchNormalization layer has one), which runs fused in the same kernel.

    Training normalizes with the batch's statistics and moves the running statistics
    towards them (`momentum` keeps the old share); evaluation uses the running ones. They
    live in the model's `stats` buffer, which the synchronizers average across ranks, so
    every replica evaluates alike. The running variance takes the unbiased batch variance.
    Each direction is one kernel (`mpitrain.kernels.batchnorm`) on (N, C, S) views of
    workspace arrays: per channel, sums in float64, nothing allocated.
    """

    def __init__(self, momentum: float = 0.9, eps: float = 1e-5, activation: str = "none"):
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum {momentum!r}, expected a number in [0, 1)")
        if eps <= 0:
            raise ValueError(f"eps {eps!r}, expected a positive number")
        self.momentum, self.eps, self.activation = momentum, eps, activation

    def param_shapes(self, input_shape):
        refuse_sequence(input_shape, "batchnorm", "its batch statistics would count the padded steps")
        if len(input_shape) not in (1, 3):
            raise ValueError(f"a batchnorm layer takes features (F,) or images (C, H, W), got inputs of shape "
                             f"{list(input_shape)}")
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
        self.x_hat = self.ws("x_hat", x.shape, x.dtype)
        self.inv_std = self.ws("inv_std", (x.shape[1],), x.dtype)
        self.y = self.ws("y", x.shape, x.dtype)
        kernels.forward(_channels(x), self.params["gamma"], self.params["beta"], self.eps, self.stats["mean"],
                        self.stats["var"], self.momentum, training, _channels(self.x_hat), self.inv_std,
                        _channels(self.y), self.kind)
        return self.y

    def backward(self, dy, input_grad=True):
        dx = self.ws("dx", dy.shape, dy.dtype) if input_grad else None
        dz = dy if self.kind == "none" else self.ws("dz", dy.shape, dy.dtype)  # dy times the activation's derivative
        kernels.backward(_channels(dy), _channels(self.y), self.kind, _channels(dz), _channels(self.x_hat),
                         self.inv_std, self.params["gamma"], self.grads["gamma"], self.grads["beta"],
                         None if dx is None else _channels(dx))
        return dx


def _channels(array):
    """(N, C, S) view: features (N, F) as (N, F, 1), images (N, C, H, W) as (N, C, H*W)."""
    return array.reshape(array.shape[0], array.shape[1], -1)
