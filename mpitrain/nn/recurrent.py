"""Recurrent layers on sequences: `lstm` and `gru` (docs/sequences.md, "Recurrent layers").

    LSTM(64)                                             # (None, F) -> (64,): each sequence's last state
    GRU(32, return_sequences=True, bidirectional=True)   # (None, F) -> (None, 64): forward then backward states

Both keep the sequence layer contract (docs/sequences.md): `forward` gets `x` (B, T, F) and the model's
`lengths` (B,); a sequence's state stops changing after its last valid step, so its outputs at valid steps, its
last state and every gradient depend only on its valid steps. Without `lengths` (a layer used on its own) every
sequence has all T steps.

Parameters are per direction, in ONNX's gate order so that export copies them (transposed): LSTM gates i, o, f, c
in `W` (F, 4H), `R` (H, 4H), `b` (4H,); GRU gates z, r, h in `W` (F, 3H), `R` (H, 3H), `bW` (3H,), `bR` (3H,),
with ONNX's `linear_before_reset` (PyTorch's and cuDNN's GRU). A bidirectional layer has a second set whose names
end `_reverse`. Initialization: `W` by the model's scheme (or `init`) with fan-in F and fan-out the gates' columns,
each gate's block of `R` an orthogonal (H, H) matrix, biases zero but the LSTM's forget gate's, 1.0 (Jozefowicz et
al. 2015: a new LSTM then keeps its cell state instead of forgetting it at every step).

Speed: the input projections of all steps and the parameter gradients are one matmul each over (T*B) rows per
direction; each time step is one (B, H) x (H, gates*H) matmul plus the gate work (`mpitrain.kernels.recurrent`:
ufuncs forward, a numba kernel backward), into workspace arrays (`ws.at_least`, reshaped to the batch's T). A Python
loop runs over time steps, never over samples.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.kernels.gemm import matmul
from mpitrain.kernels.recurrent import gru_step, gru_step_backward, lstm_step, lstm_step_backward
from mpitrain.nn.layers import Layer, initial_weights, layer_type


class Recurrent(Layer):
    """What LSTM and GRU share: the parameters per direction, the masked loop over time steps forward and backward,
    the batched input projection and parameter gradients. A subclass gives the gates (`gates`, `states`, `saved`,
    the bias names) and one time step each way (`step`, `step_backward`), on (B, ...) arrays of one step.

    Arrays of the loop, per direction, time-major: `gates` (T, B, G*H) the input projections plus input bias, turned
    in place into the gates' activations by `step`; each state (T+1, B, H) (state `k` before time step `k` going
    forward, after time step `k` going backward: the reverse direction runs from T-1 down to 0); `saved` (T, B, H)
    what `step_backward` needs besides. Padded steps of `x` are zeroed first (padding may hold NaN), and the states
    are carried over them unchanged. The forward direction's states start at zero, or at `initial_states` when set
    (truncated BPTT's states carried from the segment before: inputs, not backpropagated into); `final_states` gives
    them after the last forward.
    """

    gates = 0
    states: tuple[str, ...] = ("h",)
    saved: tuple[str, ...] = ()
    input_bias = "b"
    recurrent_bias: str | None = None
    lengths = None  # (B,) ints, set by the model before each forward
    initial_states = None  # {state: (B, H)} to start the forward direction from (truncated BPTT), else zeros
    _step_numbers = None  # 0, 1, ... on the layer's device, as long as the longest batch yet

    def __init__(self, units: int, return_sequences: bool = False, bidirectional: bool = False,
                 init: str | None = None):
        self.units, self.return_sequences, self.bidirectional, self.init = units, return_sequences, bidirectional, init
        self.directions = ("", "_reverse") if bidirectional else ("",)

    def param_shapes(self, input_shape):
        if len(input_shape) != 2 or input_shape[0] is not None:
            raise ValueError(f"expected sequences, of shape [None, features], not {list(input_shape)}")
        features, columns = input_shape[1], self.gates * self.units
        shapes = {}
        for d in self.directions:
            shapes |= {f"W{d}": (features, columns), f"R{d}": (self.units, columns), f"{self.input_bias}{d}": (columns,)}
            if self.recurrent_bias:
                shapes[f"{self.recurrent_bias}{d}"] = (columns,)
        return shapes

    def output_shape(self, input_shape):
        self.param_shapes(input_shape)  # the same check
        width = self.units * len(self.directions)
        return (None, width) if self.return_sequences else (width,)

    def init_params(self, rng, scheme):
        values = {}
        for d in self.directions:
            features, columns = self.params[f"W{d}"].shape
            values[f"W{d}"] = initial_weights(rng, self.init or scheme, features, columns, (features, columns))
            values[f"R{d}"] = np.concatenate([orthogonal(rng, self.units) for _ in range(self.gates)], axis=1)
            values[f"{self.input_bias}{d}"] = self.initial_bias()
            if self.recurrent_bias:
                values[f"{self.recurrent_bias}{d}"] = np.zeros(columns)
        return values

    def initial_bias(self) -> np.ndarray:
        return np.zeros(self.gates * self.units)

    def _array(self, name: str, shape: tuple, dtype):
        """Workspace array `name` of `shape`: the front of a grow-only buffer, since T changes from batch to batch."""
        return self.ws.at_least(name, math.prod(shape), dtype).reshape(shape)

    def forward(self, x, training):
        xp = array_module(x)
        batch, steps, features = x.shape
        units, columns = self.units, self.gates * self.units
        self.x = self._array("x", (steps, batch, features), x.dtype)  # time-major, padding zeroed
        xp.copyto(self.x, x.transpose(1, 0, 2))
        self.padded = self._padded(xp, batch, steps)
        xp.copyto(self.x, 0, where=self.padded)
        width = units * len(self.directions)
        y = self._array("y", (batch, steps, width) if self.return_sequences else (batch, width), x.dtype)
        self.loops = []
        for k, d in enumerate(self.directions):
            p = {name: self.params[f"{name}{d}"] for name in ("W", "R", self.input_bias, self.recurrent_bias) if name}
            gates = self._array(f"gates{d}", (steps, batch, columns), x.dtype)
            matmul(self.x.reshape(-1, features), p["W"], gates.reshape(-1, columns))
            gates += p[self.input_bias]
            states = {s: self._array(f"{s}{d}", (steps + 1, batch, units), x.dtype) for s in self.states}
            saved = {s: self._array(f"{s}{d}", (steps, batch, units), x.dtype) for s in self.saved}
            reverse = bool(d)
            for name, state in states.items():
                start = None if reverse or self.initial_states is None else self.initial_states[name]
                state[steps if reverse else 0] = 0 if start is None else start
            for t in _time_steps(steps, reverse):
                self.step(xp, p, gates, states, saved, t, t + reverse, t + 1 - reverse)
            h = states["h"]
            if self.return_sequences:
                xp.copyto(y[:, :, k * units:(k + 1) * units], h[1 - reverse:steps + 1 - reverse].transpose(1, 0, 2))
            else:
                xp.copyto(y[:, k * units:(k + 1) * units], h[0 if reverse else steps])
            self.loops.append((d, p, gates, states, saved))
        return y

    def final_states(self) -> dict:
        """{state: (B, H)} of the forward direction after the last forward: each sequence's state after its last valid
        step (frozen past its end). Views of the workspace, overwritten by the next forward: copy them to keep them
        (truncated BPTT starts the next segment from them, `initial_states`). Not a collective."""
        _, _, _, states, _ = self.loops[0]
        return {name: state[-1] for name, state in states.items()}

    def _padded(self, xp, batch: int, steps: int):
        """(T, B, 1) bools: step t of sequence b is padding (t >= lengths[b])."""
        padded = self.ws.at_least("padded", steps * batch, bool).reshape(steps, batch, 1)
        if self.lengths is None:
            padded[...] = False
        else:
            if self._step_numbers is None or len(self._step_numbers) < steps:  # made again only for a longer batch
                self._step_numbers = xp.arange(steps)
            xp.greater_equal(self._step_numbers[:steps, None], self.lengths[None, :], out=padded[:, :, 0])
        return padded

    def backward(self, dy, input_grad=True):
        xp = array_module(dy)
        steps, batch, features = self.x.shape
        units, columns = self.units, self.gates * self.units
        dx = self._array("dx_time", (steps, batch, features), dy.dtype) if input_grad else None
        for k, (d, p, gates, states, saved) in enumerate(self.loops):
            reverse = bool(d)
            grad_in = self._array("grad_in", (steps, batch, columns), dy.dtype)  # d loss / d pre-activations, x side
            grad_rec = grad_in if self.recurrent_bias is None else \
                self._array("grad_rec", (steps, batch, columns), dy.dtype)  # ... recurrent side (GRU's differ)
            carry = {s: self._array(f"d{s}", (batch, units), dy.dtype) for s in self.states}
            into = {s: self._array(f"d{s}_before", (batch, units), dy.dtype) for s in self.states}
            for g in carry.values():
                g[...] = 0
            if not self.return_sequences:
                carry["h"][...] = dy[:, k * units:(k + 1) * units]
            for t in reversed(_time_steps(steps, reverse)):
                if self.return_sequences:
                    carry["h"] += dy[:, t, k * units:(k + 1) * units]
                self.step_backward(xp, p, gates, states, saved, carry, into, grad_in, grad_rec, t, t + reverse)
                carry, into = into, carry
            previous = states["h"][reverse:steps + reverse].reshape(-1, units)  # h before each time step
            matmul(self.x.reshape(-1, features).T, grad_in.reshape(-1, columns), self.grads[f"W{d}"])
            matmul(previous.T, grad_rec.reshape(-1, columns), self.grads[f"R{d}"])
            grad_in.reshape(-1, columns).sum(axis=0, out=self.grads[f"{self.input_bias}{d}"])
            if self.recurrent_bias:
                grad_rec.reshape(-1, columns).sum(axis=0, out=self.grads[f"{self.recurrent_bias}{d}"])
            if input_grad:
                if k == 0:
                    matmul(grad_in.reshape(-1, columns), p["W"].T, dx.reshape(-1, features))
                else:
                    dx_reverse = self._array("dx_reverse", (steps, batch, features), dy.dtype)
                    matmul(grad_in.reshape(-1, columns), p["W"].T, dx_reverse.reshape(-1, features))
                    dx += dx_reverse
        if not input_grad:
            return None
        out = self._array("dx", (batch, steps, features), dy.dtype)
        xp.copyto(out, dx.transpose(1, 0, 2))
        return out

    def step(self, xp, p: dict, gates, states: dict, saved: dict, t: int, before: int, after: int) -> None:
        """Time step t forward (kernels/recurrent.py): gates[t] (B, G*H) holds the input projection plus input bias and
        becomes the gates' activations; the states' rows `before` (T + 1, B, H) give their rows `after`, carried over
        where the sequence is padded; `saved` keeps what `step_backward` needs at row t."""
        recurrent = self._scratch("recurrent", gates[t])
        matmul(states["h"][before], p["R"], recurrent)
        self.gate_step(p, gates, recurrent, states, saved, t, before, after)

    def step_backward(self, xp, p: dict, gates, states: dict, saved: dict, carry: dict, into: dict, grad_in,
                      grad_rec, t: int, before: int) -> None:
        """Time step t backward: from `carry` (the loss's gradients of the states after the step) write the gradients
        of the pre-activations into grad_in[t] and grad_rec[t] (the input and recurrent sides: the same array for an
        LSTM), zero where padded, and of the states before the step into `into`, where padded `carry` unchanged.
        `carry` is only read."""
        direct = self._scratch("direct", carry["h"])
        self.gate_step_backward(gates, states, saved, carry, into, grad_in, grad_rec, direct, t, before)
        matmul(grad_rec[t], p["R"].T, into["h"])
        into["h"] += direct

    def gate_step(self, p: dict, gates, recurrent, states: dict, saved: dict, t: int, before: int,
                  after: int) -> None:
        """The gate work of `step` after its matmul `recurrent` = h R: the layer's step kernel."""
        raise NotImplementedError

    def gate_step_backward(self, gates, states: dict, saved: dict, carry: dict, into: dict, grad_in, grad_rec,
                           direct, t: int, before: int) -> None:
        """The gate work of `step_backward` before its matmul: the layer's step kernel, writing the hidden state's
        own part of its gradient into `direct`, to which grad_rec[t] R^T is added."""
        raise NotImplementedError

    def _scratch(self, name: str, like):
        return self._array(name, like.shape, like.dtype)


@layer_type("lstm")
class LSTM(Recurrent):
    """Long short-term memory, gates i, o, f, c (ONNX's order), no peepholes:

        z = x W + h R + b;  i, o, f = sigmoid(z_i, z_o, z_f);  g = tanh(z_c)
        c' = f * c + i * g;  h' = o * tanh(c')
    """

    gates = 4
    states = ("h", "c")
    saved = ("tanh_c",)

    def initial_bias(self):
        bias = np.zeros(self.gates * self.units)
        bias[2 * self.units:3 * self.units] = 1.0  # the forget gate
        return bias

    def gate_step(self, p, gates, recurrent, states, saved, t, before, after):
        lstm_step(gates, recurrent, states["h"], states["c"], saved["tanh_c"], self.padded, t, before, after)

    def gate_step_backward(self, gates, states, saved, carry, into, grad_in, grad_rec, direct, t, before):
        lstm_step_backward(gates, states["c"], saved["tanh_c"], carry["h"], carry["c"], grad_in, into["c"], direct,
                           self.padded, t, before)


@layer_type("gru")
class GRU(Recurrent):
    """Gated recurrent unit, gates z, r, h (ONNX's order), the reset gate applied after the recurrent product
    (ONNX's `linear_before_reset=1`, as PyTorch and cuDNN):

        z, r = sigmoid(x W_zr + bW_zr + h R_zr + bR_zr);  n = tanh(x W_h + bW_h + r * (h R_h + bR_h))
        h' = (1 - z) * n + z * h
    """

    gates = 3
    saved = ("recurrent_h",)  # h R_h + bR_h, which the reset gate multiplied
    input_bias = "bW"
    recurrent_bias = "bR"

    def gate_step(self, p, gates, recurrent, states, saved, t, before, after):
        gru_step(gates, recurrent, p["bR"], states["h"], saved["recurrent_h"], self.padded, t, before, after)

    def gate_step_backward(self, gates, states, saved, carry, into, grad_in, grad_rec, direct, t, before):
        gru_step_backward(gates, states["h"], saved["recurrent_h"], carry["h"], grad_in, grad_rec, direct,
                          self.padded, t, before)


def _time_steps(steps: int, reverse: bool) -> range:
    """The time steps in the order a direction runs them."""
    return range(steps - 1, -1, -1) if reverse else range(steps)


def orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    """A random (n, n) orthogonal matrix (Q of a Gaussian matrix's QR, signs fixed so that it is uniformly drawn)."""
    q, r = np.linalg.qr(rng.normal(size=(n, n)))
    return q * np.sign(np.diag(r))
