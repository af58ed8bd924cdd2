"""Each updater against a step computed by hand; L2 touches weights only. Each fused kernel against its
reference (sizes, dtypes, L2, strided views, state carried over steps), each updater against the unfused numpy
formulas, and a step that allocates nothing."""

import numpy as np
import pytest

from mpitrain.config.sections import OptimizerConfig
from mpitrain.kernels import updaters as kernels
from mpitrain.nn.updaters import create_updater
from mpitrain.testing.traced import allocated_bytes
from mpitrain.testing.updater_cases import STEPS, step_inputs

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


@pytest.mark.parametrize("kind, slots", [("sgd", 0), ("adagrad", 1), ("rmsprop", 1), ("adam", 2)])
def test_loading_the_kernel_leaves_the_updater_untouched(kind, slots):
    updater = create_updater(OptimizerConfig(type=kind, momentum=0.9, l2=0.01), P.copy(), MASK)
    assert updater.iteration == 0
    assert not updater.state.any()


# name: (the kernels' function, state slots, its arguments after the slots, g, p, decay and before out, at step t)


def assert_close(actual, expected):
    """Equal to a few units in the last place of the dtype (of the largest magnitude, near zero)."""
    eps = 4 * np.finfo(expected.dtype).eps
    np.testing.assert_allclose(actual, expected, rtol=eps, atol=eps * float(np.abs(expected).max()))


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("l2", [False, True], ids=["no-l2", "l2"])
@pytest.mark.parametrize("n", [1, 7, 1001, 100_003])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(STEPS))
def test_fused_kernel_matches_its_reference(name, dtype, n, l2, strided):
    function, slots, args = STEPS[name]
    kernel, reference = getattr(kernels, function), getattr(kernels, function + "_reference")
    rng = np.random.default_rng(n)
    state, g, p, decay, out = step_inputs(rng, n, dtype, slots, l2, strided)
    expected_state, expected_out = [s.copy() for s in state], out.copy()
    for t in (1, 2, 3):
        g[...] = rng.normal(size=n)
        kernel(*state, g, p, decay, *args(t), out)
        reference(*expected_state, g, p, decay, *args(t), expected_out)
        assert out.dtype == dtype and all(s.dtype == dtype for s in state)
        for got, expected in zip([*state, out], [*expected_state, expected_out]):
            assert_close(got, expected)
        p += out


def nadam_arguments(t: int) -> tuple:
    """NAdam's scalar arguments at step t (beta1 0.9, momentum decay 0.004), its momenta's products from step 1."""
    mu = [kernels.nadam_momentum(0.9, 0.004, step) for step in range(1, t + 2)]
    return 0.002, 0.9, 0.999, 1e-8, mu[t - 1], mu[t], float(np.prod(mu[:t])), float(np.prod(mu)), t


# The variants the Adam family added: AMSGrad's third slot, AdamW's decoupled decay (an array per parameter), NAdam;
# contiguous buffers, as the updaters hand them (the strided paths are the older kernels').
VARIANTS = {
    "amsgrad": ("adam_variant_step", 3, lambda t, wd: (None, 0.001, 0.9, 0.999, 1e-8, t)),
    "adamw": ("adam_variant_step", 3, lambda t, wd: (wd, 0.001, 0.9, 0.999, 1e-8, t)),
    "nadam": ("nadam_step", 2, lambda t, wd: nadam_arguments(t)),
}


@pytest.mark.parametrize("l2", [False, True], ids=["no-l2", "l2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_an_adam_variant_kernel_matches_its_reference(name, dtype, l2):
    function, slots, args = VARIANTS[name]
    kernel, reference = getattr(kernels, function), getattr(kernels, function + "_reference")
    rng = np.random.default_rng(11)
    n = 1001
    state, g, p, decay, out = step_inputs(rng, n, dtype, slots, l2, False)
    if name == "adamw":  # the third slot is AMSGrad's: None for plain AdamW
        state[2] = None
    wd = (rng.random(n) < 0.8).astype(dtype) * dtype(0.05)
    expected_state, expected_out = [None if s is None else s.copy() for s in state], out.copy()
    for t in (1, 2, 3):
        g[...] = rng.normal(size=n)
        kernel(*state, g, p, decay, *args(t, wd), out)
        reference(*expected_state, g, p, decay, *args(t, wd), expected_out)
        for got, expected in zip([*state, out], [*expected_state, expected_out]):
            if got is not None:
                assert got.dtype == dtype
                assert_close(got, expected)
        p += out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_momentum_writes_its_delta_into_the_velocity(dtype):
    rng = np.random.default_rng(5)
    (v,), g, p, decay, _ = step_inputs(rng, 1001, dtype, 1, True, False)
    expected_v = v.copy()
    kernels.momentum_step(v, g, p, decay, 0.05, 0.9, False, v)
    kernels.momentum_step_reference(expected_v, g, p, decay, 0.05, 0.9, False, expected_v)
    assert_close(v, expected_v)


class UnfusedUpdater:
    """Today's updaters as plain numpy formulas, one operation at a time, temporaries and all."""

    def __init__(self, c: OptimizerConfig, n: int, dtype):
        self.c, self.t = c, 0
        self.state = [np.zeros(n, dtype=dtype) for _ in range(2)]

    def delta(self, grads, params, decay):
        c, (a, b) = self.c, self.state
        self.t += 1
        g = grads + params * decay if c.l2 else grads
        if c.type == "sgd" and not c.momentum:
            return -c.lr * g
        if c.type == "sgd":
            a[...] = c.momentum * a - c.lr * g
            return c.momentum * a - c.lr * g if c.nesterov else a.copy()
        if c.type == "adagrad":
            a += g * g
            return -c.lr * g / (np.sqrt(a) + c.eps)
        if c.type == "rmsprop":
            a[...] = c.rho * a + (1 - c.rho) * g * g
            return -c.lr * g / (np.sqrt(a) + c.eps)
        a[...] = c.beta1 * a + (1 - c.beta1) * g
        b[...] = c.beta2 * b + (1 - c.beta2) * g * g
        m_hat, v_hat = a / (1 - c.beta1 ** self.t), b / (1 - c.beta2 ** self.t)
        return -c.lr * m_hat / (np.sqrt(v_hat) + c.eps)


UPDATER_CONFIGS = {
    "sgd": dict(type="sgd", lr=0.05),
    "momentum": dict(type="sgd", lr=0.05, momentum=0.9),
    "nesterov": dict(type="sgd", lr=0.05, momentum=0.9, nesterov=True),
    "adagrad": dict(type="adagrad", lr=0.05),
    "rmsprop": dict(type="rmsprop", lr=0.01, rho=0.9),
    "adam": dict(type="adam", lr=0.001),
}


@pytest.mark.parametrize("l2", [0.0, 1e-2])
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("name", list(UPDATER_CONFIGS))
def test_updater_matches_the_unfused_formulas_over_steps(name, dtype, rtol, l2):
    c = OptimizerConfig(**UPDATER_CONFIGS[name], l2=l2)
    rng = np.random.default_rng(3)
    n = 1001
    p = rng.normal(size=n).astype(dtype)
    mask = (rng.random(n) < 0.8).astype(dtype)
    updater, unfused = create_updater(c, p, mask), UnfusedUpdater(c, n, dtype)
    expected_p = p.copy()
    for _ in range(5):
        g = rng.normal(size=n).astype(dtype)
        expected = unfused.delta(g, expected_p, mask * l2)
        got = updater.delta(g, p)
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * float(np.abs(expected).max()))
        p += got
        expected_p += expected


@pytest.mark.parametrize("l2", [0.0, 1e-2])
@pytest.mark.parametrize("name", [*UPDATER_CONFIGS, "adamw", "amsgrad", "nadam"])
def test_a_step_allocates_no_array(name, l2):
    rng = np.random.default_rng(4)
    n = 100_000
    p, g = rng.normal(size=(2, n)).astype(np.float32)
    config = UPDATER_CONFIGS.get(name) or {"adamw": dict(type="adamw", lr=0.001), "nadam": dict(type="nadam", lr=0.002),
                                           "amsgrad": dict(type="adam", lr=0.001, amsgrad=True)}[name]
    updater = create_updater(OptimizerConfig(**config, l2=l2), p, np.ones(n, dtype=np.float32))
    allocated = allocated_bytes(lambda: updater.delta(g, p))
    assert allocated <= 4096, f"{allocated} bytes allocated by one step"


@pytest.mark.parametrize("config, copies", [
    (dict(type="sgd", lr=0.1), 3), (dict(type="sgd", lr=0.1, momentum=0.9), 4), (dict(type="adam", lr=0.001), 5),
    (dict(type="adam", lr=0.001, amsgrad=True), 6), (dict(type="sgd", lr=0.1, l2=1e-4), 5),
    (dict(type="adamw", lr=0.001, weight_decay=0.01), 7), (dict(type="adamw", lr=0.001, weight_decay=0.01, l2=1e-4), 8),
])
def test_a_model_and_its_updater_hold_the_copies_the_memory_check_counts(config, copies):
    """`state_copies` (what `check_memory` multiplies the parameters by) is what a model's flat buffers and its
    updater allocate, measured by tracemalloc; the L2 mask is built only where L2 or weight decay reads it."""
    import tracemalloc

    from mpitrain.nn.flat import FlatModel
    from mpitrain.nn.updaters import state_copies
    optimizer = OptimizerConfig(**config)
    assert state_copies(optimizer) == copies
    create_updater(optimizer, np.zeros(8, np.float32), np.ones(8, np.float32))  # its kernel loaded, untraced
    n = 1_000_000
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        model = FlatModel([("dense/W", (1000, 900)), ("dense/b", (100_000,))], [], np)
        updater = create_updater(optimizer, model.params, lambda: model.decay_mask)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert round(held / (4 * n), 2) == copies, held
    decoupled = optimizer.type == "adamw" and optimizer.weight_decay  # Adam and SGD ignore weight_decay
    assert ("decay_mask" in vars(model)) == bool(optimizer.l2 or decoupled)
    if updater.decay is not None:
        assert updater.decay[:900_000].min() == updater.decay.max() == np.float32(1e-4) and updater.decay[-1] == 0
