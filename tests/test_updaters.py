"""Each updater against a step computed by hand; L2 touches weights only."""
import numpy as np
import pytest

from mpitrain.config import OptimizerConfig
from mpitrain.nn.updaters import create_updater

P = np.array([1.0, -2.0, 0.5])
G = np.array([0.1, 0.2, -0.4])
MASK = np.array([1.0, 1.0, 0.0])


def two_steps(**kwargs):
    updater = create_updater(OptimizerConfig(**kwargs), P.copy(), MASK)
    return updater.delta(G, P).copy(), updater.delta(G, P).copy()


def test_plain_sgd():
    first, second = two_steps(type="sgd", lr=0.1)
    np.testing.assert_allclose(first, -0.1 * G)
    np.testing.assert_allclose(second, -0.1 * G)


def test_momentum_and_nesterov():
    first, second = two_steps(type="sgd", lr=0.1, momentum=0.9)
    np.testing.assert_allclose(first, -0.1 * G)
    np.testing.assert_allclose(second, 0.9 * (-0.1 * G) - 0.1 * G)
    first, second = two_steps(type="sgd", lr=0.1, momentum=0.9, nesterov=True)
    v1 = -0.1 * G
    np.testing.assert_allclose(first, 0.9 * v1 - 0.1 * G)
    v2 = 0.9 * v1 - 0.1 * G
    np.testing.assert_allclose(second, 0.9 * v2 - 0.1 * G)


def test_adagrad():
    first, second = two_steps(type="adagrad", lr=0.5, eps=1e-8)
    np.testing.assert_allclose(first, -0.5 * G / (np.abs(G) + 1e-8))
    np.testing.assert_allclose(second, -0.5 * G / (np.sqrt(2 * G * G) + 1e-8))


def test_rmsprop():
    first, second = two_steps(type="rmsprop", lr=0.01, rho=0.9, eps=1e-8)
    s1 = 0.1 * G * G
    s2 = 0.9 * s1 + 0.1 * G * G
    np.testing.assert_allclose(first, -0.01 * G / (np.sqrt(s1) + 1e-8))
    np.testing.assert_allclose(second, -0.01 * G / (np.sqrt(s2) + 1e-8))


def test_adam_with_bias_correction():
    first, second = two_steps(type="adam", lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8)
    m, v = np.zeros(3), np.zeros(3)
    for t, got in ((1, first), (2, second)):
        m = 0.9 * m + 0.1 * G
        v = 0.999 * v + 0.001 * G * G
        expected = -0.001 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_l2_applies_to_weights_not_biases():
    first, _ = two_steps(type="sgd", lr=0.1, l2=0.01)
    np.testing.assert_allclose(first, -0.1 * (G + 0.01 * MASK * P))
    assert first[2] == pytest.approx(-0.1 * G[2])


@pytest.mark.parametrize("kind, slots", [("sgd", 0), ("adagrad", 1), ("rmsprop", 1), ("adam", 2)])
def test_state_is_one_flat_buffer(kind, slots):
    updater = create_updater(OptimizerConfig(type=kind), P.copy(), MASK)
    assert updater.state.shape == (slots * 3,)
    updater.delta(G, P)
    for slot in updater.slots:
        assert np.shares_memory(slot, updater.state)


def test_learning_rate_decays_per_epoch():
    updater = create_updater(OptimizerConfig(type="sgd", lr=0.1, lr_decay=0.5), P.copy(), MASK)
    updater.start_epoch(2)
    np.testing.assert_allclose(updater.delta(G, P), -0.025 * G)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_momentum_kernel_matches_its_reference(nesterov, dtype):
    from mpitrain.kernels.sgd import momentum_step, momentum_step_reference
    rng = np.random.default_rng(0)
    g, p = rng.normal(size=(2, 100_003)).astype(dtype)
    decay = (rng.random(100_003) < 0.9).astype(dtype) * dtype(1e-4)
    v1 = rng.normal(size=100_003).astype(dtype)
    v2, out1, out2 = v1.copy(), np.empty_like(v1), np.empty_like(v1)
    momentum_step(v1, g, p, decay, 0.05, 0.9, nesterov, out1)
    momentum_step_reference(v2, g, p, decay, 0.05, 0.9, nesterov, out2)
    np.testing.assert_array_equal(v1, v2)
    np.testing.assert_array_equal(out1, out2)
