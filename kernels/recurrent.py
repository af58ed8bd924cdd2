"""The element-wise gate work of one time step of the recurrent layers (`mpitrain.nn.recurrent`), forward and back.

    lstm_step(gates, recurrent, h, c, tanh_c, padded, t, before, after)        # gates i, o, f, c
    lstm_step_backward(gates, c, tanh_c, dh, dc, grad_in, dc_before, direct, padded, t, before)
    gru_step(gates, recurrent, bias, h, recurrent_h, padded, t, before, after)  # gates z, r, h
    gru_step_backward(gates, h, recurrent_h, dh, grad_in, grad_rec, direct, padded, t, before)

They take a layer's whole workspace arrays and the time step: `gates` (T, B, G*H) holds each step's input projection
plus input bias and leaves step t as its gates' activations, which backward reads; the states `h`, `c` are
(T + 1, B, H), step t reading row `before` and writing row `after`; `tanh_c` and `recurrent_h` (T, B, H) are kept
for backward; `padded` (T, B, 1) says which sequences are past their end at step t: there the states are carried
over unchanged (forward), and the pre-activations get no gradient while the states' gradients pass on unchanged
(backward). `recurrent` (B, G*H) is h R of the step (the GRU's recurrent `bias` is added here); `grad_in`,
`grad_rec` are (T, B, G*H); `dh`, `dc`, `dc_before` and `direct` (B, H): the caller adds grad R^T to `direct` for
the hidden state's gradient before the step. Nothing is allocated.

numpy arrays take the CPU path. Forward is ufuncs with `out=`: its sigmoids and tanhs run in numpy's SIMD loops,
and a numba kernel, calling libm's scalar exp and tanh per element, was 3 to 13 times slower (one thread; B = H = 64
and 256). Backward is one numba pass instead of about fifteen ufuncs, 6 to 9 times faster. Other arrays (cupy) take
kernels/recurrent_cuda.py: one numba-CUDA kernel per step and direction, where ufuncs and masked copies made about
fifteen launches forward and twenty back. The per-element backward (`lstm_cell_backward`, `gru_cell_backward`) and
the GPU's forward (`lstm_cell`, `gru_cell`) are written once, for both targets.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from .dispatch import numpy_or_reference


@register_jitable
def sigmoid(a):
    """The logistic function as (1 + tanh(a / 2)) / 2: no overflow for large |a|."""
    return (1 + math.tanh(a / 2)) / 2


@register_jitable
def lstm_cell(z_i, z_o, z_f, z_cell, c_before):
    """One unit's forward: (i, o, f, c~, c', tanh(c'), h') from its four pre-activations and its cell state."""
    i, o, f, cell = sigmoid(z_i), sigmoid(z_o), sigmoid(z_f), math.tanh(z_cell)
    c = f * c_before + i * cell
    tanh_c = math.tanh(c)
    return i, o, f, cell, c, tanh_c, o * tanh_c


@register_jitable
def lstm_cell_backward(i, o, f, cell, tanh_c, c_before, dh, dc):
    """One unit's backward from the gradients of h' and c': (d z_i, d z_o, d z_f, d z_c~, d c)."""
    c = dc + dh * o * (1 - tanh_c * tanh_c)  # the cell state's whole gradient
    return (c * cell * i * (1 - i), dh * tanh_c * o * (1 - o), c * c_before * f * (1 - f),
            c * i * (1 - cell * cell), c * f)


@register_jitable
def gru_cell(z_z, z_r, z_n, recurrent_h, h_before):
    """One unit's forward: (z, r, n, h') from the pre-activations of z, r (input and recurrent sides summed), the
    input side of n, and the recurrent side of n (h R_h + bR_h)."""
    z, reset = sigmoid(z_z), sigmoid(z_r)
    n = math.tanh(z_n + reset * recurrent_h)
    return z, reset, n, n + z * (h_before - n)


@register_jitable
def gru_cell_backward(z, reset, n, recurrent_h, h_before, dh):
    """One unit's backward from the gradient of h': (d z_z, d z_r, d z_n) on the input side, d z_n r on the recurrent
    side, and dh z, the state's own part of the gradient of h."""
    d_n = dh * (1 - z) * (1 - n * n)
    return (dh * (h_before - n) * z * (1 - z), d_n * recurrent_h * reset * (1 - reset), d_n, d_n * reset, dh * z)


@njit(parallel=True, cache=True)
def _lstm_step_backward_cpu(g, c_before, tanh_c, dh, dc, grad_in, dc_before):
    rows, h = c_before.shape
    for r in prange(rows):
        for j in range(h):
            d_i, d_o, d_f, d_cell, dc_before[r, j] = lstm_cell_backward(
                g[r, j], g[r, h + j], g[r, 2 * h + j], g[r, 3 * h + j], tanh_c[r, j], c_before[r, j], dh[r, j],
                dc[r, j])
            grad_in[r, j], grad_in[r, h + j], grad_in[r, 2 * h + j], grad_in[r, 3 * h + j] = d_i, d_o, d_f, d_cell


@njit(parallel=True, cache=True)
def _gru_step_backward_cpu(g, h_before, recurrent_h, dh, grad_in, grad_rec, direct):
    rows, h = h_before.shape
    for r in prange(rows):
        for j in range(h):
            d_z, d_r, d_n, d_n_rec, direct[r, j] = gru_cell_backward(
                g[r, j], g[r, h + j], g[r, 2 * h + j], recurrent_h[r, j], h_before[r, j], dh[r, j])
            grad_in[r, j], grad_in[r, h + j], grad_in[r, 2 * h + j] = d_z, d_r, d_n
            grad_rec[r, j], grad_rec[r, h + j], grad_rec[r, 2 * h + j] = d_z, d_r, d_n_rec


def _sigmoid(a) -> None:
    """a = sigmoid(a) in place, as (1 + tanh(a / 2)) / 2: no overflow for large |a|."""
    a *= 0.5
    np.tanh(a, out=a)
    a += 1
    a *= 0.5


@numpy_or_reference("lstm_step_gpu")
def lstm_step(gates, recurrent, h, c, tanh_c, padded, t: int, before: int, after: int) -> None:
    """Step t of an LSTM (the module docstring): gates i, o, f = sigmoid, c~ = tanh of gates[t] + recurrent, written
    into gates[t]; c' = f c + i c~ into c[after], its tanh into tanh_c[t], h' = o tanh(c') into h[after]; where
    padded, the states before."""
    units = c.shape[2]
    g = gates[t]
    g += recurrent
    _sigmoid(g[:, :3 * units])
    np.tanh(g[:, 3 * units:], out=g[:, 3 * units:])
    i, o, f, cell = g[:, :units], g[:, units:2 * units], g[:, 2 * units:3 * units], g[:, 3 * units:]
    c_after, h_after = c[after], h[after]
    np.multiply(f, c[before], out=c_after)
    np.multiply(i, cell, out=h_after)
    c_after += h_after
    np.tanh(c_after, out=tanh_c[t])
    np.multiply(o, tanh_c[t], out=h_after)
    for state in (h, c):
        np.copyto(state[after], state[before], where=padded[t])


@numpy_or_reference("lstm_step_backward_gpu")
def lstm_step_backward(gates, c, tanh_c, dh, dc, grad_in, dc_before, direct, padded, t: int, before: int) -> None:
    """Step t of an LSTM backward, from the gradients `dh`, `dc` of the states after it: the gates' pre-activations'
    into grad_in[t], the cell state's before the step into `dc_before`, and into `direct` dh where padded (else 0),
    to which the caller adds grad_in[t] R^T for the hidden state's."""
    _lstm_step_backward_cpu(gates[t], c[before], tanh_c[t], dh, dc, grad_in[t], dc_before)
    np.copyto(grad_in[t], 0, where=padded[t])
    np.copyto(dc_before, dc, where=padded[t])
    np.multiply(dh, padded[t], out=direct)


@numpy_or_reference("gru_step_gpu")
def gru_step(gates, recurrent, bias, h, recurrent_h, padded, t: int, before: int, after: int) -> None:
    """Step t of a GRU: z, r = sigmoid(gates[t] + recurrent + bias), n = tanh(gates[t]_h + r recurrent_h), written
    into gates[t], where recurrent_h[t] = (recurrent + bias)_h is kept for backward; h' = n + z (h - n) into
    h[after], or where padded h."""
    units = h.shape[2]
    recurrent += bias
    g = gates[t]
    g[:, :2 * units] += recurrent[:, :2 * units]
    _sigmoid(g[:, :2 * units])
    z, reset, n = g[:, :units], g[:, units:2 * units], g[:, 2 * units:]
    h_after, h_before = h[after], h[before]
    np.copyto(recurrent_h[t], recurrent[:, 2 * units:])
    np.multiply(reset, recurrent_h[t], out=h_after)
    n += h_after
    np.tanh(n, out=n)
    np.subtract(h_before, n, out=h_after)
    h_after *= z
    h_after += n
    np.copyto(h_after, h_before, where=padded[t])


@numpy_or_reference("gru_step_backward_gpu")
def gru_step_backward(gates, h, recurrent_h, dh, grad_in, grad_rec, direct, padded, t: int, before: int) -> None:
    """Step t of a GRU backward, from the gradient `dh` of the state after it: the pre-activations' on the input side
    into grad_in[t], on the recurrent side (the h block times r) into grad_rec[t], and into `direct` dh z (where
    padded: dh), to which the caller adds grad_rec[t] R^T for the gradient of the state before the step."""
    _gru_step_backward_cpu(gates[t], h[before], recurrent_h[t], dh, grad_in[t], grad_rec[t], direct)
    for grad in (grad_in[t], grad_rec[t]):
        np.copyto(grad, 0, where=padded[t])
    np.copyto(direct, dh, where=padded[t])


def _on_gpu(name: str):
    """The kernel launcher `name` of kernels/recurrent_cuda.py, imported at the first call (numba.cuda only where a
    GPU path runs)."""
    def launch(*args) -> None:
        from . import recurrent_cuda
        getattr(recurrent_cuda, name)(*args)
    return launch


lstm_step_gpu, lstm_step_backward_gpu = _on_gpu("lstm_forward"), _on_gpu("lstm_backward")
gru_step_gpu, gru_step_backward_gpu = _on_gpu("gru_forward"), _on_gpu("gru_backward")
