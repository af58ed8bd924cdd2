"""Compile the recurrent layers' numba-CUDA kernels (kernels/recurrent_cuda.py) to PTX for a Hopper GPU without one, so
that a typing error shows here and not in a GPU lease. The CUDA simulator runs kernels as Python and types nothing;
this types and compiles them, with the float32 and float64 signatures the layers launch them with.

    pip install -e '.[gpu]'     # numba-cuda with NVVM (no driver needed)
    python -m mpitrain.testing.cuda_compile

numba-cuda asks the current device for its compute capability when it compiles a device function, even for PTX of
a named one; without a GPU that raises, so this answers for the device (capability CC) while it compiles.
"""
from __future__ import annotations

import sys

from numba import cuda, types

CC = (9, 0)  # the H100 and H200


class _Hopper:
    compute_capability = CC


def signatures(dtype) -> dict:
    """{kernel name: argument types} as the layers launch them (C-contiguous workspace arrays of `dtype`)."""
    array3, array2, array1 = (types.Array(dtype, n, "C") for n in (3, 2, 1))
    padded, step = types.Array(types.boolean, 3, "C"), types.int64
    return {"_lstm_forward": (array3, array2, array3, array3, array3, padded, step, step, step),
            "_lstm_backward": (array3, array3, array3, array2, array2, array3, array2, array2, padded, step, step),
            "_gru_forward": (array3, array2, array1, array3, array3, padded, step, step, step),
            "_gru_backward": (array3, array3, array3, array2, array3, array3, array2, padded, step, step)}


def main() -> int:
    import numba.cuda.api
    import numba.cuda.dispatcher
    numba.cuda.api.get_current_device = numba.cuda.dispatcher.get_current_device = _Hopper
    from mpitrain.kernels import recurrent_cuda
    for dtype in (types.float32, types.float64):
        for name, signature in signatures(dtype).items():
            ptx, _ = cuda.compile_ptx(getattr(recurrent_cuda, name).py_func, signature, cc=CC)
            print(f"ok {name} ({dtype}): {len(ptx)} bytes of PTX")
    return 0


if __name__ == "__main__":
    sys.exit(main())
