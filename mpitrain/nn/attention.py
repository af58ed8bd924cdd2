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
from mpitrain.kernels.attention import masked_softmax, softmax_backward
from mpitrain.nn.layers import Layer, initial_weights, is_sequence, keyed_dropout, layer_type, varying


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
        xp = array_module(x)
        batch, steps, f = x.shape
        heads, width = self.heads, self.width
        self.x = x.reshape(batch * steps, f)
        qkv = self._array("qkv", (batch * steps, 3 * f), x.dtype)
        xp.matmul(self.x, self.params["W"], out=qkv)
        qkv += self.params["b"]
        parts = qkv.reshape(batch, steps, 3, heads, width)
        self.q, self.k, self.v = (self._array(name, (batch, heads, steps, width), x.dtype) for name in "qkv")
        for i, part in enumerate((self.q, self.k, self.v)):
            xp.copyto(part, parts[:, :, i].transpose(0, 2, 1, 3))
        self.q *= x.dtype.type(1 / math.sqrt(width))  # the scores' scale, on the queries
        self.p = self._array("p", (batch, heads, steps, steps), x.dtype)
        xp.matmul(self.q, self.k.transpose(0, 1, 3, 2), out=self.p)
        masked_softmax(self.p, self.lengths, self.causal, self.p)
        self.weights = self.p
        if training and self.rate:
            self.mask = self._array("mask", self.p.shape, x.dtype)
            self.weights = self._array("dropped", self.p.shape, x.dtype)
            rows = (batch * heads * steps, steps)
            keyed_dropout(self.p.reshape(rows), self.key, self.rate, self.weights.reshape(rows),
                          self.mask.reshape(rows))
        else:
            self.mask = None
        heads_out = self._array("heads_out", (batch, heads, steps, width), x.dtype)
        xp.matmul(self.weights, self.v, out=heads_out)
        self.o = self._array("o", (batch, steps, heads, width), x.dtype)
        xp.copyto(self.o, heads_out.transpose(0, 2, 1, 3))
        self.o = self.o.reshape(batch * steps, f)
        y = self._array("y", (batch * steps, f), x.dtype)
        xp.matmul(self.o, self.params["W_out"], out=y)
        y += self.params["b_out"]
        return y.reshape(batch, steps, f)

    def backward(self, dy, input_grad=True):
        xp = array_module(dy)
        batch, steps, f = dy.shape
        heads, width = self.heads, self.width
        dy = dy.reshape(batch * steps, f)
        xp.matmul(self.o.T, dy, out=self.grads["W_out"])
        dy.sum(axis=0, out=self.grads["b_out"])
        do = self._array("do", (batch * steps, f), dy.dtype)
        xp.matmul(dy, self.params["W_out"].T, out=do)
        d_heads = self._array("d_heads", (batch, heads, steps, width), dy.dtype)
        xp.copyto(d_heads, do.reshape(batch, steps, heads, width).transpose(0, 2, 1, 3))
        dqkv = self._array("dqkv", (batch, steps, 3, heads, width), dy.dtype)
        dv = self._array("dv", (batch, heads, steps, width), dy.dtype)
        xp.matmul(self.weights.transpose(0, 1, 3, 2), d_heads, out=dv)
        dp = self._array("dp", (batch, heads, steps, steps), dy.dtype)
        xp.matmul(d_heads, self.v.transpose(0, 1, 3, 2), out=dp)
        if self.mask is not None:
            dp *= self.mask
        softmax_backward(dp, self.p, dp)  # the scores' gradient (the scale is on the queries)
        dq, dk = (self._array(name, (batch, heads, steps, width), dy.dtype) for name in ("dq", "dk"))
        xp.matmul(dp, self.k, out=dq)
        dq *= dy.dtype.type(1 / math.sqrt(width))
        xp.matmul(dp.transpose(0, 1, 3, 2), self.q, out=dk)  # q holds the scale already
        for i, part in enumerate((dq, dk, dv)):
            xp.copyto(dqkv[:, :, i], part.transpose(0, 2, 1, 3))
        dqkv = dqkv.reshape(batch * steps, 3 * f)
        xp.matmul(self.x.T, dqkv, out=self.grads["W"])
        dqkv.sum(axis=0, out=self.grads["b"])
        if not input_grad:
            return None
        dx = self._array("dx", (batch * steps, f), dy.dtype)
        xp.matmul(dqkv, self.params["W"].T, out=dx)
        return dx.reshape(batch, steps, f)
