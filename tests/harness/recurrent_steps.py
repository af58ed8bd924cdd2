"""One time step of the recurrent kernels (kernels/recurrent.py, kernels/recurrent_cuda.py) on random arrays: the
arrays a layer hands them, the step forward and backward through either module, and the backward held to central
differences of the forward. tests/unit/kernels/test_recurrent_kernels.py runs them on the CPU;
tests/harness/cuda_kernels_check.py holds the GPU's kernels to the CPU's on the same arrays."""
from __future__ import annotations

import numpy as np

from mpitrain.kernels import recurrent as cpu

SIZES = [(1, 1), (3, 5), (17, 33)]  # (B, H)
STEPS = 3  # T; the step taken is t = 1, reading state row 1 and writing row 2
GATES = {"lstm": 4, "gru": 3}


def step_arrays(kind: str, batch: int, units: int, dtype, seed: int = 0) -> dict:
    """The arrays of a step of `kind` ("lstm" or "gru") as a layer holds them, random; the first sequence is padded
    at the step and the second not (batch 1: not padded)."""
    rng = np.random.default_rng(seed)
    columns = GATES[kind] * units

    def normal(*shape):
        return rng.normal(size=shape).astype(dtype)
    padded = rng.random((STEPS, batch, 1)) < 0.5
    padded[1, 0, 0], padded[1, 1:2, 0] = batch > 1, False
    a = {"t": 1, "before": 1, "after": 2, "padded": padded, "gates": normal(STEPS, batch, columns),
         "recurrent": normal(batch, columns), "h": normal(STEPS + 1, batch, units), "dh": normal(batch, units),
         "grad_in": normal(STEPS, batch, columns), "grad_rec": normal(STEPS, batch, columns),
         "direct": normal(batch, units)}
    if kind == "lstm":
        a.update(c=normal(STEPS + 1, batch, units), tanh_c=normal(STEPS, batch, units), dc=normal(batch, units),
                 dc_before=normal(batch, units))
    else:
        a.update(bias=normal(columns), recurrent_h=normal(STEPS, batch, units))
    return a


def step_forward(kind: str, a: dict, kernels=None) -> None:
    """Step t forward in place, through `kernels` (a module with the launchers' names, e.g. recurrent_cuda) or the CPU
    path. The recurrent input is not changed (the CPU's GRU adds its bias into it: a copy is handed over)."""
    recurrent = a["recurrent"].copy()
    if kind == "lstm":
        run = kernels.lstm_forward if kernels else cpu.lstm_step
        run(a["gates"], recurrent, a["h"], a["c"], a["tanh_c"], a["padded"], a["t"], a["before"], a["after"])
    else:
        run = kernels.gru_forward if kernels else cpu.gru_step
        run(a["gates"], recurrent, a["bias"], a["h"], a["recurrent_h"], a["padded"], a["t"], a["before"], a["after"])


def step_backward(kind: str, a: dict, kernels=None) -> None:
    """Step t backward in place, from `dh` (and `dc`), after `step_forward`; an LSTM's grad_rec is its grad_in."""
    if kind == "lstm":
        run = kernels.lstm_backward if kernels else cpu.lstm_step_backward
        run(a["gates"], a["c"], a["tanh_c"], a["dh"], a["dc"], a["grad_in"], a["dc_before"], a["direct"], a["padded"],
            a["t"], a["before"])
        a["grad_rec"] = a["grad_in"]
    else:
        run = kernels.gru_backward if kernels else cpu.gru_step_backward
        run(a["gates"], a["h"], a["recurrent_h"], a["dh"], a["grad_in"], a["grad_rec"], a["direct"], a["padded"],
            a["t"], a["before"])


def outputs(kind: str, a: dict, after_backward: bool) -> dict:
    """What the step writes: forward's, and with `after_backward` backward's too."""
    t, after = a["t"], a["after"]
    names = {"gates": a["gates"][t], "h": a["h"][after]}
    names.update({"c": a["c"][after], "tanh_c": a["tanh_c"][t]} if kind == "lstm" else
                 {"recurrent_h": a["recurrent_h"][t]})
    if after_backward:
        names.update(grad_in=a["grad_in"][t], grad_rec=a["grad_rec"][t], direct=a["direct"])
        if kind == "lstm":
            names["dc_before"] = a["dc_before"]
    return names


def gradient_check(kind: str, batch: int, units: int, eps: float = 1e-6) -> None:
    """In float64, no sequence padded: the loss sum(dh h') (+ sum(dc c')) differentiated by central differences in the
    step's pre-activations (input and recurrent side), its cell state and (GRU) its hidden state equals what
    backward writes."""
    base = step_arrays(kind, batch, units, np.float64, seed=7)
    base["padded"][...] = False

    def loss(a: dict) -> float:
        a = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in a.items()}
        step_forward(kind, a)
        value = (a["dh"] * a["h"][a["after"]]).sum()
        return value + ((a["dc"] * a["c"][a["after"]]).sum() if kind == "lstm" else 0.0)

    def numeric(name: str, index) -> np.ndarray:
        grad = np.zeros_like(base[name][index])
        for position in np.ndindex(grad.shape):
            up, down = ({k: v.copy() if isinstance(v, np.ndarray) else v for k, v in base.items()} for _ in range(2))
            up[name][index][position] += eps
            down[name][index][position] -= eps
            grad[position] = (loss(up) - loss(down)) / (2 * eps)
        return grad

    a = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in base.items()}
    step_forward(kind, a)
    step_backward(kind, a)
    t, before = a["t"], a["before"]
    np.testing.assert_allclose(a["grad_in"][t], numeric("gates", t), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(a["grad_rec"][t], numeric("recurrent", slice(None)), rtol=1e-6, atol=1e-8)
    if kind == "lstm":
        np.testing.assert_allclose(a["dc_before"], numeric("c", before), rtol=1e-6, atol=1e-8)
    else:
        np.testing.assert_allclose(a["direct"], numeric("h", before), rtol=1e-6, atol=1e-8)
