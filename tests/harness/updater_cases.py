"""Inputs for the fused updater kernels' tests, on the CPU and on a GPU: each updater's kernel,
its state slots and its scalar arguments at step t, and random buffers (strided or not)."""
from __future__ import annotations

import numpy as np

STEPS = {
    "sgd": ("sgd_step", 0, lambda t: (0.05,)),
    "momentum": ("momentum_step", 1, lambda t: (0.05, 0.9, False)),
    "nesterov": ("momentum_step", 1, lambda t: (0.05, 0.9, True)),
    "adagrad": ("adagrad_step", 1, lambda t: (0.05, 1e-8)),
    "rmsprop": ("rmsprop_step", 1, lambda t: (0.01, 0.9, 1e-8)),
    "adam": ("adam_step", 2, lambda t: (0.001, 0.9, 0.999, 1e-8, t)),
}


def step_inputs(rng, n, dtype, slots, l2, strided):
    """Random state slots (>= 0, as sums of squares are), g, p, decay (None without L2) and out; every
    other element of buffers twice as long when `strided`."""
    def array(values):
        if not strided:
            return values.astype(dtype)
        buffer = np.full(2 * n, np.nan, dtype=dtype)
        buffer[::2] = values
        return buffer[::2]
    state = [array(rng.random(n)) for _ in range(slots)]
    g, p = array(rng.normal(size=n)), array(rng.normal(size=n))
    decay = array((rng.random(n) < 0.8) * 1e-2) if l2 else None
    return state, g, p, decay, array(np.zeros(n))

