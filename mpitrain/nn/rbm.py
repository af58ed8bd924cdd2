"""Restricted Boltzmann machines trained by contrastive divergence (CD-k) or persistent CD.

An RBM is a `FlatModel` (`mpitrain.nn.flat`) like `Sequential`: ONE flat parameter buffer
(W, visible bias b, hidden bias c) and ONE flat gradient buffer, so the same updaters (momentum, weight decay as L2 on
W) and synchronizers (`allreduce`, `averaging`, `sharing`) apply unchanged. `grads` hold
the gradient of a loss to MINIMIZE: minus the CD estimate of the log-likelihood gradient,

    dW = -(<v h>_data - <v h>_model) / n,   db = -(<v>_data - <v>_model),   dc = -(<h>_data - <h>_model)

where the model terms come from the end of a k-step Gibbs chain started at the data (CD-k)
or at persistent fantasy particles kept between batches (PCD, Tieleman 2008).

Visible units are Bernoulli (inputs in [0, 1], used as probabilities) or Gaussian with unit
variance (standardized real inputs): E(v, h) = sum (v - b)^2 / 2 - c.h - v.W.h. Hidden
units are Bernoulli. The optional sparsity target adds cost * (q - target) to the hidden
pre-activation gradient, q being the batch mean of each hidden unit's probability (Lee et
al. 2008; Hinton's practical guide, section 11).
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.nn.flat import FlatModel, flat_views
from mpitrain.nn.losses import sigmoid

VISIBLE_UNITS = ("bernoulli", "gaussian")


def softplus(x):
    """log(1 + exp(x)), stable for large |x|."""
    xp = array_module(x)
    return xp.logaddexp(0, x)


class RBM(FlatModel):
    """One RBM layer: `n_visible` -> `n_hidden`, its flat buffers, CD-k/PCD statistics and monitors."""

    def __init__(self, n_visible: int, n_hidden: int, xp, visible: str = "bernoulli", cd_k: int = 1,
                 persistent: bool = False, sample_visible: bool = False, sparsity_target: float = 0.0,
                 sparsity_cost: float = 0.0, dtype="float32"):
        if visible not in VISIBLE_UNITS:
            raise ValueError(f"visible units {visible!r}, expected one of {VISIBLE_UNITS}")
        self.n_visible, self.n_hidden, self.xp, self.visible = n_visible, n_hidden, xp, visible
        self.cd_k, self.persistent, self.sample_visible = cd_k, persistent, sample_visible
        self.sparsity_target, self.sparsity_cost = sparsity_target, sparsity_cost
        super().__init__([("W", (n_visible, n_hidden)), ("b_visible", (n_visible,)), ("c_hidden", (n_hidden,))], [],
                         xp, dtype)  # weight decay on W, never on the biases; no running statistics
        self.W, self.b, self.c = flat_views(self.params, self.layout)
        self.dW, self.db, self.dc = flat_views(self.grads, self.layout)
        self.chain = None  # PCD: the fantasy particles' visible states

    def init_params(self, seed: int, visible_mean) -> None:
        """W ~ N(0, 0.01^2) drawn on the host from `seed`; hidden biases 0; visible biases from the data.

        `visible_mean` is the mean of each visible unit over the training data: the visible
        bias starts at its logit (Bernoulli) or at the mean itself (Gaussian), so the
        RBM starts out reconstructing the average input (Hinton's guide, section 8).
        """
        rng = np.random.default_rng(seed)
        self.W[...] = self.xp.asarray(rng.normal(0.0, 0.01, size=self.W.shape), dtype=self.params.dtype)
        self.c[...] = 0
        mean = self.xp.asarray(visible_mean, dtype=self.params.dtype)
        if self.visible == "bernoulli":
            p = self.xp.clip(mean, 1e-3, 1 - 1e-3)
            mean = self.xp.log(p / (1 - p))
        self.b[...] = mean
        self.chain = None

    def hidden_probs(self, v):
        """p(h_j = 1 | v) for each row of v: the RBM's mean activation, what the next layer sees."""
        return sigmoid(v @ self.W + self.c)

    def visible_mean(self, h):
        """E[v | h]: sigmoid(h W^T + b) (Bernoulli) or h W^T + b (Gaussian)."""
        x = h @ self.W.T + self.b
        return sigmoid(x) if self.visible == "bernoulli" else x

    def sample_visible_given(self, h, rng):
        mean = self.visible_mean(h)
        if self.visible == "bernoulli":
            return (rng.random(mean.shape, dtype=mean.dtype) < mean).astype(mean.dtype)
        return mean + rng.standard_normal(mean.shape, dtype=mean.dtype)

    def free_energy(self, v):
        """F(v) = -log sum_h exp(-E(v, h)) per row: -b.v (Bernoulli) or |v - b|^2 / 2 (Gaussian), minus
        sum_j softplus(c_j + v.W_j)."""
        visible_term = -(v @ self.b) if self.visible == "bernoulli" else 0.5 * ((v - self.b) ** 2).sum(axis=1)
        return visible_term - softplus(v @ self.W + self.c).sum(axis=1)

    def train_batch(self, v0, rng):
        """Fill `grads` with the CD-k (or PCD) estimate for batch `v0`; return its summed squared
        reconstruction error (data against E[v | h] for h sampled from p(h | data)) as a 0-d
        array of the backend: a GPU step never waits for a copy to the host."""
        xp, n = self.xp, len(v0)
        ph0 = self.hidden_probs(v0)
        h0 = bernoulli(ph0, rng)
        reconstruction = self.visible_mean(h0)
        error = ((v0 - reconstruction) ** 2).sum()
        if self.persistent:
            if self.chain is None or len(self.chain) != n:
                self.chain = v0.copy()
            h = bernoulli(self.hidden_probs(self.chain), rng)
        else:
            h = h0
        for step in range(self.cd_k):
            if step == 0 and not self.persistent and not self.sample_visible:
                vk = reconstruction
            else:
                vk = self.sample_visible_given(h, rng) if self.sample_visible else self.visible_mean(h)
            phk = self.hidden_probs(vk)
            if step + 1 < self.cd_k:
                h = bernoulli(phk, rng)
        if self.persistent:
            self.chain = vk
        xp.matmul(vk.T, phk, out=self.dW)
        self.dW -= v0.T @ ph0
        self.dW /= n
        self.db[...] = vk.mean(axis=0) - v0.mean(axis=0)
        self.dc[...] = phk.mean(axis=0) - ph0.mean(axis=0)
        if self.sparsity_cost:
            penalty = self.sparsity_cost * (ph0.mean(axis=0) - self.sparsity_target)
            self.dc += penalty
            self.dW += xp.outer(v0.mean(axis=0), penalty)
        return error

    def reconstruction_error(self, v) -> float:
        """Summed squared error of the mean-field reconstruction E[v | p(h | v)] (deterministic)."""
        return float(((v - self.visible_mean(self.hidden_probs(v))) ** 2).sum())

    def pseudo_log_likelihood(self, v, chunk: int = 16) -> float:
        """Summed log PL(v) = sum_i log p(v_i | v_-i) over the rows of `v` (Bernoulli visible units).

        p(v_i = 1 | v_-i) = sigmoid(F(v_i = 0) - F(v_i = 1)); for inputs in (0, 1) the
        log-probability is the cross-entropy v_i log p_i + (1 - v_i) log(1 - p_i). Costs
        n_visible times a hidden pass, so it is for small RBMs.
        """
        if self.visible != "bernoulli":
            raise ValueError("the pseudo-log-likelihood is defined here for Bernoulli visible units only")
        x = v @ self.W + self.c
        total = 0.0
        for start in range(0, self.n_visible, chunk):
            i = slice(start, min(start + chunk, self.n_visible))
            w = self.W[i]  # (chunk, H)
            off = x[:, None, :] - v[:, i, None] * w[None]  # pre-activations with v_i = 0
            logit = self.b[i] + (softplus(off + w[None]) - softplus(off)).sum(axis=2)
            total += float((v[:, i] * -softplus(-logit) + (1 - v[:, i]) * -softplus(logit)).sum())
        return total


def bernoulli(p, rng):
    """A 0/1 sample of independent Bernoulli units with probabilities `p`."""
    return (rng.random(p.shape, dtype=p.dtype) < p).astype(p.dtype)
