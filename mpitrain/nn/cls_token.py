"""A learned `[CLS]` token (BERT's, ViT's, FT-Transformer's): a step of its own put before every sequence, whose
output after attention is the sequence's summary.

    {type: cls_token}     # (None, F) -> (None, F): a learned vector `token` (F,) as step 0, the input's steps after it
    {type: cls_pool}      # (None, F) -> (F,): step 0's features, the [CLS] token's output

`cls_token` lengthens every sequence by one (lengths + 1; a sequence with every step valid stays so), so in a graph
its output no longer merges step by step with its input's column. The token starts Normal(0, 0.02), as BERT's
embeddings. Put it before the positions (`positional`, whose `max_steps: auto` counts it) and the transformer
blocks, and `cls_pool` after them; `global_avg_pool` over the valid steps is the other pooling.
"""
from __future__ import annotations

from mpitrain.base.arrays import array_module
from mpitrain.nn.layers import Layer, layer_type, varying
from mpitrain.nn.sequence import check_sequence


@layer_type("cls_token")
class ClsToken(Layer):
    """Step 0 a learned `token` (F,), steps 1.. the input's; see the module docstring."""

    keeps_lengths = False
    not_cut = "it puts a step before the whole sequence, which no segment holds"

    def param_shapes(self, input_shape):
        check_sequence(input_shape, "cls_token")
        return {"token": (input_shape[1],)}

    def init_params(self, rng, scheme):
        return {"token": rng.normal(0.0, 0.02, size=self.params["token"].shape)}

    def output_lengths(self, lengths):
        """One step more than each input sequence: a workspace array when the lengths are the model's."""
        xp = array_module(lengths)
        longer = varying(self.ws, "lengths", lengths.shape, lengths.dtype)
        xp.add(lengths, 1, out=longer)
        return longer

    def forward(self, x, training):
        batch, steps, features = x.shape
        y = varying(self.ws, "y", (batch, steps + 1, features), x.dtype)
        y[:, 0] = self.params["token"]
        y[:, 1:] = x
        return y

    def backward(self, dy, input_grad=True):
        dy[:, 0].sum(axis=0, out=self.grads["token"])
        if not input_grad:
            return None
        dx = varying(self.ws, "dx", (dy.shape[0], dy.shape[1] - 1, dy.shape[2]), dy.dtype)
        dx[...] = dy[:, 1:]
        return dx


@layer_type("cls_pool")
class ClsPool(Layer):
    """A sequence (None, F) to its step 0's features (F,): the output of the [CLS] token `cls_token` put there."""

    not_cut = "it reads the sequence's first step, which only the first segment holds"

    def output_shape(self, input_shape):
        check_sequence(input_shape, "cls_pool")
        return (input_shape[1],)

    def forward(self, x, training):
        self.input_shape = x.shape
        y = self.ws("y", (x.shape[0], x.shape[2]), x.dtype)
        y[...] = x[:, 0]
        return y

    def backward(self, dy, input_grad=True):
        dx = varying(self.ws, "dx", self.input_shape, dy.dtype)
        dx[...] = 0
        dx[:, 0] = dy
        return dx
