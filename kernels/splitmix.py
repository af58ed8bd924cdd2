"""splitmix64's finalizer (Steele, Lea and Flood 2014) in plain numpy uint64 arithmetic, and its constants.

One value inside numba kernels (`kernels.activations` registers `splitmix64` for them: dropout's keyed bits), or a
whole uint64 array from Python (the ETL's hashed ids, `mpitrain.data.encoding`). This module imports no numba: the
ETL's, `info`'s and `score`'s processes, and Spark's Python workers, hash without loading it.
"""
from __future__ import annotations

import numpy as np

GOLDEN, MIX1, MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
S30, S27, S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def splitmix64(z):
    """A bijective mix of uint64s into well-spread bits (wrapping arithmetic): a numpy uint64 or array of them."""
    z = (z ^ (z >> S30)) * MIX1
    z = (z ^ (z >> S27)) * MIX2
    return z ^ (z >> S31)
