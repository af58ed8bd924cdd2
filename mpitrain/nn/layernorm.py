"""Layer normalization over the last axis: a row's features (F,), or each step's features of a sequence (None, F)."""
from __future__ import annotations

import numpy as np

from mpitrain.kernels import layernorm as kernels
from mpitrain.nn.layers import FusesActivation, is_sequence, layer_type, varying


@layer_type("layernorm")
class LayerNorm(FusesActivation):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta, the mean and (biased) variance taken over each row's last
    axis, then its `activation`, fused in the same kernel as batch norm's (PyTorch's `nn.LayerNorm(F)`, Keras's
    `LayerNormalization()`: Ba et al. 2016). Unlike batch norm it has no running statistics and normalizes the
    same in training and evaluation, each row by itself, so it takes sequences: each step is a row of its own,
    and a padded step's values reach nobody (its gradient rows are zero, so they add nothing to gamma's and
    beta's). Inputs with more axes than features or a sequence (images) are refused: normalizing an image's last
    axis (its width) is not what a user means. Each direction is a numba kernel (`mpitrain.kernels.layernorm`)
    on (rows, F) views of workspace arrays, grow-only for sequences; nothing is allocated per step.
    """

    per_step = True

    def __init__(self, eps: float = 1e-5, activation: str = "none"):
        if eps <= 0:
            raise ValueError(f"eps {eps!r}, expected a positive number")
        self.eps, self.activation = eps, activation

    def param_shapes(self, input_shape):
        if len(input_shape) != 1 and not is_sequence(input_shape):
            raise ValueError(f"a layernorm layer takes features (F,) or a sequence (None, F), got inputs of shape "
                             f"{list(input_shape)}")
        return {"gamma": (input_shape[-1],), "beta": (input_shape[-1],)}

    def init_params(self, rng, scheme):
        n = self.params["gamma"].size
        return {"gamma": np.ones(n), "beta": np.zeros(n)}

    def _rows(self, name: str, like):
        """Workspace array `name` of `like`'s rows (R, F)."""
        return varying(self.ws, name, (like.size // like.shape[-1], like.shape[-1]), like.dtype)

    def forward(self, x, training):
        rows = x.reshape(-1, x.shape[-1])
        self.x_hat, self.y = self._rows("x_hat", x), self._rows("y", x)
        self.inv_std = varying(self.ws, "inv_std", (len(rows),), x.dtype)
        kernels.forward(rows, self.params["gamma"], self.params["beta"], self.eps, self.x_hat, self.inv_std, self.y,
                        self.kind)
        return self.y.reshape(x.shape)

    def backward(self, dy, input_grad=True):
        shape, dy = dy.shape, dy.reshape(self.y.shape)
        dx = self._rows("dx", dy) if input_grad else None
        dz = dy if self.kind == "none" else self._rows("dz", dy)  # dy times the activation's derivative
        kernels.backward(dy, self.y, self.kind, dz, self.x_hat, self.inv_std, self.params["gamma"],
                         self.grads["gamma"], self.grads["beta"], dx)
        return None if dx is None else dx.reshape(shape)
