"""Gradient checks for the layers' tests: backward against central differences."""
from __future__ import annotations

import numpy as np

from mpitrain.nn.losses import softmax_cross_entropy
from mpitrain.nn.model import Sequential


def numeric_grad(f, x, eps=1e-6):
    """d f() / d x by central differences, element by element (x is changed in place and restored)."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


def check_model_gradients(layers, input_shape, n=5, classes=3, seed=0):
    """A float64 model of `layers`: its backward's parameter and input gradients equal numeric ones."""
    rng = np.random.default_rng(seed)
    model = Sequential(layers, input_shape, "softmax_cross_entropy", np, "float64")
    model.init_params(seed, "xavier")
    model.params += rng.normal(0, 0.1, model.n_params)  # non-zero biases too
    x = rng.normal(size=(n, *input_shape))
    y = rng.integers(0, classes, size=n)

    def loss():
        return softmax_cross_entropy(model.forward(x, training=True), y)[0]

    model.train_batch(x, y)
    analytic_params = model.grads.copy()
    np.testing.assert_allclose(analytic_params, numeric_grad(loss, model.params), rtol=1e-5, atol=1e-8)
    # input gradient: run backward by hand to get dx from the first layer
    logits = model.forward(x, training=True)
    _, _, dy = softmax_cross_entropy(logits, y)
    for layer in reversed(model.layers):
        dy = layer.backward(dy)
    np.testing.assert_allclose(dy, numeric_grad(loss, x), rtol=1e-5, atol=1e-8)



def padded_steps(lengths, steps: int) -> np.ndarray:
    """(B, T) bools: step t of sequence b is padding (t >= lengths[b])."""
    return np.arange(steps)[None, :] >= np.asarray(lengths)[:, None]


def check_sequence_layer_gradients(layer, features: int, lengths, steps: int, seed: int = 0) -> None:
    """A float64 sequence layer on (B, `steps`, `features`) inputs with `lengths` set as the model sets them: its
    backward's parameter and input gradients of a loss on its valid outputs (a random weighting of them, zero at
    padded steps, as the masked losses give) equal central differences within 1e-3 relative error, and its input
    gradient is exactly zero at padded steps."""
    rng = np.random.default_rng(seed)
    model = Sequential([layer], (None, features), "softmax_cross_entropy", np, "float64")
    model.init_params(seed, "xavier")
    model.params += rng.normal(0, 0.1, model.n_params)  # non-zero biases too
    lengths = np.asarray(lengths)
    x = rng.normal(size=(len(lengths), steps, features))
    layer.lengths = lengths
    weights = rng.normal(size=layer.forward(x, training=True).shape)
    if weights.ndim == 3:
        weights[padded_steps(lengths, steps)] = 0

    def loss():
        return float((layer.forward(x, training=True) * weights).sum())

    loss()
    dx = layer.backward(weights).copy()
    analytic = model.grads.copy()
    assert_relative_error(analytic, numeric_grad(loss, model.params))
    assert_relative_error(dx, numeric_grad(loss, x))
    assert (dx[padded_steps(lengths, steps)] == 0).all()


def assert_relative_error(analytic, numeric, most: float = 1e-3) -> None:
    """|analytic - numeric| <= most * (|analytic| + |numeric|) element by element, up to 1e-8 absolute (the
    differences' own error near zero)."""
    error = np.abs(analytic - numeric)
    bound = most * (np.abs(analytic) + np.abs(numeric)) + 1e-8
    assert (error <= bound).all(), f"largest relative error {np.max(error / (bound / most))}"
