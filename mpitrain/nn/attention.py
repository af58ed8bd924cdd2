"""Multi-head scaled dot-product self-attention over a sequence (Vaswani et al. 2017), PyTorch's
`nn.MultiheadAttention(F, heads, batch_first=True)` on (x, x, x) with a key padding mask.

    {type: attention, heads: 4}                       # every step attends to every valid step
    {type: attention, heads: 4, causal: true}         # step t attends to steps <= t (a decoder's mask)
    {type: attention, heads: 4, rate: 0.1}            # dropout on the attention weights in training

For a sequence (None, F), F = heads x head width: each step's query, key and value come from one GEMM of the
(B T, F) rows with `W` (F, 3F) plus `b`, split into `heads` heads of F / heads; each head's scores Q K^T / sqrt(F /
heads) take a softmax over the keys a query sees (`mpitrain.kernels.attention`: a sequence's valid steps, and with
`causal` only those up to the query's own), their weights average the values, and the heads' outputs, side by side,
go through `W_out` (F, F) plus `b_out`. A padded step is never attended to, so the outputs at valid steps do not
depend on how far a batch is padded, as the recurrent layers' do not; a padded query's output reaches nobody and
its gradient rows are zero. The GEMMs are numpy's (BLAS) on (B, heads, T, width) arrays of the workspace (grow-only,
as T changes from batch to batch); the softmax and its backward are numba kernels. Dropout on the weights draws its
mask from the step's key, as the dropout layer does.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.kernels.activations import bias_activation
from mpitrain.kernels.attention import masked_softmax, softmax_backward
from mpitrain.kernels.gemm import matmul
from mpitrain.nn.layers import DROPOUT_BLOCKER, Layer, initial_weights, is_sequence, keyed_dropout, layer_type, varying
from mpitrain.nn.merge import Merge


@layer_type("attention")
class Attention(Layer):
    """Self-attention of `heads` heads over a sequence (None, F), optionally `causal`, with dropout `rate` on the
    attention weights; see the module docstring."""

    not_cut = "a step attends to steps in other segments"

    def __init__(self, heads: int = 1, causal: bool = False, rate: float = 0.0, init: str | None = None):
        if not (isinstance(heads, int) and not isinstance(heads, bool) and heads >= 1):
            raise ValueError(f"heads {heads!r}, expected an integer >= 1")
        if not 0 <= rate < 1:
            raise ValueError(f"rate {rate!r}, expected a number in [0, 1)")
        self.heads, self.causal, self.rate, self.init = heads, causal, rate, init

    @property
    def capture_blocker(self) -> str | None:
        return DROPOUT_BLOCKER if self.rate else None

    def param_shapes(self, input_shape):
        if not is_sequence(input_shape):
            raise ValueError(f"an attention layer reads a sequence (None, F), not inputs of shape {list(input_shape)}")
        features = input_shape[1]
        if features % self.heads:
            raise ValueError(f"{features} features do not split into {self.heads} heads; expected heads to divide "
                             "the input's features (a dense layer before it can set them)")
        self.features, self.width = features, features // self.heads
        return {"W": (features, 3 * features), "b": (3 * features,), "W_out": (features, features),
                "b_out": (features,)}

    def output_shape(self, input_shape):
        return input_shape

    def init_params(self, rng, scheme):
        f = self.features
        return {"W": initial_weights(rng, self.init or scheme, f, f, (f, 3 * f)), "b": np.zeros(3 * f),
                "W_out": initial_weights(rng, self.init or scheme, f, f, (f, f)), "b_out": np.zeros(f)}

    def _array(self, name: str, shape, dtype):
        return varying(self.ws, name, shape, dtype)

    def forward(self, x, training):
        batch, steps, f = x.shape
        self.x = x.reshape(batch * steps, f)
        qkv = self._array("qkv", (batch * steps, 3 * f), x.dtype)
        matmul(self.x, self.params["W"], qkv)
        bias_activation(qkv, self.params["b"], "none", qkv)  # numpy's broadcast add would take a buffer
        parts = qkv.reshape(batch, steps, 3, self.heads, self.width)
        return self._attend(*(self._heads(name, parts[:, :, i]) for i, name in enumerate("qkv")), self.lengths,
                            training)

    def backward(self, dy, input_grad=True):
        xp = array_module(dy)
        batch, steps, f = dy.shape
        dqkv = self._array("dqkv", (batch, steps, 3, self.heads, self.width), dy.dtype)
        for i, part in enumerate(self._attend_backward(dy)):
            xp.copyto(dqkv[:, :, i], part.transpose(0, 2, 1, 3))
        dqkv = dqkv.reshape(batch * steps, 3 * f)
        matmul(self.x.T, dqkv, self.grads["W"])
        dqkv.sum(axis=0, out=self.grads["b"])
        if not input_grad:
            return None
        dx = self._array("dx", (batch * steps, f), dy.dtype)
        matmul(dqkv, self.params["W"].T, dx)
        return dx.reshape(batch, steps, f)

    def _heads(self, name: str, rows):
        """(B, heads, T, width) workspace array `name` of projected rows (B, T, heads, width): one head's steps
        contiguous, as the batched GEMMs take them."""
        part = self._array(name, (rows.shape[0], self.heads, rows.shape[1], self.width), rows.dtype)
        array_module(rows).copyto(part, rows.transpose(0, 2, 1, 3))
        return part

    def _attend(self, q, k, v, key_lengths, training: bool):
        """The output (B, Tq, F) of the heads' queries `q` (B, heads, Tq, width) over keys `k` and values `v`
        (B, heads, Tk, width) of `key_lengths` (None: every key valid): the masked softmax of the scaled scores,
        dropout on the weights in training, the weighted values, `W_out` and `b_out`. Keeps what backward needs."""
        xp, dtype = array_module(q), q.dtype
        batch, heads, queries, width = q.shape
        keys, f = k.shape[2], heads * width
        self.q, self.k, self.v = q, k, v
        q *= dtype.type(1 / math.sqrt(width))  # the scores' scale, on the queries
        self.p = self._array("p", (batch, heads, queries, keys), dtype)
        matmul(q, k.transpose(0, 1, 3, 2), self.p)
        masked_softmax(self.p, key_lengths, self.causal, self.p)
        self.weights = self.p
        if training and self.rate:
            self.mask = self._array("mask", self.p.shape, dtype)
            self.weights = self._array("dropped", self.p.shape, dtype)
            rows = (batch * heads * queries, keys)
            keyed_dropout(self.p.reshape(rows), self.key, self.rate, self.weights.reshape(rows),
                          self.mask.reshape(rows))
        else:
            self.mask = None
        heads_out = self._array("heads_out", (batch, heads, queries, width), dtype)
        matmul(self.weights, v, heads_out)
        self.o = self._array("o", (batch, queries, heads, width), dtype)
        xp.copyto(self.o, heads_out.transpose(0, 2, 1, 3))
        self.o = self.o.reshape(batch * queries, f)
        y = self._array("y", (batch * queries, f), dtype)
        matmul(self.o, self.params["W_out"], y)
        bias_activation(y, self.params["b_out"], "none", y)
        return y.reshape(batch, queries, f)

    def _attend_backward(self, dy):
        """(dq, dk, dv), each (B, heads, T, width), from the output's gradient `dy` (B, Tq, F); writes `W_out`'s
        and `b_out`'s gradients."""
        xp = array_module(dy)
        batch, queries, f = dy.shape
        heads, width, keys = self.heads, self.width, self.k.shape[2]
        dy = dy.reshape(batch * queries, f)
        matmul(self.o.T, dy, self.grads["W_out"])
        dy.sum(axis=0, out=self.grads["b_out"])
        do = self._array("do", (batch * queries, f), dy.dtype)
        matmul(dy, self.params["W_out"].T, do)
        d_heads = self._array("d_heads", (batch, heads, queries, width), dy.dtype)
        xp.copyto(d_heads, do.reshape(batch, queries, heads, width).transpose(0, 2, 1, 3))
        dv = self._array("dv", (batch, heads, keys, width), dy.dtype)
        matmul(self.weights.transpose(0, 1, 3, 2), d_heads, dv)
        dp = self._array("dp", (batch, heads, queries, keys), dy.dtype)
        matmul(d_heads, self.v.transpose(0, 1, 3, 2), dp)
        if self.mask is not None:
            dp *= self.mask
        softmax_backward(dp, self.p, dp)  # the scores' gradient (the scale is on the queries)
        dq, dk = self._array("dq", self.q.shape, dy.dtype), self._array("dk", self.k.shape, dy.dtype)
        matmul(dp, self.k, dq)
        dq *= dy.dtype.type(1 / math.sqrt(width))
        matmul(dp.transpose(0, 1, 3, 2), self.q, dk)  # q holds the scale already
        return dq, dk, dv


class CrossAttention(Attention, Merge):
    """Attention of one sequence's steps (the queries, `inputs[0]`, (None, F)) over another's (the keys and values,
    `inputs[1]`, (None, F_m)): a graph node `{type: attention, inputs: [queries, memory]}`, PyTorch's
    `nn.MultiheadAttention(F, heads, kdim=F_m, vdim=F_m, batch_first=True)` on (x, m, m) with m's key padding
    mask. `W_q` (F, F) projects the queries, `W_kv` (F_m, 2F) the memory's keys and values (one GEMM), `b` (3F) is
    their biases in PyTorch's order (q, k, v); the rest is self-attention's. A query sees the memory's valid steps;
    the output has the queries' steps and lengths, so the two sequences may differ in length. No causal mask: a
    query's step and a memory step are not on one time axis."""

    input_count = 2
    shares_lengths = False  # the output carries the queries' lengths; the memory has its own

    def __init__(self, heads: int = 1, causal: bool = False, rate: float = 0.0, init: str | None = None):
        if causal:
            raise ValueError("causal masks later steps of one sequence; cross-attention's queries and keys are two "
                             "sequences, expected causal: false")
        super().__init__(heads, causal, rate, init)

    def merged_shape(self, shapes):
        if not all(map(is_sequence, shapes)):
            raise ValueError(f"cross-attention reads two sequences (None, F), the queries and the memory, not inputs "
                             f"of shape {[list(shape) for shape in shapes]}")
        self.memory_features = shapes[1][1]
        return shapes[0]

    def param_shapes(self, input_shape):
        shapes = super().param_shapes(input_shape)
        f = self.features
        return {"W_q": (f, f), "W_kv": (self.memory_features, 2 * f), **{k: shapes[k] for k in ("b", "W_out", "b_out")}}

    def init_params(self, rng, scheme):
        f, m = self.features, self.memory_features
        return {"W_q": initial_weights(rng, self.init or scheme, f, f, (f, f)),
                "W_kv": initial_weights(rng, self.init or scheme, m, f, (m, 2 * f)), "b": np.zeros(3 * f),
                "W_out": initial_weights(rng, self.init or scheme, f, f, (f, f)), "b_out": np.zeros(f)}

    def forward(self, xs, training):
        x, memory = xs
        f = self.features
        (batch, queries, _), keys = x.shape, memory.shape[1]
        self.x, self.memory = x.reshape(batch * queries, f), memory.reshape(batch * keys, self.memory_features)
        q = self._array("q_rows", (batch * queries, f), x.dtype)
        matmul(self.x, self.params["W_q"], q)
        bias_activation(q, self.params["b"][:f], "none", q)
        kv = self._array("kv_rows", (batch * keys, 2 * f), x.dtype)
        matmul(self.memory, self.params["W_kv"], kv)
        bias_activation(kv, self.params["b"][f:], "none", kv)
        parts = kv.reshape(batch, keys, 2, self.heads, self.width)
        return self._attend(self._heads("q", q.reshape(batch, queries, self.heads, self.width)),
                            self._heads("k", parts[:, :, 0]), self._heads("v", parts[:, :, 1]),
                            self.input_lengths[1], training)

    def backward(self, dy, input_grads):
        xp, f = array_module(dy), self.features
        batch, queries, _ = dy.shape
        keys = self.k.shape[2]
        dq_heads, dk, dv = self._attend_backward(dy)
        dq = self._array("dq_rows", (batch, queries, self.heads, self.width), dy.dtype)
        xp.copyto(dq, dq_heads.transpose(0, 2, 1, 3))
        dq = dq.reshape(batch * queries, f)
        dkv = self._array("dkv_rows", (batch, keys, 2, self.heads, self.width), dy.dtype)
        for i, part in enumerate((dk, dv)):
            xp.copyto(dkv[:, :, i], part.transpose(0, 2, 1, 3))
        dkv = dkv.reshape(batch * keys, 2 * f)
        matmul(self.x.T, dq, self.grads["W_q"])
        matmul(self.memory.T, dkv, self.grads["W_kv"])
        dq.sum(axis=0, out=self.grads["b"][:f])
        dkv.sum(axis=0, out=self.grads["b"][f:])
        grads = [None, None]
        if input_grads[0]:
            grads[0] = self._array("dx", (batch * queries, f), dy.dtype).reshape(batch, queries, f)
            matmul(dq, self.params["W_q"].T, grads[0].reshape(batch * queries, f))
        if input_grads[1]:
            m = self.memory_features
            grads[1] = self._array("dmemory", (batch * keys, m), dy.dtype).reshape(batch, keys, m)
            matmul(dkv, self.params["W_kv"].T, grads[1].reshape(batch * keys, m))
        return grads


Attention.joined_by = CrossAttention
