"""The element-wise gate work of one time step of the recurrent layers (`mpitrain.nn.recurrent`), forward and back.

    lstm_step(g, recurrent, c_before, c_after, h_after, tanh_c)                 # g: (B, 4H) in, gates i, o, f, c out
    lstm_step_backward(g, c_before, tanh_c, dh, dc, grad_in, dc_before)
    gru_step(g, recurrent, h_before, h_after, recurrent_h)                      # g: (B, 3H) in, gates z, r, h out
    gru_step_backward(g, h_before, recurrent_h, dh, grad_in, grad_rec, direct)

Every array is (B, H) but `g`, `recurrent`, `grad_in`, `grad_rec` (B, G*H), all C-contiguous. `g` comes in as the
step's input projection plus input bias and leaves as the gates' activations, which backward reads; `recurrent` is
h R (+ bR for the GRU). Nothing is allocated: each writes into the arrays it is given.

Forward is ufuncs with `out=` on any array module: its sigmoids and tanhs run in numpy's SIMD loops, and a numba
kernel, calling libm's scalar exp and tanh per element, was 3 to 13 times slower (one thread; B = H = 64 and 256).
Backward has no transcendental function: its numba kernels (numpy arrays; cupy's take the `*_reference` ufuncs,
which the tests compare them with) make one pass instead of about fifteen, 6 to 9 times faster than the ufuncs.
"""
from __future__ import annotations

from numba import njit, prange

from mpitrain.base.arrays import array_module

from .dispatch import numpy_or_reference


@njit(parallel=True, cache=True)
def _lstm_step_backward_cpu(g, c_before, tanh_c, dh, dc, grad_in, dc_before):
    rows, h = c_before.shape
    for r in prange(rows):
        for j in range(h):
            i, o, f, cell = g[r, j], g[r, h + j], g[r, 2 * h + j], g[r, 3 * h + j]
            t, d = tanh_c[r, j], dh[r, j]
            c = dc[r, j] + d * o * (1 - t * t)  # the cell state's whole gradient
            grad_in[r, j] = c * cell * i * (1 - i)
            grad_in[r, h + j] = d * t * o * (1 - o)
            grad_in[r, 2 * h + j] = c * c_before[r, j] * f * (1 - f)
            grad_in[r, 3 * h + j] = c * i * (1 - cell * cell)
            dc_before[r, j] = c * f


@njit(parallel=True, cache=True)
def _gru_step_backward_cpu(g, h_before, recurrent_h, dh, grad_in, grad_rec, direct):
    rows, h = h_before.shape
    for r in prange(rows):
        for j in range(h):
            z, reset, n, d = g[r, j], g[r, h + j], g[r, 2 * h + j], dh[r, j]
            d_n = d * (1 - z) * (1 - n * n)
            d_z = d * (h_before[r, j] - n) * z * (1 - z)
            d_r = d_n * recurrent_h[r, j] * reset * (1 - reset)
            grad_in[r, j], grad_in[r, h + j], grad_in[r, 2 * h + j] = d_z, d_r, d_n
            grad_rec[r, j], grad_rec[r, h + j], grad_rec[r, 2 * h + j] = d_z, d_r, d_n * reset
            direct[r, j] = d * z


@numpy_or_reference("lstm_step_backward_reference")
def lstm_step_backward(g, c_before, tanh_c, dh, dc, grad_in, dc_before) -> None:
    """From the gradients `dh`, `dc` of the states after the step: the gates' pre-activations' into `grad_in`, the
    cell state's before the step into `dc_before` (the hidden state's is grad_in R^T, the caller's matmul)."""
    _lstm_step_backward_cpu(g, c_before, tanh_c, dh, dc, grad_in, dc_before)


@numpy_or_reference("gru_step_backward_reference")
def gru_step_backward(g, h_before, recurrent_h, dh, grad_in, grad_rec, direct) -> None:
    """From the gradient `dh` of the state after the step: the pre-activations' on the input side into `grad_in`, on
    the recurrent side (the h block times r) into `grad_rec`, and dh z, the state's own part of the gradient of the
    state before the step, into `direct` (the rest is grad_rec R^T, the caller's matmul)."""
    _gru_step_backward_cpu(g, h_before, recurrent_h, dh, grad_in, grad_rec, direct)


def _sigmoid(xp, a) -> None:
    """a = sigmoid(a) in place, as (1 + tanh(a / 2)) / 2: no overflow for large |a|."""
    a *= 0.5
    xp.tanh(a, out=a)
    a += 1
    a *= 0.5


def _derivative_of_sigmoid(xp, y, out) -> None:
    """out = y (1 - y), the derivative of the sigmoid whose output is y."""
    xp.subtract(1, y, out=out)
    out *= y


def _derivative_of_tanh(xp, y, out) -> None:
    """out = 1 - y^2, the derivative of the tanh whose output is y."""
    xp.multiply(y, y, out=out)
    xp.subtract(1, out, out=out)


def lstm_step(g, recurrent, c_before, c_after, h_after, tanh_c) -> None:
    """i, o, f = sigmoid, c~ = tanh of g + recurrent, written into g; c' = f c + i c~ into `c_after`, its tanh into
    `tanh_c`, h' = o tanh(c') into `h_after`."""
    xp, h = array_module(g), c_before.shape[1]
    g += recurrent
    _sigmoid(xp, g[:, :3 * h])
    xp.tanh(g[:, 3 * h:], out=g[:, 3 * h:])
    i, o, f, cell = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h], g[:, 3 * h:]
    xp.multiply(f, c_before, out=c_after)
    xp.multiply(i, cell, out=h_after)
    c_after += h_after
    xp.tanh(c_after, out=tanh_c)
    xp.multiply(o, tanh_c, out=h_after)


def lstm_step_backward_reference(g, c_before, tanh_c, dh, dc, grad_in, dc_before) -> None:
    xp, h = array_module(g), c_before.shape[1]
    i, o, f, cell = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h], g[:, 3 * h:]
    d_i, d_o, d_f, d_cell = grad_in[:, :h], grad_in[:, h:2 * h], grad_in[:, 2 * h:3 * h], grad_in[:, 3 * h:]
    c = dc_before  # the cell state's whole gradient, until its last line
    _derivative_of_tanh(xp, tanh_c, c)
    c *= o
    c *= dh
    c += dc
    _derivative_of_sigmoid(xp, o, d_o)
    d_o *= dh
    d_o *= tanh_c
    for d, gate, other in ((d_i, i, cell), (d_f, f, c_before)):
        _derivative_of_sigmoid(xp, gate, d)
        d *= other
        d *= c
    _derivative_of_tanh(xp, cell, d_cell)
    d_cell *= i
    d_cell *= c
    c *= f


def gru_step(g, recurrent, h_before, h_after, recurrent_h) -> None:
    """z, r = sigmoid(g + recurrent), n = tanh(g_h + r recurrent_h), written into g; `recurrent_h` (h R_h + bR_h)
    kept for backward; h' = n + z (h - n) into `h_after`."""
    xp, h = array_module(g), h_before.shape[1]
    g[:, :2 * h] += recurrent[:, :2 * h]
    _sigmoid(xp, g[:, :2 * h])
    z, reset, n = g[:, :h], g[:, h:2 * h], g[:, 2 * h:]
    xp.copyto(recurrent_h, recurrent[:, 2 * h:])
    xp.multiply(reset, recurrent_h, out=h_after)
    n += h_after
    xp.tanh(n, out=n)
    xp.subtract(h_before, n, out=h_after)
    h_after *= z
    h_after += n


def gru_step_backward_reference(g, h_before, recurrent_h, dh, grad_in, grad_rec, direct) -> None:
    xp, h = array_module(g), h_before.shape[1]
    z, reset, n = g[:, :h], g[:, h:2 * h], g[:, 2 * h:]
    d_z, d_r, d_n = grad_in[:, :h], grad_in[:, h:2 * h], grad_in[:, 2 * h:]
    xp.multiply(dh, z, out=direct)
    xp.subtract(dh, direct, out=d_n)  # dh (1 - z)
    _derivative_of_tanh(xp, n, d_z)
    d_n *= d_z
    _derivative_of_sigmoid(xp, z, d_z)
    xp.subtract(h_before, n, out=d_r)
    d_z *= d_r
    d_z *= dh
    _derivative_of_sigmoid(xp, reset, d_r)
    d_r *= recurrent_h
    d_r *= d_n
    xp.copyto(grad_rec[:, :2 * h], grad_in[:, :2 * h])
    xp.multiply(d_n, reset, out=grad_rec[:, 2 * h:])
