"""Layer normalization on a GPU: forward in one launch (a thread per row), backward in two (a thread per row for dz
and dx, then a thread per feature for dgamma and dbeta), where the references made about 12 and 10.

Each thread runs the CPU kernel's function for its row or feature (`normalize_row`, `input_grad_row`,
`scale_grads_feature` of kernels/layernorm.py), summing in float64 in the same order, so the GPU's values are the
CPU's up to the device's rounding of sqrt and the activations. The arguments are those of
`kernels.layernorm.forward` and `backward`. Under the CUDA simulator the same kernels run on numpy arrays
(tests/harness/cuda_kernels_check.py).
"""
from __future__ import annotations

from numba import cuda

from .activations import KINDS
from .cuda_launch import launch_over
from .layernorm import input_grad_row, normalize_row, scale_grads_feature

BLOCK = 128


@cuda.jit
def _forward(x, gamma, beta, eps, x_hat, inv_std, y, kind):
    r = cuda.grid(1)
    if r < x.shape[0]:
        normalize_row(x, gamma, beta, eps, x_hat, inv_std, y, kind, r)


@cuda.jit
def _input_grad(dy, y, kind, dz, x_hat, inv_std, gamma, input_grad, dx):
    r = cuda.grid(1)
    if r < dy.shape[0]:
        input_grad_row(dy, y, kind, dz, x_hat, inv_std, gamma, input_grad, dx, r)


@cuda.jit
def _scale_grads(dz, x_hat, dgamma, dbeta):
    f = cuda.grid(1)
    if f < dz.shape[1]:
        scale_grads_feature(dz, x_hat, dgamma, dbeta, f)


def forward(x, gamma, beta, eps: float, x_hat, inv_std, y, kind: str = "none") -> None:
    """kernels.layernorm.forward on device arrays."""
    launch_over(_forward, x.shape[0], BLOCK, x, gamma, beta, float(eps), x_hat, inv_std, y, KINDS[kind])


def backward(dy, y, kind: str, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx) -> None:
    """kernels.layernorm.backward on device arrays."""
    dz = dy if kind == "none" else dz
    launch_over(_input_grad, dy.shape[0], BLOCK, dy, y, KINDS[kind], dz, x_hat, inv_std, gamma, dx is not None,
                dy if dx is None else dx)
    launch_over(_scale_grads, dy.shape[1], BLOCK, dz, x_hat, dgamma, dbeta)
