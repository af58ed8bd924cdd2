"""Tables as tokens (FT-Transformer, Gorishniy et al. 2021): each column of a row becomes a token of `dim` values,
so attention can relate the columns.

    {name: tokens, type: feature_tokens, input: numeric, dim: 32}            # k numeric columns -> (None, 32), k tokens
    {name: tokens, type: feature_tokens, inputs: [numeric, emb], dim: 32}    # and the categorical columns' embeddings

Numeric column j's token is x_j * weight[j] + bias[j] (its own linear map, `weight` and `bias` (k, dim)). With a
second input, an `embedding` node of `dim` values per column ((c, dim): the categorical columns' tables, sparse
as ever), each categorical column's token is its embedding plus a bias of its own; the tokens are the k numeric
ones, then the c categorical ones, and `bias` is (k + c, dim). The output is a sequence (None, dim) of k (+ c)
steps, every step valid, which `cls_token`, `transformer` blocks and `cls_pool` take as they take any sequence.
Both start Uniform(-1/sqrt(dim), 1/sqrt(dim)), the paper's. The tokenizer gets no weight decay (its parameters
are not named W), as the paper's recipe leaves it out.
"""
from __future__ import annotations

import math

from mpitrain.base.arrays import array_module
from mpitrain.nn.layers import Layer, layer_type, varying
from mpitrain.nn.merge import Merge


@layer_type("feature_tokens")
class FeatureTokens(Layer):
    """A row's k numeric columns (k,) to k tokens (None, dim); see the module docstring."""

    keeps_lengths = False  # tokens, not a column's steps
    categorical = 0  # the categorical columns' tokens after the numeric ones (`FeatureTokensWithEmbeddings`)
    not_cut = "its tokens are a row's columns, not steps in time"

    def __init__(self, dim: int = 32):
        if not (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 1):
            raise ValueError(f"dim {dim!r}, expected an integer >= 1 (the tokens' width)")
        self.dim = dim

    def _numeric(self, shape) -> int:
        if len(shape) != 1 or shape[0] is None:
            raise ValueError(f"feature_tokens reads the numeric columns (k,), not inputs of shape {list(shape)}; "
                             "expected input: numeric")
        self.columns = shape[0]
        return self.columns

    def param_shapes(self, input_shape):
        self._numeric(input_shape)
        return self._shapes()

    def _shapes(self) -> dict:
        return {"weight": (self.columns, self.dim), "bias": (self.columns + self.categorical, self.dim)}

    def output_shape(self, input_shape):
        return (None, self.dim)

    def init_params(self, rng, scheme):
        limit = 1 / math.sqrt(self.dim)
        return {name: rng.uniform(-limit, limit, size=self.params[name].shape) for name in ("weight", "bias")}

    def _numeric_tokens(self, x, y) -> None:
        """y[:, :k] = x's numbers times their weights plus their biases."""
        xp, k = array_module(x), self.columns
        self.x = x
        xp.multiply(x[:, :, None], self.params["weight"], out=y[:, :k])
        y[:, :k] += self.params["bias"][:k]

    def _numeric_backward(self, dy, input_grad: bool):
        """The weights' and biases' gradients of the numeric tokens' `dy` (B, k, dim); the numbers' gradient (B, k)
        when `input_grad`."""
        xp, (batch, k, _) = array_module(dy), dy.shape
        product = varying(self.ws, "product", dy.shape, dy.dtype)
        xp.multiply(dy, self.x[:, :, None], out=product)
        product.sum(axis=0, out=self.grads["weight"])
        dy.sum(axis=0, out=self.grads["bias"][:k])
        if not input_grad:
            return None
        xp.multiply(dy, self.params["weight"], out=product)
        dx = self.ws("dx", (batch, k), dy.dtype)
        product.sum(axis=2, out=dx)
        return dx

    def forward(self, x, training):
        y = self.ws("y", (len(x), self.columns, self.dim), x.dtype)
        self._numeric_tokens(x, y)
        return y

    def backward(self, dy, input_grad=True):
        return self._numeric_backward(dy, input_grad)


class FeatureTokensWithEmbeddings(FeatureTokens, Merge):
    """`feature_tokens` over `inputs: [numeric, embedded]`: the k numeric tokens, then the embedding node's c
    columns (c, dim) each plus a bias of its own; see the module docstring."""

    input_count = 2

    def merged_shape(self, shapes):
        numeric, embedded = shapes
        self._numeric(numeric)
        if len(embedded) != 2 or embedded[0] is None or embedded[1] != self.dim:
            raise ValueError(f"feature_tokens reads the numeric columns and an embedding of dim {self.dim} per "
                             f"categorical column, not inputs of shape {[list(shape) for shape in shapes]}; expected "
                             f"inputs: [numeric, EMBEDDING] with the embedding's dim {self.dim}")
        self.categorical = embedded[0]
        return (None, self.dim)

    def param_shapes(self, input_shape):  # the merged shape; the columns are known from `merged_shape`
        return self._shapes()

    def forward(self, xs, training):
        x, embedded = xs
        k = self.columns
        y = self.ws("y", (len(x), k + self.categorical, self.dim), x.dtype)
        self._numeric_tokens(x, y)
        y[:, k:] = embedded
        y[:, k:] += self.params["bias"][k:]
        return y

    def backward(self, dy, input_grads):
        k = self.columns
        dy[:, k:].sum(axis=0, out=self.grads["bias"][k:])
        grads = [self._numeric_backward(dy[:, :k], input_grads[0]), None]
        if input_grads[1]:
            grads[1] = self.ws("d_embedded", (len(dy), self.categorical, self.dim), dy.dtype)
            grads[1][...] = dy[:, k:]
        return grads


FeatureTokens.joined_by = FeatureTokensWithEmbeddings
