"""Gradient checks for the layers' tests: backward against central differences."""
from __future__ import annotations

import numpy as np

from mpitrain.data.sequences import SequenceBatch
from mpitrain.nn.layers import is_sequence
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
    """(B, T) bools: step t of sequence b is padding (t >= lengths[b]), where `valid_steps` holds 0."""
    return valid_steps(lengths, steps, len(lengths))[:, :, 0] == 0


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


def set_sequence_lengths(layers, input_shape, lengths):
    """Set each layer's `lengths` as the model does (docs/sequences.md): its input's lengths when its input is a
    sequence, else None; `output_lengths` (where a layer has one) carries them on. Returns the last output's."""
    shape = tuple(input_shape)
    for layer in layers:
        sequence_in = is_sequence(shape)
        layer.lengths = lengths if sequence_in else None
        shape = layer.output_shape(shape)
        if not is_sequence(shape):
            lengths = None
        elif sequence_in and lengths is not None and hasattr(layer, "output_lengths"):
            lengths = layer.output_lengths(lengths)
    return lengths


def sequences(x, lengths):
    """What a model takes: `x` alone (every step valid) when `lengths` is None, else a `SequenceBatch`."""
    return x if lengths is None else SequenceBatch(x, np.asarray(lengths))


def valid_steps(lengths, steps: int, n: int) -> np.ndarray:
    """(n, steps, 1) float: 1 at each sequence's valid steps, 0 at its padding (every step valid when lengths is None)."""
    if lengths is None:
        return np.ones((n, steps, 1))
    return (np.arange(steps) < np.asarray(lengths)[:, None])[:, :, None].astype(float)


def sequence_model(layers, features: int, seed: int = 0, dtype: str = "float64") -> Sequential:
    """A model of `layers` on sequences (None, features), parameters drawn from `seed` (biases non-zero)."""
    model = Sequential(layers, (None, features), "softmax_cross_entropy", np, dtype)
    model.init_params(seed, "xavier")
    model.params += np.random.default_rng(seed).normal(0, 0.1, model.n_params).astype(dtype)
    return model


def padded_batch(sequences: list, steps: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(x, lengths): `sequences` (each (L, F)) right-padded to `steps` with large random garbage in the padding."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 100, size=(len(sequences), steps, sequences[0].shape[1]))
    for b, sequence in enumerate(sequences):
        x[b, :len(sequence)] = sequence
    return x, np.array([len(s) for s in sequences], dtype=np.int64)


def weighted_loss(model, x, lengths, weights):
    """The loss sum(weights * output) over the output's valid steps (a sequence) or over its vectors, and its
    gradient with respect to the output (zero at padded steps, as a masked loss makes it). Sets the lengths.
    `weights` has the output's dimensions, each at least as long (its leading part is used)."""
    out_lengths = set_sequence_lengths(model.layers, model.input_shape, lengths)
    y = model.forward(sequences(x, lengths), training=True)
    dy = weights[tuple(slice(0, n) for n in y.shape)].copy()
    if y.ndim == 3:
        dy *= valid_steps(out_lengths, y.shape[1], len(y))
    return float((dy * y).sum()), dy


def sequence_gradients(model, x, lengths, weights):
    """Backward of `weighted_loss`: (parameter gradients, input gradient), copies."""
    _, dy = weighted_loss(model, x, lengths, weights)
    for layer in reversed(model.layers):
        dy = layer.backward(dy)
    return model.grads.copy(), dy.copy()


def check_sequence_gradients(layers, features: int, lengths, steps: int, n: int = 3, seed: int = 0,
                             rtol: float = 1e-3):
    """A float64 model of `layers` on `n` sequences (None, features) of `lengths` ((n,); None: all `steps` valid),
    padded to `steps` with garbage: its parameter and input gradients equal central differences within `rtol`, and
    the input gradient is exactly zero at padded steps. The loss weighs the output's valid steps at random."""
    rng = np.random.default_rng(seed)
    model = sequence_model(layers, features, seed)
    x = rng.normal(size=(n, steps, features))
    if lengths is not None:
        x = x * valid_steps(lengths, steps, n) + rng.normal(0, 100, size=x.shape) * (1 - valid_steps(lengths, steps, n))
    weights = rng.normal(size=(n, 4 * steps, 64) if is_sequence(model.output_shape) else (n, 64))  # cut to the output

    def loss():
        return weighted_loss(model, x, lengths, weights)[0]

    params, dx = sequence_gradients(model, x, lengths, weights)
    np.testing.assert_allclose(params, numeric_grad(loss, model.params), rtol=rtol, atol=1e-7)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=rtol, atol=1e-7)
    assert (dx * (1 - valid_steps(lengths, steps, n)) == 0).all()
    return model
