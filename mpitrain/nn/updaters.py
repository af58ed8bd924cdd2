"""Updaters on the flat buffers: `delta(grads, params)` returns the step to ADD to the parameters.

The learning rate is already in the delta, so a synchronizer can share updates (not raw
gradients) when it wants to; `lr` is the rate of the step, which the training loop sets before each step from the
run's schedule (`mpitrain.nn.schedules`). All state lives in ONE flat buffer `state`, so averaging
updater state across ranks is one collective too. L2 applies to weights only (the
model's `decay_mask`). Each updater's step is ONE pass over the buffers, L2 included
(`mpitrain.kernels.updaters`: a numba kernel on numpy arrays): it updates the state in
place and writes the delta into a preallocated buffer, so a step allocates nothing.
"""
from __future__ import annotations

from mpitrain.base.arrays import array_module
from mpitrain.kernels.updaters import (
    adagrad_step,
    adam_step,
    adam_variant_step,
    momentum_step,
    nadam_momentum,
    nadam_step,
    rmsprop_step,
    sgd_step,
)


class Updater:
    """Base: the state slots in one buffer, a preallocated delta buffer, L2 on the weights.

    `slot_names` says what each slot of `state` holds, in order: with the updater's type it is
    what a checkpoint's updater state means (a resume under another updater is refused).
    Subclasses implement `_step`, one call of their fused kernel. `clip_norm` (`train.clip_norm`; 0: none) is
    the largest L2 norm of a step's gradient: the synchronizer clips to it before the step
    (`mpitrain.parallel.sync.base.clip_gradients`).
    """

    slot_names: tuple = ()

    def __init__(self, config, params, decay_mask, clip_norm: float = 0.0):
        """`decay_mask` is the model's (`mpitrain.nn.flat`), or a function giving it: called only where L2 or
        weight decay needs it, so a run without either never builds a copy of the parameters' size for it."""
        xp = array_module(params)
        self.slot_names = self.slots_of(config)
        self.config, self.clip_norm = config, clip_norm
        self.n = params.size
        self.n_slots = len(self.slot_names)
        self.state = xp.zeros(self.n_slots * self.n, dtype=params.dtype)
        self.slots = [self.state[i * self.n:(i + 1) * self.n] for i in range(self.n_slots)]
        self.out = xp.empty_like(params)
        mask = (decay_mask() if callable(decay_mask) else decay_mask) if self.masks(config) else None
        # L2 coefficient per parameter (l2 on weights, 0 on biases); None: no L2, the kernels skip it
        self.decay = mask * config.l2 if config.l2 else None
        # decoupled weight decay per parameter (AdamW's, on weights only, as L2); None: none
        self.wd = mask * config.weight_decay if self.decoupled and config.weight_decay else None
        self.iteration = 0
        self.lr = config.lr
        self._load_kernel(xp, params.dtype)

    def _load_kernel(self, xp, dtype) -> None:
        """Run the step once on tiny zero arrays, so numba's first call (about 0.5 s) is not the first step's."""
        tiny = xp.zeros(4, dtype=dtype)
        decay, wd = (None if mask is None else xp.zeros(4, dtype=mask.dtype) for mask in (self.decay, self.wd))
        self._step([tiny] * self.n_slots, tiny, tiny, decay, wd, tiny, 1)

    #: whether a parameter without gradient (and without L2) keeps its value: then an embedding table's untouched
    #: rows need no step (`mpitrain.parallel.sync.base.apply_update`)
    steps_rows_alone = False
    #: whether `optimizer.weight_decay` is this updater's (decoupled from the gradient: AdamW)
    decoupled = False

    @classmethod
    def slots_of(cls, config) -> tuple:
        """The names of the state slots an updater of `config` keeps."""
        return cls.slot_names

    @classmethod
    def masks(cls, config) -> int:
        """How many per-parameter coefficient arrays an updater of `config` keeps: the L2 one, the weight decay
        one (0, 1 or 2)."""
        return bool(config.l2) + bool(cls.decoupled and config.weight_decay)

    def delta(self, grads, params, begin: int = 0):
        """The step to add to `params` for gradient `grads` (the returned buffer is reused): the whole flat buffer,
        or its part from `begin` on (`grads` and `params` are then that part)."""
        self.iteration += 1
        part = slice(begin, begin + params.size)
        decay, wd = (mask[part] if begin and mask is not None else mask for mask in (self.decay, self.wd))
        return self._step([slot[part] for slot in self.slots] if begin else self.slots, grads, params, decay, wd,
                          self.out[part] if begin else self.out, self.iteration)

    def rows_step(self, slots, grads, params, t: int):
        """The delta of parameters held apart from the flat buffer (a sharded table's touched rows, flattened), at
        step `t`: `slots` are this updater's state at those parameters, updated in place; no L2, no weight decay.
        Returns a new array (or one of `slots`)."""
        return self._step(slots, grads, params, None, None, array_module(grads).empty_like(grads), t)

    def _step(self, slots, grads, params, decay, wd, out, t):
        """Step `t` on these state slots, writing the delta into `out` (or a slot); returns the delta. `decay` is
        the L2 per parameter, `wd` the decoupled weight decay (None: none)."""
        raise NotImplementedError


class SGD(Updater):
    """Plain SGD (delta = -lr g), momentum v = mu v - lr g (delta = v), or Nesterov (delta = mu v - lr g)."""

    def __init__(self, config, params, decay_mask, clip_norm: float = 0.0):
        self.steps_rows_alone = not config.momentum
        super().__init__(config, params, decay_mask, clip_norm)

    @classmethod
    def slots_of(cls, config) -> tuple:
        return ("velocity",) if config.momentum else ()

    def row_delta(self, grads, out=None):
        """Plain SGD's step of rows without L2 (an embedding table's touched rows): -lr g, as `sgd_step` computes
        it, into `out` when given. Only where `steps_rows_alone`."""
        return array_module(grads).multiply(grads, -self.lr, out=out)

    def _step(self, slots, grads, params, decay, wd, out, t):
        c = self.config
        if not c.momentum:
            sgd_step(grads, params, decay, self.lr, out)
            return out
        v = slots[0]
        out = out if c.nesterov else v
        momentum_step(v, grads, params, decay, self.lr, c.momentum, c.nesterov, out)
        return out


class AdaGrad(Updater):
    """h += g^2; delta = -lr g / (sqrt(h) + eps)."""

    slot_names = ("sum_of_squared_gradients",)

    def _step(self, slots, grads, params, decay, wd, out, t):
        adagrad_step(slots[0], grads, params, decay, self.lr, self.config.eps, out)
        return out


class RMSProp(Updater):
    """AdaGrad with a decaying average: h = rho h + (1 - rho) g^2; delta = -lr g / (sqrt(h) + eps)."""

    slot_names = ("mean_squared_gradient",)

    def _step(self, slots, grads, params, decay, wd, out, t):
        c = self.config
        rmsprop_step(slots[0], grads, params, decay, self.lr, c.rho, c.eps, out)
        return out


class Adam(Updater):
    """Adam with bias correction: delta = -lr m_hat / (sqrt(v_hat) + eps) (`iteration` is t); with `amsgrad` the
    largest v_hat so far divides (Reddi et al. 2018), in a third slot."""

    @classmethod
    def slots_of(cls, config) -> tuple:
        return ("first_moment", "second_moment", *(("max_second_moment",) if config.amsgrad else ()))

    def _step(self, slots, grads, params, decay, wd, out, t):
        c = self.config
        if c.amsgrad or wd is not None:
            adam_variant_step(slots[0], slots[1], slots[2] if c.amsgrad else None, grads, params, decay, wd,
                              self.lr, c.beta1, c.beta2, c.eps, t, out)
        else:
            adam_step(slots[0], slots[1], grads, params, decay, self.lr, c.beta1, c.beta2, c.eps, t, out)
        return out


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019, PyTorch's AdamW): each step also takes
    lr weight_decay p from the weights (never biases or normalization scales, as `l2`), apart from the
    gradient's moments."""

    decoupled = True


class NAdam(Updater):
    """Adam with Nesterov momentum (Dozat 2016), PyTorch's NAdam: the momentum of step t is
    beta1 (1 - 0.96^(t momentum_decay) / 2), and its running product is computed from t (kept across steps, found
    again from the iteration after a resume)."""

    slot_names = ("first_moment", "second_moment")

    def __init__(self, config, params, decay_mask, clip_norm: float = 0.0):
        self.products = (0, 1.0)  # (t, the product of the momenta of steps 1..t)
        super().__init__(config, params, decay_mask, clip_norm)

    def _product(self, t: int) -> float:
        """The product of the momenta of steps 1..t, from the last one computed when it is t - 1 or t."""
        c = self.config
        done, product = self.products if self.products[0] <= t else (0, 1.0)
        for step in range(done + 1, t + 1):
            product *= nadam_momentum(c.beta1, c.momentum_decay, step)
        self.products = (t, product)
        return product

    def _step(self, slots, grads, params, decay, wd, out, t):
        c = self.config
        mu, mu_next = (nadam_momentum(c.beta1, c.momentum_decay, step) for step in (t, t + 1))
        product = self._product(t)
        nadam_step(slots[0], slots[1], grads, params, decay, self.lr, c.beta1, c.beta2, c.eps, mu, mu_next, product,
                   product * mu_next, t, out)
        return out


UPDATERS = {"sgd": SGD, "adagrad": AdaGrad, "rmsprop": RMSProp, "adam": Adam, "adamw": AdamW, "nadam": NAdam}


def create_updater(config, params, decay_mask, clip_norm: float = 0.0) -> Updater:
    """The updater named by `config.type` (an OptimizerConfig) for a flat parameter buffer; its gradients clipped to
    L2 norm `clip_norm` (0: not clipped). `decay_mask`: the model's, or a function giving it (`Updater`)."""
    return UPDATERS[config.type](config, params, decay_mask, clip_norm)


def state_copies(config) -> int:
    """How many arrays of the parameters' size a run of optimizer `config` holds: the values, the gradients, the
    updater's delta buffer and state slots, and its L2 and weight decay coefficients with the mask they are made of
    (what a rank's memory check counts: `mpitrain.nn.model.check_memory`)."""
    cls = UPDATERS[config.type]
    masks = cls.masks(config)
    return 3 + len(cls.slots_of(config)) + masks + bool(masks)
