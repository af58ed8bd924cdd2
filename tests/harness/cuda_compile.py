"""Compile the layers' numba-CUDA kernels (kernels/recurrent_cuda.py, activations_cuda.py, loss_cuda.py,
layernorm_cuda.py, embedding_cuda.py, im2col_cuda.py, pool_cuda.py, batchnorm_cuda.py, updaters_cuda.py) to PTX for a Hopper GPU without one, so that a typing error shows here and not in a GPU lease. The CUDA simulator runs kernels
as Python and types nothing; this types and compiles them, with the float32 and float64 signatures the layers
launch them with.

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
    """{(kernel module, kernel name): argument types} as the layers launch them (C-contiguous workspace arrays of
    `dtype`)."""
    array3, array2, array1 = (types.Array(dtype, n, "C") for n in (3, 2, 1))
    padded, step, flag, scalar = types.Array(types.boolean, 3, "C"), types.int64, types.boolean, dtype
    doubles, where = types.Array(types.float64, 1, "C"), types.Array(types.int32, 4, "C")
    array6, array4 = types.Array(dtype, 6, "C"), types.Array(dtype, 4, "C")
    return {("recurrent_cuda", "_lstm_forward"): (array3, array2, array3, array3, array3, padded, step, step, step),
            ("recurrent_cuda", "_lstm_backward"): (array3, array3, array3, array2, array2, array3, array2, array2,
                                                   padded, step, step),
            ("recurrent_cuda", "_gru_forward"): (array3, array2, array1, array3, array3, padded, step, step, step),
            ("recurrent_cuda", "_gru_backward"): (array3, array3, array3, array2, array3, array3, array2, padded,
                                                  step, step),
            ("activations_cuda", "_bias_activation"): (array2, array1, flag, step, flag, array2),
            ("activations_cuda", "_activation_backward"): (array2, array2, step, flag, array2),
            ("activations_cuda", "_dropout"): (array2, types.uint64, types.uint64, scalar, scalar, array2, array2),
            ("loss_cuda", "_cross_entropy"): (array2, types.Array(types.int32, 1, "C"), doubles, flag, array2,
                                              doubles),
            ("loss_cuda", "_smoothed"): (array2, types.Array(types.int32, 1, "C"), doubles, flag, types.float64,
                                         array2, doubles),
            ("loss_cuda", "_score"): (array2, types.Array(types.int32, 1, "C"), doubles, doubles),
            ("layernorm_cuda", "_forward"): (array2, array1, array1, types.float64, array2, array1, array2, step),
            ("layernorm_cuda", "_input_grad"): (array2, array2, step, array2, array2, array1, array1, flag, array2),
            ("layernorm_cuda", "_scale_grads"): (array2, array2, array1, array1),
            ("embedding_cuda", "_gather"): (array2, types.Array(types.int64, 1, "C"), types.Array(dtype, 2, "A")),
            ("embedding_cuda", "_scatter_add"): (array2, types.Array(types.int64, 1, "C"), types.Array(dtype, 2, "A")),
            ("im2col_cuda", "_im2col"): (array4, step, step, step, scalar, flag, array6),
            ("im2col_cuda", "_col2im"): (array6, step, step, step, flag, array4),
            ("pool_cuda", "_max_pool"): (array4, step, step, step, step, step, array4, where),
            ("pool_cuda", "_max_pool_backward"): (array4, where, step, step, step, step, step, array4),
            ("batchnorm_cuda", "_forward"): (array3, array1, array1, types.float64, array1, array1, types.float64,
                                             flag, array3, array1, array3, step),
            ("batchnorm_cuda", "_backward"): (array3, array3, step, array3, array3, array1, array1, array1, array1,
                                              flag, array3),
            **updater_signatures(array1, flag, scalar)}


def updater_signatures(array1, flag, scalar) -> dict:
    """The updaters' kernels (kernels/updaters_cuda.py) on flat arrays; an optional operand is an array and a flag."""
    optional = (array1, flag)
    return {("updaters_cuda", "_sgd"): (array1, array1, *optional, scalar, array1),
            ("updaters_cuda", "_momentum"): (array1, array1, array1, *optional, scalar, scalar, flag, array1),
            ("updaters_cuda", "_adagrad"): (array1, array1, array1, *optional, scalar, scalar, array1),
            ("updaters_cuda", "_rmsprop"): (array1, array1, array1, *optional, *(scalar,) * 4, array1),
            ("updaters_cuda", "_adam_variant"): (array1, array1, *optional, array1, array1, *optional, *optional,
                                                 *(scalar,) * 7, array1),
            ("updaters_cuda", "_nadam"): (array1, array1, array1, array1, *optional, *(scalar,) * 8, array1)}


def main() -> int:
    import numba.cuda.api
    import numba.cuda.dispatcher
    numba.cuda.api.get_current_device = numba.cuda.dispatcher.get_current_device = _Hopper
    import importlib
    for dtype in (types.float32, types.float64):
        for (module, name), signature in signatures(dtype).items():
            kernel = getattr(importlib.import_module(f"mpitrain.kernels.{module}"), name)
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=CC)
            print(f"ok {module}.{name} ({dtype}): {len(ptx)} bytes of PTX")
    return 0


if __name__ == "__main__":
    sys.exit(main())
