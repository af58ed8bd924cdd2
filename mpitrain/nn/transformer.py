"""A transformer encoder block over a sequence, as one layer: PyTorch's `nn.TransformerEncoderLayer(F, heads,
ff_units, rate, activation="gelu", batch_first=True, norm_first=True)`.

    {type: transformer, heads: 4, ff_units: 128}                     # pre-LN (the default)
    {type: transformer, heads: 4, ff_units: 128, norm_first: false}  # post-LN (the original transformer's)

Pre-LN:  y = x + dropout(attention(layernorm(x)));  z = y + dropout(W2 dropout(gelu(W1 layernorm(y))))
Post-LN: y = layernorm(x + dropout(attention(x)));  z = layernorm(y + dropout(W2 dropout(gelu(W1 y))))

A layer, not a graph macro that writes the nodes out: a list of layers (`model.layers`) takes it as well as a graph,
a config names a block in one line as PyTorch and Keras users do, and its parts are the tested layers themselves
(`layernorm`, `attention`, `dense`, `gelu`, `dropout`), each bound to its share of the block's parameters
(`norm1.gamma`, `attention.W`, `ff1.W`, ...) and given its own part of the workspace. Pre-LN trains without a
learning-rate warm-up where post-LN often needs one (Xiong et al. 2020), hence the default. `rate` is the dropout
of the attention weights, of the attention's output, inside the feed-forward net and of its output, as PyTorch's
one `dropout`. `causal` is the attention's mask.
"""
from __future__ import annotations

from mpitrain.base.arrays import array_module
from mpitrain.nn.attention import Attention
from mpitrain.nn.layernorm import LayerNorm
from mpitrain.nn.layers import GELU, Dense, Dropout, Layer, is_sequence, layer_type, varying


@layer_type("transformer")
class Transformer(Layer):
    """One encoder block of `heads` heads and a feed-forward net of `ff_units`; see the module docstring."""

    not_cut = "a step attends to steps in other segments"
    ATTEND = ("attention", "drop1")  # the residual branches' parts, without their layer norms
    FEED = ("ff1", "gelu", "drop_ff", "ff2", "drop2")

    def __init__(self, heads: int = 1, ff_units: int = 64, rate: float = 0.0, norm_first: bool = True,
                 causal: bool = False):
        if not (isinstance(ff_units, int) and not isinstance(ff_units, bool) and ff_units >= 1):
            raise ValueError(f"ff_units {ff_units!r}, expected an integer >= 1")
        self.heads, self.ff_units, self.rate, self.norm_first, self.causal = heads, ff_units, rate, norm_first, causal
        self.parts = {"norm1": LayerNorm(), "attention": Attention(heads, causal, rate), "drop1": Dropout(rate),
                      "norm2": LayerNorm(), "ff1": Dense(ff_units), "gelu": GELU(), "drop_ff": Dropout(rate),
                      "ff2": Dense(1), "drop2": Dropout(rate)}
        self.number = {name: k for k, name in enumerate(self.parts)}  # a part's dropout key: the block's and this

    @property
    def capture_blocker(self) -> str | None:
        return next((part.capture_blocker for part in self.parts.values() if part.capture_blocker), None)

    def param_shapes(self, input_shape):
        if not is_sequence(input_shape):
            raise ValueError(f"a transformer block reads a sequence (None, F), not inputs of shape {list(input_shape)}")
        self.parts["ff2"].units = input_shape[1]
        inputs = {"norm1": input_shape, "attention": input_shape, "norm2": input_shape, "ff1": input_shape,
                  "ff2": (None, self.ff_units)}
        return {f"{name}.{key}": value for name, shape in inputs.items()
                for key, value in self.parts[name].param_shapes(shape).items()}

    def output_shape(self, input_shape):
        return input_shape

    def bind(self, params, grads):
        super().bind(params, grads)
        for name, part in self.parts.items():
            prefix = f"{name}."
            part.bind({key[len(prefix):]: value for key, value in params.items() if key.startswith(prefix)},
                      {key[len(prefix):]: value for key, value in grads.items() if key.startswith(prefix)})

    @Layer.ws.setter
    def ws(self, part):
        self._ws = part
        for name, layer in self.parts.items():
            layer.ws = part.part(name)

    def init_params(self, rng, scheme):
        return {f"{name}.{key}": value for name, part in self.parts.items()
                for key, value in part.init_params(rng, scheme).items()}

    def _run(self, names, x, training):
        for name in names:
            part = self.parts[name]
            part.lengths, part.key = self.lengths, (*self.key, self.number[name])
            x = part.forward(x, training)
        return x

    def _back(self, names, dy):
        for name in reversed(names):
            dy = self.parts[name].backward(dy)
        return dy

    def _added(self, name: str, a, b):
        """a + b into workspace array `name` (grow-only: T changes from batch to batch)."""
        out = varying(self.ws, name, a.shape, a.dtype)
        array_module(a).add(a, b, out=out)
        return out

    def forward(self, x, training):
        attend, feed = self.ATTEND, self.FEED
        if self.norm_first:
            y = self._added("y", x, self._run(["norm1", *attend], x, training))
            return self._added("z", y, self._run(["norm2", *feed], y, training))
        y = self._run(["norm1"], self._added("y", x, self._run(attend, x, training)), training)
        return self._run(["norm2"], self._added("z", y, self._run(feed, y, training)), training)

    def backward(self, dy, input_grad=True):
        attend, feed = self.ATTEND, self.FEED
        if self.norm_first:  # z = y + F(norm2(y)), y = x + A(norm1(x))
            dy = self._added("dy", dy, self._back(["norm2", *feed], dy))
            return self._added("dx", dy, self._back(["norm1", *attend], dy))
        dz = self._back(["norm2"], dy)  # z = norm2(s), s = y + F(y); y = norm1(r), r = x + A(x)
        dy = self._back(["norm1"], self._added("dy", dz, self._back(feed, dz)))
        return self._added("dx", dy, self._back(attend, dy))
