"""Arithmetic between a batch and a vector that numpy's broadcasting ufuncs would do with a buffer allocated per
call (numpy 2 takes an 8192-element buffer for a broadcast operand, 32 KB of float32, every step).

    scale_rows(values, scale, out)     # out[r, :] = values[r, :] * scale[r]   (a mean over each row's valid steps)

A vector added to every row is `kernels.activations.bias_activation(z, b, "none", out)`. `values` and `out` are
2-D (rows, k), C-contiguous; `out` may be `values`. Nothing is allocated. numpy arrays run the numba kernel, other
arrays (cupy) the reference.
"""
from __future__ import annotations

from numba import njit, prange

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference


@njit(parallel=True, cache=True)
def _scale_rows_cpu(values, scale, out):
    for r in prange(values.shape[0]):
        s = scale[r]
        for k in range(values.shape[1]):
            out[r, k] = values[r, k] * s


@numpy_or_reference("scale_rows_reference")
def scale_rows(values, scale, out) -> None:
    """out[r, :] = values[r, :] * scale[r] for 2-D `values`; `out` may be `values`."""
    _scale_rows_cpu(values, scale, out)


def scale_rows_reference(values, scale, out) -> None:
    array_module(values).multiply(values, scale[:, None], out=out)
