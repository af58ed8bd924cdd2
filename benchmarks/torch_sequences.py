"""The PyTorch twins of mpitrain's sequence models (benchmarks/torch_ddp.py builds them from a config's layers):
`lstm`, `conv1d`, `global_max_pool` and `dense`, each taking a padded batch (B, T, F) and its lengths as mpitrain's
`SequenceBatch` holds them, and computing what mpitrain's layer computes on the valid steps.

- `lstm` is `torch.nn.LSTM` over `pack_padded_sequence` (unsorted batches allowed): each sequence runs its own
  length and its last state is `h_n`, the state after its last valid step, as mpitrain's masked LSTM gives. That is
  what a PyTorch user writes for ragged batches, and the fair twin: a hand-masked LSTM (a Python loop of
  `LSTMCell` steps that carries the state through the padding, mpitrain's own scheme) would time PyTorch's
  per-step dispatch rather than its LSTM, and a plain padded `nn.LSTM` would give another result (the state after
  the padding). Packing skips the padded steps' work that mpitrain still does (it computes every step of the
  batch's padded length and carries the state through the padding).
- `conv1d` sets its input's padded steps to zero (as mpitrain does, so a window past a sequence's end reads zeros),
  pads `causal`/`same` as mpitrain's table says, then `torch.nn.Conv1d` on (B, F, T).
- `global_max_pool` takes each feature's largest value over the valid steps (the padded ones filled with -inf).
- `dense` is `torch.nn.Linear`, on a vector or on each step of a sequence.
- `positional` (learned) adds its table's first T rows (zero rows past the table, as a batch padded past it gets);
  `layernorm` is `torch.nn.LayerNorm`; `global_avg_pool` the mean over the valid steps.
- `transformer` is `torch.nn.TransformerEncoderLayer(F, heads, ff_units, rate, activation="gelu",
  batch_first=True, norm_first=...)` with the padded steps as its `src_key_padding_mask`: what a PyTorch user
  writes, and its fused kernels where PyTorch has them.

Weights are initialized as the config asks (He for `init: he`, else Xavier), biases 0; the LSTM keeps PyTorch's
own initialization (its gate order differs from mpitrain's, and its speed does not depend on it).
"""
from __future__ import annotations

import numpy as np
import torch

ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "none": lambda x: x}


def initialized(module, spec: dict):
    if spec.get("init") == "he":
        torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    else:
        torch.nn.init.xavier_uniform_(module.weight)
    torch.nn.init.zeros_(module.bias)
    return module


def valid_steps(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """(B, T) booleans: True at each sequence's valid steps."""
    return torch.arange(steps)[None, :] < lengths[:, None]


class LSTM(torch.nn.Module):
    def __init__(self, features: int, spec: dict):
        super().__init__()
        if spec.get("bidirectional") or spec.get("return_sequences"):
            raise ValueError("the PyTorch twin runs a one-way lstm returning its last state")
        self.lstm = torch.nn.LSTM(features, spec["units"], batch_first=True)
        self.out_features = spec["units"]

    def forward(self, x, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        return self.lstm(packed)[1][0][0], None


class Conv1d(torch.nn.Module):
    def __init__(self, features: int, spec: dict):
        super().__init__()
        kernel, self.stride, dilation = spec["kernel"], spec.get("stride", 1), spec.get("dilation", 1)
        span, self.padding = dilation * (kernel - 1) + 1, spec.get("padding", "causal")
        self.pads = {"causal": (span - 1, 0), "same": ((span - 1) // 2, span - 1 - (span - 1) // 2),
                     "valid": (0, 0)}[self.padding]
        self.span, self.activation = span, ACTIVATIONS[spec.get("activation", "none")]
        self.conv = initialized(torch.nn.Conv1d(features, spec["filters"], kernel, self.stride, dilation=dilation),
                                spec)
        self.out_features = spec["filters"]

    def forward(self, x, lengths):
        x = x * valid_steps(lengths, x.shape[1])[:, :, None]
        y = self.activation(self.conv(torch.nn.functional.pad(x.transpose(1, 2), self.pads))).transpose(1, 2)
        if self.padding == "valid":
            return y, (lengths - self.span) // self.stride + 1
        return y, (lengths + self.stride - 1) // self.stride


class GlobalMaxPool(torch.nn.Module):
    def __init__(self, features: int, spec: dict):
        super().__init__()
        self.out_features = features

    def forward(self, x, lengths):
        return x.masked_fill(~valid_steps(lengths, x.shape[1])[:, :, None], float("-inf")).amax(dim=1), None


class GlobalAvgPool(torch.nn.Module):
    def __init__(self, features: int, spec: dict):
        super().__init__()
        self.out_features = features

    def forward(self, x, lengths):
        summed = (x * valid_steps(lengths, x.shape[1])[:, :, None]).sum(dim=1)
        return summed / lengths[:, None].to(x.dtype), None


class Dense(torch.nn.Module):
    def __init__(self, features: int, spec: dict):
        super().__init__()
        self.linear = initialized(torch.nn.Linear(features, spec["units"]), spec)
        self.activation = ACTIVATIONS[spec.get("activation", "none")]
        self.out_features = spec["units"]

    def forward(self, x, lengths):
        return self.activation(self.linear(x)), lengths


class Positional(torch.nn.Module):
    def __init__(self, features: int, spec: dict, longest: int = 0):
        super().__init__()
        if spec.get("encoding", "learned") != "learned":
            raise ValueError("the PyTorch twin's positional is the learned table")
        steps = longest if spec.get("max_steps", "auto") == "auto" else spec["max_steps"]
        self.table = torch.nn.Parameter(torch.randn(steps, features) * 0.02)
        self.out_features = features

    def forward(self, x, lengths):
        rows = min(x.shape[1], len(self.table))
        return torch.cat([x[:, :rows] + self.table[:rows], x[:, rows:]], dim=1), lengths


class LayerNorm(torch.nn.Module):
    def __init__(self, features: int, spec: dict):
        super().__init__()
        if spec.get("activation", "none") != "none":
            raise ValueError("the PyTorch twin's layernorm has no activation")
        self.norm = torch.nn.LayerNorm(features, eps=spec.get("eps", 1e-5))
        self.out_features = features

    def forward(self, x, lengths):
        return self.norm(x), lengths


class Transformer(torch.nn.Module):
    def __init__(self, features: int, spec: dict):
        super().__init__()
        if spec.get("causal"):
            raise ValueError("the PyTorch twin's transformer has no causal mask")
        self.block = torch.nn.TransformerEncoderLayer(features, spec["heads"], spec["ff_units"], spec.get("rate", 0.0),
                                                      activation="gelu", batch_first=True,
                                                      norm_first=spec.get("norm_first", True))
        self.out_features = features

    def forward(self, x, lengths):
        return self.block(x, src_key_padding_mask=~valid_steps(lengths, x.shape[1])), lengths


LAYERS = {"lstm": LSTM, "conv1d": Conv1d, "global_max_pool": GlobalMaxPool, "global_avg_pool": GlobalAvgPool,
          "dense": Dense, "positional": Positional, "layernorm": LayerNorm, "transformer": Transformer}


class SequenceModel(torch.nn.Module):
    """A config's sequence layers in order, called with a padded batch and its lengths."""

    def __init__(self, layers: list[dict], features: int, longest: int = 0):
        """`longest`: the dataset's longest sequence (a `positional` table's rows when its max_steps is auto)."""
        super().__init__()
        modules = []
        for spec in layers:
            if spec["type"] not in LAYERS:
                raise ValueError(f"no PyTorch twin of a {spec['type']} layer in a sequence model; expected one of "
                                 f"{', '.join(LAYERS)}")
            extra = {"longest": longest} if spec["type"] == "positional" else {}
            modules.append(LAYERS[spec["type"]](features, spec, **extra))
            features = modules[-1].out_features
        self.layers = torch.nn.ModuleList(modules)

    def forward(self, x, lengths):
        for layer in self.layers:
            x, lengths = layer(x, lengths)
        return x


def _torch_gates(a: np.ndarray) -> torch.Tensor:
    """An LSTM parameter's gate columns from mpitrain's order (i, o, f, c: ONNX's) to PyTorch's (i, f, c, o)."""
    i, o, f, c = np.split(a, 4, axis=-1)
    return torch.from_numpy(np.concatenate([i, f, c, o], axis=-1))


def _copy(parameter, value: np.ndarray) -> None:
    """A weight matrix transposed (mpitrain's (in, out), torch's (out, in)), a vector as it is."""
    parameter.copy_(torch.from_numpy((value.T if value.ndim == 2 else value).copy()))


def _transformer_pairs(block) -> dict:
    """mpitrain's transformer parameter names to the parameters of `block` (a TransformerEncoderLayer)."""
    return {"norm1.gamma": block.norm1.weight, "norm1.beta": block.norm1.bias,
            "norm2.gamma": block.norm2.weight, "norm2.beta": block.norm2.bias,
            "attention.W": block.self_attn.in_proj_weight, "attention.b": block.self_attn.in_proj_bias,
            "attention.W_out": block.self_attn.out_proj.weight, "attention.b_out": block.self_attn.out_proj.bias,
            "ff1.W": block.linear1.weight, "ff1.b": block.linear1.bias,
            "ff2.W": block.linear2.weight, "ff2.b": block.linear2.bias}


def twin_holding(specs: list[dict], layers: list, features: int, longest: int = 0) -> SequenceModel:
    """The float64 `SequenceModel` of `specs` holding the parameters of mpitrain's `layers` (built from the same specs)."""
    twin = SequenceModel(specs, features, longest).double()
    with torch.no_grad():
        for layer, mine in zip(twin.layers, layers):
            if isinstance(layer, Transformer):
                for name, parameter in _transformer_pairs(layer.block).items():
                    _copy(parameter, mine.params[name])
            elif isinstance(layer, Positional):
                layer.table.copy_(torch.from_numpy(mine.params["table"]))
            elif isinstance(layer, LayerNorm):
                layer.norm.weight.copy_(torch.from_numpy(mine.params["gamma"]))
                layer.norm.bias.copy_(torch.from_numpy(mine.params["beta"]))
            if isinstance(layer, Conv1d):  # mpitrain's W is (kernel, F, filters), torch's (filters, F, kernel)
                layer.conv.weight.copy_(torch.from_numpy(mine.params["W"].transpose(2, 1, 0)))
                layer.conv.bias.copy_(torch.from_numpy(mine.params["b"]))
            elif isinstance(layer, LSTM):  # mpitrain's gates i, o, f, c (ONNX's); torch's i, f, c, o
                layer.lstm.weight_ih_l0.copy_(_torch_gates(mine.params["W"]).T)
                layer.lstm.weight_hh_l0.copy_(_torch_gates(mine.params["R"]).T)
                layer.lstm.bias_ih_l0.copy_(_torch_gates(mine.params["b"]))
                layer.lstm.bias_hh_l0.zero_()
            elif isinstance(layer, Dense):
                layer.linear.weight.copy_(torch.from_numpy(mine.params["W"].T))
                layer.linear.bias.copy_(torch.from_numpy(mine.params["b"]))
    return twin


def check_twins(configs: list[list[dict]], features: int) -> float:
    """The largest difference between each config's mpitrain model and its twin (float64, the same parameters) on a
    ragged batch with garbage in its padding; a SystemExit above 1e-10: the speed comparison would not be of the same
    function. What benchmarks/sequences.py checks before it times the twins."""
    from mpitrain.data.sequences import SequenceBatch
    from mpitrain.nn.model import LAYER_TYPES, Sequential
    worst = 0.0
    rng = np.random.default_rng(0)
    lengths, steps = np.array([9, 3, 12, 5]), 16
    x = rng.normal(0, 100, size=(len(lengths), steps, features))  # the padding: large garbage
    for b, n in enumerate(lengths):
        x[b, :n] = rng.normal(size=(n, features))
    for specs in configs:
        layers = [LAYER_TYPES[spec["type"]](**{k: v for k, v in spec.items() if k != "type"}) for spec in specs]
        for layer in layers:
            if getattr(layer, "max_steps", None) == "auto":  # a positional table as long as the batch
                layer.max_steps = steps
        model = Sequential(layers, (None, features), dtype="float64")  # its activation layers come after `layers`
        model.init_params(0, "xavier")
        model.params += rng.normal(0, 0.1, model.n_params)
        expected = model.forward(SequenceBatch(x, lengths), training=False)
        with torch.no_grad():
            twin = twin_holding(specs, layers, features, steps).eval()  # no dropout, as mpitrain's inference
            got = twin(torch.from_numpy(x), torch.from_numpy(lengths)).numpy()
        difference = float(np.abs(got - expected).max())
        if difference > 1e-10 * max(1.0, float(np.abs(expected).max())):
            raise SystemExit(f"the PyTorch twin of {specs} differs from mpitrain's model by {difference:g}")
        worst = max(worst, difference)
    return worst
