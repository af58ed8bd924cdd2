"""A block's sum in shared memory for the numba-CUDA kernels that reduce (kernels/loss_cuda.py,
kernels/batchnorm_cuda.py): pairs added in a fixed tree order, so a sum does not depend on the order in which the
threads ran, as an atomic add's would."""
from __future__ import annotations

from numba import cuda


@cuda.jit(device=True)
def block_sum(part, t):
    """part[0] = the sum of part (one value per thread of the block, a power of two of them), added pairwise in a
    fixed order. Every thread of the block calls it, `t` its index; part[0] is visible to all on return."""
    step = part.shape[0] // 2
    while step > 0:
        if t < step:
            part[t] += part[t + step]
        cuda.syncthreads()
        step //= 2
