"""Gradients of every layer and loss against central finite differences (float64)."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.nn.layers import Dense, Flatten, ReLU, Sigmoid, Tanh
from mpitrain.nn.losses import softmax_cross_entropy
from mpitrain.nn.model import Sequential, build_model
from mpitrain.testing.gradients import check_model_gradients, numeric_grad


@pytest.mark.parametrize("activation", [ReLU, Tanh, Sigmoid])
def test_dense_and_activation_gradients(activation):
    check_model_gradients([Dense(7), activation(), Dense(3)], (6,))


def test_flatten_and_dense_on_image_input():
    check_model_gradients([Flatten(), Dense(4), Tanh(), Dense(3)], (1, 3, 2))


def test_softmax_cross_entropy_gradient_and_value():
    rng = np.random.default_rng(1)
    logits, y = rng.normal(size=(4, 5)), np.array([0, 4, 2, 2])
    loss, correct, grad = softmax_cross_entropy(logits, y)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert loss == pytest.approx(-np.log(p[np.arange(4), y]).mean())
    assert correct == (logits.argmax(axis=1) == y).sum()
    np.testing.assert_allclose(grad, numeric_grad(lambda: softmax_cross_entropy(logits, y)[0], logits), atol=1e-8)


def test_softmax_cross_entropy_is_stable_for_large_logits():
    loss, _, grad = softmax_cross_entropy(np.array([[1000.0, 0.0], [0.0, -1000.0]]), np.array([0, 1]))
    assert np.isfinite(loss) and np.isfinite(grad).all()
    assert loss == pytest.approx(500.0)


def test_layers_share_the_flat_buffers():
    model = Sequential([Dense(4), ReLU(), Dense(2)], (3,), "softmax_cross_entropy", np)
    assert model.n_params == 3 * 4 + 4 + 4 * 2 + 2
    model.layers[2].params["b"][...] = 7
    assert (model.params[-2:] == 7).all()
    assert model.decay_mask.sum() == 3 * 4 + 4 * 2  # weights only


def test_xavier_and_he_scales():
    for scheme, expected_std in (("xavier", np.sqrt(2 / (400 + 300))), ("he", np.sqrt(2 / 400))):
        model = Sequential([Dense(300)], (400,), "softmax_cross_entropy", np)
        model.init_params(0, scheme)
        assert model.layers[0].params["W"].std() == pytest.approx(expected_std, rel=0.02)
        assert (model.layers[0].params["b"] == 0).all()


def test_build_model_checks_the_output_size_and_layer_keys():
    layers = [{"type": "dense", "units": 8, "activation": "relu"}, {"type": "dense", "units": 10}]
    model = build_model(ModelConfig(layers=layers), (1, 2, 2), 10, np)
    assert [type(layer).__name__ for layer in model.layers] == ["Dense", "ReLU", "Dense"]
    with pytest.raises(ConfigError, match=r"last layer .* \[3\]"):
        build_model(ModelConfig(layers=layers), (4,), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[0\].*unit"):
        build_model(ModelConfig(layers=[{"type": "dense", "unit": 3}]), (4,), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[0\].activation"):
        build_model(ModelConfig(layers=[{"type": "dense", "units": 3, "activation": "swish"}]), (4,), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[1\].type"):
        build_model(ModelConfig(layers=[{"type": "dense", "units": 3}, {"type": "conv9"}]), (4,), 3, np)


def test_gradient_buckets_hold_whole_layers_last_first_within_the_cap():
    from mpitrain.parallel.sync.buckets import gradient_buckets, layer_ranges
    layout = [("00_dense/W", (10, 5)), ("00_dense/b", (5,)), ("02_dense/W", (5, 3)), ("02_dense/b", (3,)),
              ("03_batchnorm/gamma", (3,)), ("03_batchnorm/beta", (3,))]
    assert layer_ranges(layout) == [(0, 55), (55, 73), (73, 79)]
    assert gradient_buckets(layout, 1e6, 4) == [(0, 79)]  # a cap beyond the buffer: one bucket
    assert gradient_buckets(layout, 0, 4) == [(73, 79), (55, 73), (0, 55)]  # one per layer, last first
    assert gradient_buckets(layout, 24 * 4, 4) == [(55, 79), (0, 55)]  # the first layer exceeds the cap alone
    for cap in (0, 10, 100, 300, 1e6):  # always a cover of the buffer, tail first, contiguous
        buckets = gradient_buckets(layout, cap, 4)
        assert buckets[0][1] == 79 and buckets[-1][0] == 0
        assert all(a[0] == b[1] for a, b in zip(buckets, buckets[1:]))


def test_sequential_announces_finished_gradients_from_the_buffer_end():
    model = Sequential([Flatten(), Dense(4, activation="relu"), Dense(3)], (2, 3), xp=np)
    model.init_params(seed=0, scheme="he")
    starts = []
    model.train_batch(np.ones((2, 2, 3), dtype=np.float32), np.array([0, 2]), grads_ready=starts.append)
    first, second = 6 * 4 + 4, 6 * 4 + 4 + 4 * 3 + 3
    assert starts == [first, first, 0] and model.n_params == second  # dense, relu, dense: the flatten is skipped


def test_an_activation_the_layer_before_cannot_fuse_runs_alone_with_the_same_gradients():
    layers = [Flatten(), Sigmoid(), Dense(4), Tanh(), Dense(3)]
    check_model_gradients(layers, (2, 3))
    assert not layers[1].fused and layers[3].fused and layers[2].kind == "tanh"
