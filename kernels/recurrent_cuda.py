"""The recurrent layers' time steps on a GPU: one numba-CUDA kernel per time step and direction, forward and back
(kernels/recurrent.py says what each computes), launched on cupy's current stream.

A thread computes one unit of one sequence: its gates, states and gradients, with the per-element functions the CPU
path shares (`lstm_cell`, `lstm_cell_backward`, `gru_cell`, `gru_cell_backward`), and carries states over where the
sequence is past its end. The layer's workspace arrays are handed over whole with the step's index, so their numba
views are made once (`kernels.cuda_launch`, cached) and not at every one of a batch's hundreds of steps. Under the CUDA simulator
(NUMBA_ENABLE_CUDASIM=1) the same kernels run on numpy arrays: tests/harness/cuda_kernels_check.py holds them to the
CPU path there and on a GPU.
"""
from __future__ import annotations

from numba import cuda

from .cuda_launch import launch
from .recurrent import gru_cell, gru_cell_backward, lstm_cell, lstm_cell_backward

BLOCK = (4, 64)  # (sequences, units) per block of threads


@cuda.jit(device=True)
def _unit(states):
    """This thread's (sequence, unit, units) of the (rows, B, H) `states`; sequence -1 for a thread past them."""
    r, j = cuda.grid(2)
    return (r, j, states.shape[2]) if r < states.shape[1] and j < states.shape[2] else (-1, -1, 0)


@cuda.jit
def _lstm_forward(gates, recurrent, h, c, tanh_c, padded, t, before, after):
    r, j, units = _unit(c)
    if r < 0:
        return
    g = gates[t, r]
    i, o, f, cell, c_new, tanh_new, h_new = lstm_cell(
        g[j] + recurrent[r, j], g[units + j] + recurrent[r, units + j], g[2 * units + j] + recurrent[r, 2 * units + j],
        g[3 * units + j] + recurrent[r, 3 * units + j], c[before, r, j])
    g[j], g[units + j], g[2 * units + j], g[3 * units + j] = i, o, f, cell
    tanh_c[t, r, j] = tanh_new
    if padded[t, r, 0]:
        c[after, r, j], h[after, r, j] = c[before, r, j], h[before, r, j]
    else:
        c[after, r, j], h[after, r, j] = c_new, h_new


@cuda.jit
def _lstm_backward(gates, c, tanh_c, dh, dc, grad_in, dc_before, direct, padded, t, before):
    r, j, units = _unit(c)
    if r < 0:
        return
    g, grad = gates[t, r], grad_in[t, r]
    if padded[t, r, 0]:
        grad[j] = grad[units + j] = grad[2 * units + j] = grad[3 * units + j] = 0
        dc_before[r, j], direct[r, j] = dc[r, j], dh[r, j]
        return
    grad[j], grad[units + j], grad[2 * units + j], grad[3 * units + j], dc_before[r, j] = lstm_cell_backward(
        g[j], g[units + j], g[2 * units + j], g[3 * units + j], tanh_c[t, r, j], c[before, r, j], dh[r, j], dc[r, j])
    direct[r, j] = 0


@cuda.jit
def _gru_forward(gates, recurrent, bias, h, recurrent_h, padded, t, before, after):
    r, j, units = _unit(h)
    if r < 0:
        return
    g, rec = gates[t, r], recurrent[r]
    kept = rec[2 * units + j] + bias[2 * units + j]
    z, reset, n, h_new = gru_cell(g[j] + rec[j] + bias[j], g[units + j] + rec[units + j] + bias[units + j],
                                  g[2 * units + j], kept, h[before, r, j])
    g[j], g[units + j], g[2 * units + j] = z, reset, n
    recurrent_h[t, r, j] = kept
    h[after, r, j] = h[before, r, j] if padded[t, r, 0] else h_new


@cuda.jit
def _gru_backward(gates, h, recurrent_h, dh, grad_in, grad_rec, direct, padded, t, before):
    r, j, units = _unit(h)
    if r < 0:
        return
    g, grad, rec = gates[t, r], grad_in[t, r], grad_rec[t, r]
    if padded[t, r, 0]:
        grad[j] = grad[units + j] = grad[2 * units + j] = rec[j] = rec[units + j] = rec[2 * units + j] = 0
        direct[r, j] = dh[r, j]
        return
    d_z, d_r, d_n, d_n_rec, direct[r, j] = gru_cell_backward(g[j], g[units + j], g[2 * units + j],
                                                             recurrent_h[t, r, j], h[before, r, j], dh[r, j])
    grad[j], grad[units + j], grad[2 * units + j] = d_z, d_r, d_n
    rec[j], rec[units + j], rec[2 * units + j] = d_z, d_r, d_n_rec


def lstm_forward(gates, recurrent, h, c, tanh_c, padded, t, before, after) -> None:
    _launch(_lstm_forward, c.shape[1], c.shape[2], gates, recurrent, h, c, tanh_c, padded, t, before, after)


def lstm_backward(gates, c, tanh_c, dh, dc, grad_in, dc_before, direct, padded, t, before) -> None:
    _launch(_lstm_backward, c.shape[1], c.shape[2], gates, c, tanh_c, dh, dc, grad_in, dc_before, direct, padded, t,
            before)


def gru_forward(gates, recurrent, bias, h, recurrent_h, padded, t, before, after) -> None:
    _launch(_gru_forward, h.shape[1], h.shape[2], gates, recurrent, bias, h, recurrent_h, padded, t, before, after)


def gru_backward(gates, h, recurrent_h, dh, grad_in, grad_rec, direct, padded, t, before) -> None:
    _launch(_gru_backward, h.shape[1], h.shape[2], gates, h, recurrent_h, dh, grad_in, grad_rec, direct, padded, t,
            before)


def _launch(kernel, rows: int, units: int, *args) -> None:
    """`kernel` over (rows, units) threads (`kernels.cuda_launch.launch`)."""
    launch(kernel, (-(-rows // BLOCK[0]), -(-units // BLOCK[1])), BLOCK, *args)
