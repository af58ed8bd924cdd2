"""SGD with momentum and L2 in one pass over the flat buffers (the default updater's hot loop).

With numpy ops the step reads and writes the 4 buffers five times; fused, once. The
numpy reference (any array module, so cupy too) is what tests compare the numba kernel with.

    v = mu * v - lr * (g + decay * p)        decay: l2 on weights, 0 on biases
    out = v, or mu * v - lr * (g + decay * p) with Nesterov
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


def momentum_step_reference(v, g, p, decay, lr: float, mu: float, nesterov: bool, out) -> None:
    step = g + decay * p
    step *= -lr
    v *= mu
    v += step
    if nesterov:
        out[...] = mu * v + step
    else:
        out[...] = v


@njit(parallel=True, cache=True, fastmath=False)
def _momentum_step_cpu(v, g, p, decay, lr, mu, nesterov, out):
    for i in prange(v.size):
        step = -lr * (g[i] + decay[i] * p[i])
        vi = mu * v[i] + step
        v[i] = vi
        out[i] = mu * vi + step if nesterov else vi


def momentum_step(v, g, p, decay, lr: float, mu: float, nesterov: bool, out) -> None:
    """One momentum step into `v` (in place) and `out`; numba on numpy arrays, the reference elsewhere."""
    if isinstance(v, np.ndarray):
        dtype = v.dtype.type
        _momentum_step_cpu(v, g, p, decay, dtype(lr), dtype(mu), nesterov, out)
    else:
        momentum_step_reference(v, g, p, decay, lr, mu, nesterov, out)
