"""The convolution's fused kernels between its GEMM rows and NCHW: bias + activation, its derivative.

    bias_activation_nchw(rows, b, "relu", y)            # y (N, F, OH, OW) = relu(rows + b), rows (N*OH*OW, F)
    activation_backward_rows(dy, y, "relu", dz, sums)   # dz (N*OH*OW, F) = dy * relu'(.), dy and y (N, F, OH, OW);
                                                        # sums (N, F): each image's sum of its dz rows

The GEMM of a convolution gives one row per output pixel (`kernels.im2col`); the layer's
input and output are NCHW. Each kernel does the transpose together with the element-wise
work in one pass, writing into the array it is given (the model's workspace), so a step
allocates nothing. Kind "none" is the bias add (forward) or the transpose (backward) alone.
The backward kernel also adds up each image's rows into its row of `sums` (the conv layer's
are float64) while they are still in cache: no race, and the bias gradient is then
`sums.sum(axis=0)`, not a second pass over dz (numpy's column sums of a tall (N*OH*OW, F)
array go row by row).
The activation and its derivative (from the activation's OUTPUT y) are `kernels.activations`'
`activate` and `derivative`. numpy arrays run the numba kernels, parallel over images, on
any strided views; other arrays (cupy) run the `*_reference` versions, `kernels.activations`'
references on transposed views, which the tests compare the kernels with.
"""
from __future__ import annotations

from numba import njit, prange

from .activations import KINDS, activate, activation_backward_reference, bias_activation_reference, derivative
from .dispatch import numpy_or_reference


@numpy_or_reference("bias_activation_nchw_reference")
def bias_activation_nchw(rows, b, kind: str, out) -> None:
    """`out` (N, F, OH, OW) = activation `kind` of `rows` (N*OH*OW, F) + `b` (F,), transposed."""
    _bias_activation_nchw_cpu(rows, b, KINDS[kind], out)


@numpy_or_reference("activation_backward_rows_reference")
def activation_backward_rows(dy, y, kind: str, out, sums) -> None:
    """`out` (N*OH*OW, F) = `dy` (N, F, OH, OW) * the derivative of activation `kind` at its output `y`
    (N, F, OH, OW, read unless kind is "none"), transposed; `sums` (N, F) = each image's column sums of `out`."""
    _activation_backward_rows_cpu(dy, y, KINDS[kind], out, sums)


def bias_activation_nchw_reference(rows, b, kind: str, out) -> None:
    """bias_activation_nchw of any array module: `bias_activation_reference` into `out` seen as NHWC."""
    n, f, oh, ow = out.shape
    bias_activation_reference(rows.reshape(n, oh, ow, f), b, kind, out.transpose(0, 2, 3, 1))


def activation_backward_rows_reference(dy, y, kind: str, out, sums) -> None:
    """activation_backward_rows of any array module: `activation_backward_reference` on `dy` and `y` seen as
    NHWC, into `out` (C-contiguous) seen as NHWC; then its sums over each image's rows."""
    n, f, oh, ow = dy.shape
    activation_backward_reference(dy.transpose(0, 2, 3, 1), y.transpose(0, 2, 3, 1), kind,
                                  out.reshape(n, oh, ow, f))
    out.reshape(n, oh * ow, f).sum(axis=1, out=sums)


@njit(parallel=True, cache=True)
def _bias_activation_nchw_cpu(rows, b, kind, out):
    n, f, oh, ow = out.shape
    for image in prange(n):
        first = image * oh * ow
        for p in range(oh):
            for q in range(ow):
                row = first + p * ow + q
                for k in range(f):
                    out[image, k, p, q] = activate(rows[row, k] + b[k], kind)


@njit(parallel=True, cache=True)
def _activation_backward_rows_cpu(dy, y, kind, out, sums):
    n, f, oh, ow = dy.shape
    for image in prange(n):
        first = image * oh * ow
        for k in range(f):
            sums[image, k] = 0
        for p in range(oh):  # one output row at a time: its rows of `out` are still in cache when summed
            for k in range(f):
                for q in range(ow):
                    d = dy[image, k, p, q]
                    if kind != 0:
                        d = d * derivative(y[image, k, p, q], kind)
                    out[first + p * ow + q, k] = d
            for row in range(first + p * ow, first + (p + 1) * ow):
                for k in range(f):
                    sums[image, k] += out[row, k]


@njit(cache=True)
def _column_sums_cpu(sums, out):
    for k in range(sums.shape[1]):
        total = 0.0
        for image in range(sums.shape[0]):
            total += sums[image, k]
        out[k] = total


@numpy_or_reference("column_sums_reference")
def column_sums(sums, out) -> None:
    """out (F,) = the column sums of `sums` (N, F), in float64 then cast to out's dtype (the bias gradient from
    each image's part; numpy's `sum(out=)` into another dtype allocates a cast buffer)."""
    _column_sums_cpu(sums, out)


def column_sums_reference(sums, out) -> None:
    sums.sum(axis=0, out=out)
