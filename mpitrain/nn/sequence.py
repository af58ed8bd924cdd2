"""Layers over time on padded batches of sequences: 1-D convolution and global pooling (docs/sequences.md).

    Conv1D(32, 5, dilation=2)                      # (None, F) -> (None, 32), causal: step t sees steps <= t
    Conv1D(32, 3, stride=2, padding="same")        # (None, F) -> (None, 32), ceil(L / 2) steps
    GlobalMaxPool1D()                              # (None, F) -> (F,): each feature's largest over valid steps

Each keeps the layer contract of docs/sequences.md: `x` is (B, T, F) with `layer.lengths` (B,) set by the model
(None: every step valid), padded steps may hold anything, outputs at valid steps read valid input steps only, the
input gradient is zero at padded steps. A convolution masks its input's padded steps to zero before it convolves, so
its zero padding and a sequence's own padding look alike, and the same sequence gives the same outputs in any batch.

The convolution is an im2col of the kernel's taps (one strided copy per tap, no loop over samples or steps) and
one GEMM (`kernels.gemm.matmul`: BLAS, cuBLAS), its bias and fused activation those of dense (`kernels.activations`). Every
array changes size with T, so it is a grow-only workspace buffer reshaped to the batch (`layers.varying`).
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.kernels.activations import activation_backward, bias_activation
from mpitrain.kernels.broadcast import scale_rows
from mpitrain.kernels.gemm import matmul
from mpitrain.nn.layers import FusesActivation, Layer, initial_weights, is_sequence, layer_type, varying

SEQUENCE_PADDINGS = ("causal", "same", "valid")


def check_sequence(input_shape, layer: str) -> None:
    if not is_sequence(input_shape):
        raise ValueError(f"a {layer} layer takes sequences (None, features), got inputs of shape {list(input_shape)}")


def step_index(ws, steps: int, dtype=np.int64):
    """0 .. steps-1 in the workspace: a cumulative sum of ones, so nothing is allocated. Not a collective."""
    xp = ws.workspace.xp
    ones = ws.at_least("step_ones", steps, dtype)
    ones.fill(1)
    index = ws.at_least("step_index", steps, dtype)
    xp.cumsum(ones, dtype=dtype, out=index)
    index -= 1
    return index


def mean_scales(ws, lengths, rows: int, steps: int, dtype):
    """(rows,) 1 / each sequence's length, the factor of a mean over its valid steps: 1 / `steps` for every row when
    `lengths` is None, and 1 for a sequence of no step (the mean of nothing is the zero its sum is). A workspace
    array `scale`. Not a collective."""
    xp, scale = ws.workspace.xp, ws("scale", (rows,), dtype)
    if lengths is None:
        scale.fill(1 / max(steps, 1))
    else:
        xp.copyto(scale, lengths)
        xp.maximum(scale, 1, out=scale)
        xp.reciprocal(scale, out=scale)
    return scale


def padded_steps(ws, lengths, steps: int):
    """(B, steps) bool, True at each sequence's padded steps (t >= lengths[b]); None when `lengths` is None (every
    step valid). A workspace array. Not a collective.

    The step index and the lengths are first copied out to (B, steps) (a broadcasting copy needs no buffer), so the
    comparison runs on arrays of one shape: numpy's broadcasting ufuncs take a 64 KB buffer per operand each call."""
    if lengths is None:
        return None
    xp, shape = array_module(lengths), (len(lengths), steps)
    index, bound = varying(ws, "step_of", shape, lengths.dtype), varying(ws, "length_of", shape, lengths.dtype)
    xp.copyto(index, step_index(ws, steps, lengths.dtype))
    xp.copyto(bound, lengths[:, None])
    mask = varying(ws, "padded_steps", shape, bool)
    xp.greater_equal(index, bound, out=mask)
    return mask


def _zero_padding(xp, array, mask) -> None:
    """Zero `array` (B, T, F) at the padded steps of `mask` (B, T), in place; nothing where `mask` is None."""
    if mask is not None:
        xp.copyto(array, 0, where=mask[:, :, None])


@layer_type("conv1d")
class Conv1D(FusesActivation):
    """`filters` kernels of `kernel` taps `dilation` steps apart over all F features of a sequence, every `stride`-th
    step, plus a bias each; with `fuse_activation`, the activation layer after it runs here, fused with the bias add.

    The kernel spans `dilation * (kernel - 1) + 1` steps. Paddings, for a sequence of L steps:
    `causal` pads span - 1 zeros on the left (output t sees input steps <= t * stride), ceil(L / stride) steps out;
    `same` pads (span - 1) // 2 on the left and the rest of span - 1 on the right, ceil(L / stride) steps out;
    `valid` pads nothing, floor((L - span) / stride) + 1 steps out, and refuses a sequence shorter than the span.
    The padding is the same for every sequence of a batch (not chosen from L), which keeps a sequence's outputs
    independent of its batch, and ONNX's Conv takes the same pads (`mpitrain.nn.onnx.sequence`).
    `W` is (kernel, F, filters), `b` (filters,).
    """

    not_cut = "its kernel reads steps before a segment's first (or after its last)"

    lengths = None  # the input's (B,) lengths, set by the model before each forward; None: every step valid

    def __init__(self, filters: int, kernel: int, stride: int = 1, dilation: int = 1, padding: str = "causal",
                 activation: str = "none", init: str | None = None):
        if padding not in SEQUENCE_PADDINGS:
            raise ValueError(f"padding {padding!r}, expected one of {SEQUENCE_PADDINGS}")
        for name, value in (("kernel", kernel), ("stride", stride), ("dilation", dilation)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} {value!r}, expected one integer >= 1 (a conv1d slides over steps)")
        self.filters, self.kernel, self.stride, self.dilation, self.padding = filters, kernel, stride, dilation, padding
        self.activation, self.init = activation, init
        self.span = dilation * (kernel - 1) + 1
        self.pad_left = {"causal": self.span - 1, "same": (self.span - 1) // 2, "valid": 0}[padding]
        self.pad_right = 0 if padding == "valid" else self.span - 1 - self.pad_left

    @property
    def keeps_lengths(self) -> bool:
        """Whether every sequence keeps its length: no stride, and a padding that adds the span's steps back."""
        return self.stride == 1 and (self.padding != "valid" or self.span == 1)

    def param_shapes(self, input_shape):
        check_sequence(input_shape, "conv1d")
        return {"W": (self.kernel, input_shape[1], self.filters), "b": (self.filters,)}

    def output_shape(self, input_shape):
        check_sequence(input_shape, "conv1d")
        return (None, self.filters)

    def init_params(self, rng, scheme):
        kernel, features, filters = self.params["W"].shape
        return {"W": initial_weights(rng, self.init or scheme, kernel * features, kernel * filters,
                                     self.params["W"].shape),
                "b": np.zeros(filters)}

    def _check_span(self, steps: int) -> None:
        if steps < self.span:
            raise ValueError(f"conv1d (padding valid, kernel {self.kernel}, dilation {self.dilation}): a sequence of "
                             f"{steps} steps is shorter than the kernel's span of {self.span} steps; expected at least "
                             f"{self.span} (or padding causal or same)")

    def output_steps(self, steps):
        """The output's steps for `steps` input steps (a sequence's length, a batch's padded length, or an array of
        lengths); a ValueError naming the length and the span when one is too short for padding `valid`."""
        if self.padding == "valid":  # a host sync for lengths on a GPU: only where a length can be refused
            self._check_span(steps if isinstance(steps, int) else int(steps.min()))
        return (steps + self.pad_left + self.pad_right - self.span) // self.stride + 1

    def output_lengths(self, lengths):
        """Each output sequence's length: `output_steps` of each of `lengths`."""
        return self.output_steps(lengths)

    def _taps(self, padded, out_steps: int):
        """Per tap k, the (B, out_steps, F) strided view of the padded input that tap reads."""
        d, s = self.dilation, self.stride
        return [padded[:, k * d:k * d + (out_steps - 1) * s + 1:s] for k in range(self.kernel)]

    def forward(self, x, training):
        xp, (n, steps, features) = array_module(x), x.shape
        self.input_shape, out_steps = x.shape, self.output_steps(steps)
        padded = varying(self.ws, "padded", (n, self.pad_left + steps + self.pad_right, features), x.dtype)
        padded[:, :self.pad_left] = 0
        padded[:, self.pad_left + steps:] = 0
        xp.copyto(padded[:, self.pad_left:self.pad_left + steps], x)
        self.mask = padded_steps(self.ws, self.lengths, steps)
        _zero_padding(xp, padded[:, self.pad_left:self.pad_left + steps], self.mask)
        cols = varying(self.ws, "cols", (n, out_steps, self.kernel, features), x.dtype)
        for k, tap in enumerate(self._taps(padded, out_steps)):
            cols[:, :, k] = tap
        self.cols = cols.reshape(n * out_steps, -1)
        self.y = varying(self.ws, "y", (n * out_steps, self.filters), x.dtype)
        matmul(self.cols, self.params["W"].reshape(-1, self.filters), self.y)
        bias_activation(self.y, self.params["b"], self.kind, self.y)
        return self.y.reshape(n, out_steps, self.filters)

    def backward(self, dy, input_grad=True):
        xp, (n, steps, features) = array_module(dy), self.input_shape
        dy = dy.reshape(self.y.shape)
        if self.kind != "none":
            dz = varying(self.ws, "dz", dy.shape, dy.dtype)
            activation_backward(dy, self.y, self.kind, dz)
            dy = dz
        dy.sum(axis=0, out=self.grads["b"])
        matmul(self.cols.T, dy, self.grads["W"].reshape(-1, self.filters))
        if not input_grad:
            return None
        dcols = self.cols  # forward's windows, read for the last time above
        matmul(dy, self.params["W"].reshape(-1, self.filters).T, dcols)
        dcols = dcols.reshape(n, -1, self.kernel, features)
        dpadded = varying(self.ws, "padded", (n, self.pad_left + steps + self.pad_right, features), dy.dtype)
        dpadded.fill(0)  # forward's padded input, copied into its windows long ago
        for k, tap in enumerate(self._taps(dpadded, dcols.shape[1])):
            tap += dcols[:, :, k]
        dx = varying(self.ws, "dx", self.input_shape, dy.dtype)
        xp.copyto(dx, dpadded[:, self.pad_left:self.pad_left + steps])
        _zero_padding(xp, dx, self.mask)
        return dx


class _GlobalPool1D(Layer):
    """A sequence (None, F) to one vector (F,) per row, over each sequence's valid steps."""

    not_cut = "it reduces a whole sequence, which no segment holds"

    lengths = None  # the input's (B,) lengths, set by the model before each forward; None: every step valid

    def output_shape(self, input_shape):
        check_sequence(input_shape, type(self).__name__.lower())
        return (input_shape[1],)

    def _masked(self, x, fill: float):
        """`x` with its padded steps set to `fill` (a workspace copy), or `x` itself when every step is valid."""
        self.input_shape = x.shape
        self.mask = padded_steps(self.ws, self.lengths, x.shape[1])
        if self.mask is None:
            return x
        xp, masked = array_module(x), varying(self.ws, "masked", x.shape, x.dtype)
        xp.copyto(masked, x)
        xp.copyto(masked, fill, where=self.mask[:, :, None])
        return masked


@layer_type("global_max_pool")
class GlobalMaxPool1D(_GlobalPool1D):
    """Each feature's largest value over a sequence's valid steps; its gradient goes to that (first largest) step.
    An empty sequence (a bag column's empty list) gives zeros and no gradient, as an empty bag's max does in
    `embedding_bag` and PyTorch's `nn.EmbeddingBag`.

    numpy's argmax over the middle (time) axis copies its input to a temporary first; the rest runs in the
    workspace."""

    def forward(self, x, training):
        xp = array_module(x)
        x = self._masked(x, -math.inf)
        self.where = self.ws("where", (len(x), x.shape[2]), np.int64)
        xp.argmax(x, axis=1, out=self.where)
        y = self.ws("y", self.where.shape, x.dtype)
        xp.max(x, axis=1, out=y)
        if self.mask is not None:
            empty = self.ws("empty", (len(x), 1), bool)
            xp.equal(self.lengths[:, None], 0, out=empty)
            xp.copyto(y, 0, where=empty)
            xp.copyto(self.where, -1, where=empty)  # no step is the maximum: backward gives it no gradient
        return y

    def backward(self, dy, input_grad=True):
        xp = array_module(dy)
        elsewhere = varying(self.ws, "elsewhere", self.input_shape, bool)  # not the step of the maximum
        xp.not_equal(step_index(self.ws, self.input_shape[1])[None, :, None], self.where[:, None, :], out=elsewhere)
        dx = varying(self.ws, "dx", self.input_shape, dy.dtype)
        xp.copyto(dx, dy[:, None, :])
        xp.copyto(dx, 0, where=elsewhere)
        return dx


@layer_type("global_avg_pool")
class GlobalAvgPool1D(_GlobalPool1D):
    """Each feature's mean over a sequence's valid steps (sum, then times 1 / length); the gradient spreads evenly
    over them."""

    def forward(self, x, training):
        n, steps, features = x.shape
        x = self._masked(x, 0.0)
        self.scale = mean_scales(self.ws, self.lengths, n, steps, x.dtype)
        y = self.ws("y", (n, features), x.dtype)
        x.sum(axis=1, out=y)
        scale_rows(y, self.scale, y)
        return y

    def backward(self, dy, input_grad=True):
        xp = array_module(dy)
        dx = varying(self.ws, "dx", self.input_shape, dy.dtype)
        xp.copyto(dx, dy[:, None, :])  # a broadcasting copy takes no buffer; a broadcasting multiply would
        scale_rows(dx.reshape(len(dx), -1), self.scale, dx.reshape(len(dx), -1))
        _zero_padding(xp, dx, self.mask)
        return dx
