"""Threshold encoding kernels for `sharing` mode, behind one dispatch on the array type.

numpy arrays run the numba CPU kernels (`cpu`); CUDA arrays (cupy, anything with
`__cuda_array_interface__`, numba device arrays) run the numba-CUDA kernels (`cuda`), which
are imported, with numba.cuda and cupy, only when such an array arrives. `message` defines the
int32 message format and the steps all implementations share; `reference` is the plain numpy
version the tests compare them with.

    message = threshold_encode(residual, tau)   # the residual keeps what was not sent
    threshold_decode(message, update)           # update += +-tau where the message says
"""
from __future__ import annotations

import numpy as np

from . import message as _message
from .message import MAX_ELEMENTS, NaNResidual, check_size  # noqa: F401  (public: the int32 size limit)
from .message import capacity as message_capacity

__all__ = ["threshold_encode", "threshold_decode", "bitmap_encode", "bitmap_decode", "clip_residual",
           "add_to_residual", "warm_up", "message_count", "message_encoding", "check_size", "MAX_ELEMENTS",
           "NaNResidual", "implementation", "message_capacity"]


def implementation(array):
    """The kernels for an array's device: `cpu` for numpy arrays, `cuda.DEFAULT` for CUDA arrays."""
    if isinstance(array, np.ndarray):
        from . import cpu
        return cpu
    if hasattr(array, "__cuda_array_interface__") or getattr(array, "__cuda_ndarray__", False):
        from .cuda import DEFAULT
        return DEFAULT
    raise TypeError(f"expected a numpy or CUDA array, got {type(array).__module__}.{type(array).__name__}")


def threshold_encode(residual, tau: float, encoding: str = "auto", out=None):
    """Send every |r_i| >= tau (`encoding`: auto, sparse or bitmap); subtracts sign*tau in place. The message is
    the first values of `out` when given (int32, `message_capacity(residual.size, encoding)` long)."""
    return _message.encode(implementation(residual), residual, tau, encoding, out)


def threshold_decode(message, out, sign: float = 1.0) -> None:
    """Add sign*tau*(+1/-1) to `out` for each element a sparse or bitmap message sends."""
    _message.decode(implementation(out), message, out, sign)


def bitmap_encode(residual, tau: float):
    """`threshold_encode` with a bitmap body whatever the count."""
    return threshold_encode(residual, tau, "bitmap")


def bitmap_decode(message, out, sign: float = 1.0) -> None:
    """`threshold_decode` for a message that must have a bitmap body."""
    if message_encoding(message) != "bitmap":
        raise ValueError("bitmap_decode got a sparse message; use threshold_decode")
    threshold_decode(message, out, sign)


def clip_residual(residual, limit: float) -> None:
    """Clip the residual in place to [-limit, limit]."""
    _message.clip(implementation(residual), residual, limit)


def add_to_residual(residual, update, limit: float | None = None) -> None:
    """residual += update, then clipped to [-limit, limit] unless limit is None; one pass, in place."""
    _message.accumulate(implementation(residual), residual, update, limit)


def warm_up(like) -> None:
    """Run each sharing kernel once on a few elements of `like`'s dtype and device, so a run's first
    step is not charged for loading them (numba's first CPU call takes about 0.5 s; CUDA kernels
    compile at their first launch)."""
    residual = like[:2 * _message.BITS_PER_WORD].copy()
    residual[...] = 1
    add_to_residual(residual, residual.copy(), 2.0)
    for encoding in ("sparse", "bitmap"):
        threshold_decode(threshold_encode(residual, 1.0, encoding), residual)


def message_count(message) -> int:
    """How many elements a message sends."""
    return _message.read_header(implementation(message), message)[0]


def message_encoding(message) -> str:
    """`sparse` or `bitmap`."""
    kind = _message.read_header(implementation(message), message)[3]
    return next(name for name, value in _message.ENCODINGS.items() if value == kind)
