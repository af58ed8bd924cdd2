"""numpy or cupy, whichever owns an array, for code written once against `xp`."""
from __future__ import annotations

import numpy as np


def array_module(array):
    """numpy or cupy, whichever owns `array` (cupy.get_array_module without importing cupy for numpy)."""
    if isinstance(array, (np.ndarray, np.generic)):
        return np
    import cupy
    return cupy.get_array_module(array)
