"""RBM statistics against exact expectations computed by enumerating every state of tiny RBMs."""
import itertools
import math

import numpy as np
import pytest

from mpitrain.nn.rbm import RBM


def states(n):
    """All 2^n binary vectors, one per row."""
    return np.array(list(itertools.product([0.0, 1.0], repeat=n)))


def tiny_rbm(n_visible, n_hidden, seed=3, scale=1.0, **options):
    rbm = RBM(n_visible, n_hidden, np, dtype="float64", **options)
    rng = np.random.default_rng(seed)
    rbm.params[...] = rng.normal(0, scale, size=rbm.n_params)  # large enough that mistakes show
    return rbm


def conditional(probs, values):
    """p(values | probs) for independent Bernoulli units: rows of probs x rows of values."""
    return np.prod(np.where(values[None] == 1, probs[:, None], 1 - probs[:, None]), axis=2)


def exact_cd_gradient(rbm, data, k):
    """The expectation of the CD-k estimate (sampled visible units), by enumeration of all states."""
    v_all, h_all = states(rbm.n_visible), states(rbm.n_hidden)
    p_v_given_h = conditional(rbm.visible_mean(h_all), v_all)  # (2^H, 2^V)
    p_h_given_v = conditional(rbm.hidden_probs(v_all), h_all)  # (2^V, 2^H)
    p_h0 = conditional(rbm.hidden_probs(data), h_all)  # (rows, 2^H)
    p_vk = p_h0 @ p_v_given_h
    for _ in range(k - 1):
        p_vk = p_vk @ p_h_given_v @ p_v_given_h
    return negative_gradient(rbm, data, p_vk.mean(axis=0), v_all)


def negative_gradient(rbm, data, p_model_v, v_all):
    """-(<.>_data - <.>_model), the model side given as a distribution over all visible states."""
    ph_data, ph_all = rbm.hidden_probs(data), rbm.hidden_probs(v_all)
    dW = (v_all.T * p_model_v) @ ph_all - data.T @ ph_data / len(data)
    db = p_model_v @ v_all - data.mean(axis=0)
    dc = p_model_v @ ph_all - ph_data.mean(axis=0)
    return np.concatenate([dW.ravel(), db, dc])


@pytest.mark.parametrize("n_visible, n_hidden, k", [(2, 2, 1), (3, 2, 1), (4, 3, 1), (3, 3, 2)])
def test_cd_gradient_equals_the_exact_expectation(n_visible, n_hidden, k):
    rbm = tiny_rbm(n_visible, n_hidden, cd_k=k, sample_visible=True)
    patterns = states(n_visible)[[0, 1, -1]]
    data = np.repeat(patterns, 20000, axis=0)  # one big batch: the Monte Carlo mean of the estimate
    rbm.train_batch(data, np.random.default_rng(0))
    exact = exact_cd_gradient(rbm, patterns, k)
    np.testing.assert_allclose(rbm.grads, exact, atol=0.012)
    assert np.abs(exact).max() > 0.1  # the comparison is not of two near-zero vectors


def test_mean_field_reconstruction_cd1_equals_its_exact_expectation():
    """With mean-field visible units (the default) v1 = E[v | h0]: enumerate h0 only."""
    rbm = tiny_rbm(3, 2)
    patterns = states(3)[[1, 2, 6]]
    data = np.repeat(patterns, 20000, axis=0)
    rbm.train_batch(data, np.random.default_rng(1))
    h_all = states(2)
    p_h0 = conditional(rbm.hidden_probs(patterns), h_all).mean(axis=0)  # (2^H,)
    v1 = rbm.visible_mean(h_all)  # one reconstruction per hidden state
    ph1 = rbm.hidden_probs(v1)
    dW = (v1.T * p_h0) @ ph1 - patterns.T @ rbm.hidden_probs(patterns) / 3
    db = p_h0 @ v1 - patterns.mean(axis=0)
    dc = p_h0 @ ph1 - rbm.hidden_probs(patterns).mean(axis=0)
    np.testing.assert_allclose(rbm.grads, np.concatenate([dW.ravel(), db, dc]), atol=0.012)


def test_persistent_chains_sample_the_model_distribution():
    """PCD's negative phase, with parameters held still, averages to the exact model expectation."""
    rbm = tiny_rbm(3, 2, seed=6, scale=2.0, persistent=True, sample_visible=True)
    patterns = states(3)[[0, 7]]
    data = np.repeat(patterns, 2000, axis=0)
    rng = np.random.default_rng(2)
    for _ in range(20):  # burn in the fantasy particles
        rbm.train_batch(data, rng)
    grads = [rbm.grads.copy() for _ in range(60) if rbm.train_batch(data, rng) is not None]
    v_all = states(3)
    p_model = np.exp(-rbm.free_energy(v_all))
    exact = negative_gradient(rbm, patterns, p_model / p_model.sum(), v_all)
    np.testing.assert_allclose(np.mean(grads, axis=0), exact, atol=0.012)
    assert np.abs(exact_cd_gradient(rbm, patterns, 1) - exact).max() > 0.1  # CD-1 would fail this test


def test_free_energy_by_hand():
    rbm = RBM(2, 2, np, dtype="float64")
    rbm.W[...] = [[1.0, -1.0], [2.0, 0.0]]
    rbm.b[...] = [0.5, -1.0]
    rbm.c[...] = [0.0, 1.0]
    # v = [1, 0]: -F = b.v + sum_j log(1 + exp(c_j + v.W_j)) = 0.5 + log(1 + e^1) + log(1 + e^0)
    assert rbm.free_energy(np.array([[1.0, 0.0]]))[0] == pytest.approx(-(0.5 + math.log(1 + math.e) + math.log(2)))
    gaussian = RBM(2, 2, np, visible="gaussian", dtype="float64")
    gaussian.params[...] = rbm.params
    # v = [0.5, 2]: |v - b|^2 / 2 = (0 + 9) / 2; pre-activations c + v W = [4.5, 0.5]
    assert gaussian.free_energy(np.array([[0.5, 2.0]]))[0] == pytest.approx(
        4.5 - math.log(1 + math.exp(4.5)) - math.log(1 + math.exp(0.5)))


def test_free_energy_is_minus_log_of_the_summed_boltzmann_weights():
    rbm = tiny_rbm(3, 3)
    v_all, h_all = states(3), states(3)
    energy = -(v_all @ rbm.b)[:, None] - (h_all @ rbm.c)[None] - v_all @ rbm.W @ h_all.T
    np.testing.assert_allclose(rbm.free_energy(v_all), -np.log(np.exp(-energy).sum(axis=1)))


def test_pseudo_log_likelihood_by_enumeration():
    rbm = tiny_rbm(4, 3)
    v_all = states(4)
    p = np.exp(-rbm.free_energy(v_all))
    index = {tuple(v): i for i, v in enumerate(v_all)}
    data = v_all[[3, 9, 14]]
    expected = 0.0
    for v in data:
        for i in range(4):
            flipped = v.copy()
            flipped[i] = 1 - v[i]
            expected += math.log(p[index[tuple(v)]] / (p[index[tuple(v)]] + p[index[tuple(flipped)]]))
    assert rbm.pseudo_log_likelihood(data, chunk=3) == pytest.approx(expected)


def test_sparsity_target_pulls_hidden_activity_toward_it():
    rbm = tiny_rbm(4, 3, sparsity_target=0.05, sparsity_cost=1.0)
    plain = tiny_rbm(4, 3)
    data = np.repeat(states(4), 10, axis=0)
    rbm.train_batch(data, np.random.default_rng(0))
    plain.train_batch(data, np.random.default_rng(0))
    q = rbm.hidden_probs(data).mean(axis=0)
    np.testing.assert_allclose(rbm.dc - plain.dc, q - 0.05)  # same random numbers: only the penalty differs
    np.testing.assert_allclose(rbm.dW - plain.dW, np.outer(data.mean(axis=0), q - 0.05))


def test_gaussian_rbm_learns_to_reconstruct():
    rng = np.random.default_rng(0)
    basis = rng.normal(size=(2, 6))
    data = rng.normal(size=(512, 2)) @ basis + 0.1 * rng.normal(size=(512, 6))
    data = (data - data.mean(axis=0)) / data.std(axis=0)  # unit variance, as the Gaussian units assume
    rbm = RBM(6, 16, np, visible="gaussian", dtype="float64")
    rbm.init_params(0, data.mean(axis=0))
    before = rbm.reconstruction_error(data)
    for _ in range(200):
        rbm.train_batch(data, rng)
        rbm.params -= 0.05 * rbm.grads
    assert rbm.reconstruction_error(data) < 0.2 * before
