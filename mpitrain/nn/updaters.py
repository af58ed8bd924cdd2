"""Updaters on the flat buffers: `delta(grads, params)` returns the step to ADD to the parameters.

The learning rate is already in the delta, so a synchronizer can share updates (not raw
gradients) when it wants to. All state lives in ONE flat buffer `state`, so averaging
updater state across ranks is one collective too. L2 applies to weights only (the
model's `decay_mask`).
"""
from __future__ import annotations

from mpitrain.backend import array_module
from mpitrain.kernels.sgd import momentum_step


class Updater:
    """Base: L2 on the weights, a preallocated delta buffer, and state slots in one buffer.

    `slot_names` says what each slot of `state` holds, in order: with the updater's type it is
    what a checkpoint's updater state means (a resume under another updater is refused).
    """

    slot_names: tuple = ()

    def __init__(self, config, params, decay_mask):
        xp = array_module(params)
        self.config = config
        self.n = params.size
        self.n_slots = len(self.slot_names)
        self.state = xp.zeros(self.n_slots * self.n, dtype=params.dtype)
        self.slots = [self.state[i * self.n:(i + 1) * self.n] for i in range(self.n_slots)]
        self.out = xp.empty_like(params)
        self.decay = decay_mask * config.l2  # L2 coefficient per parameter: l2 on weights, 0 on biases
        self.g = xp.empty_like(params) if config.l2 else None
        self.iteration = 0
        self.lr = config.lr

    def start_epoch(self, epoch: int) -> None:
        """Apply the per-epoch learning-rate decay (the same on every rank)."""
        self.lr = self.config.lr * self.config.lr_decay ** epoch

    def delta(self, grads, params):
        """The step to add to `params` for gradient `grads` (the returned buffer is reused)."""
        self.iteration += 1
        g = grads
        if self.g is not None:
            g = array_module(params).multiply(params, self.decay, out=self.g)
            g += grads
        return self._delta(g, self.out)

    def _delta(self, g, out):
        raise NotImplementedError


class SGD(Updater):
    """Plain SGD, momentum v = mu v - lr g, or Nesterov momentum (delta = mu v - lr g).

    With momentum, one fused kernel does the whole step (L2 included): the default
    updater's step is then one pass over the buffers instead of five.
    """

    def __init__(self, config, params, decay_mask):
        self.slot_names = ("velocity",) if config.momentum else ()
        super().__init__(config, params, decay_mask)
        if self.n_slots:  # load the fused kernel now: numba's first call takes about 0.5 s, not the first step's
            tiny = array_module(params).zeros(4, dtype=params.dtype)
            momentum_step(tiny, tiny, tiny, tiny, 0.0, 0.0, False, tiny)

    def delta(self, grads, params):
        if not self.config.momentum:
            return super().delta(grads, params)
        self.iteration += 1
        v = self.slots[0]
        out = self.out if self.config.nesterov else v
        momentum_step(v, grads, params, self.decay, self.lr, self.config.momentum, self.config.nesterov, out)
        return out

    def _delta(self, g, out):
        array_module(g).multiply(g, -self.lr, out=out)
        return out


class AdaGrad(Updater):
    """h += g^2; delta = -lr g / (sqrt(h) + eps)."""

    slot_names = ("sum_of_squared_gradients",)

    def _delta(self, g, out):
        xp, h = array_module(g), self.slots[0]
        self._accumulate(h, g)
        xp.divide(g, xp.sqrt(h) + self.config.eps, out=out)
        out *= -self.lr
        return out

    def _accumulate(self, h, g) -> None:
        h += g * g


class RMSProp(AdaGrad):
    """AdaGrad with a decaying average: h = rho h + (1 - rho) g^2."""

    slot_names = ("mean_squared_gradient",)

    def _accumulate(self, h, g) -> None:
        h *= self.config.rho
        h += (1 - self.config.rho) * g * g


class Adam(Updater):
    """Adam with bias correction: delta = -lr m_hat / (sqrt(v_hat) + eps)."""

    slot_names = ("first_moment", "second_moment")

    def _delta(self, g, out):
        c, xp, t = self.config, array_module(g), self.iteration
        m, v = self.slots
        m *= c.beta1
        m += (1 - c.beta1) * g
        v *= c.beta2
        v += (1 - c.beta2) * g * g
        step = self.lr * (1 - c.beta2 ** t) ** 0.5 / (1 - c.beta1 ** t)
        xp.divide(m, xp.sqrt(v) + c.eps * (1 - c.beta2 ** t) ** 0.5, out=out)
        out *= -step
        return out


UPDATERS = {"sgd": SGD, "adagrad": AdaGrad, "rmsprop": RMSProp, "adam": Adam}


def create_updater(config, params, decay_mask) -> Updater:
    """The updater named by `config.type` (an OptimizerConfig) for a flat parameter buffer."""
    return UPDATERS[config.type](config, params, decay_mask)
