"""The transformer encoder block (`transformer`): gradients against central differences on padded sequences,
pre-LN and post-LN, causal, with dropout (float64); PyTorch's `nn.TransformerEncoderLayer(activation="gelu",
batch_first=True)` on copied weights (outputs and gradients, both norm placements, with its key padding mask); L2
on the block's weight matrices alone; and the config's checks."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential, build_model
from mpitrain.nn.segments import check_layers
from mpitrain.nn.sequence import GlobalAvgPool1D
from mpitrain.nn.transformer import Transformer
from mpitrain.testing.gradients import check_sequence_gradients

RAGGED = np.array([5, 1, 3])


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN", "post-LN"])
@pytest.mark.parametrize("lengths", [RAGGED, None], ids=["masked", "unmasked"])
def test_gradients_on_padded_sequences(norm_first, lengths):
    check_sequence_gradients([Dense(4), Transformer(heads=2, ff_units=6, norm_first=norm_first)], features=3,
                             lengths=lengths, steps=6)
    check_sequence_gradients([Transformer(ff_units=5, rate=0.2, causal=True, norm_first=norm_first),
                              GlobalAvgPool1D(), Dense(3)], features=3, lengths=lengths, steps=6)


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN", "post-LN"])
def test_pytorchs_encoder_layer_on_copied_weights(norm_first):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    batch, steps, features, heads, ff = 3, 7, 8, 2, 16
    lengths = np.array([7, 2, 5])
    model = Sequential([Transformer(heads, ff, norm_first=norm_first)], (None, features))
    model.init_params(0, "xavier")
    model.params[...] += rng.normal(0, 0.1, model.n_params).astype(np.float32)
    block = model.layers[0]
    x = rng.normal(size=(batch, steps, features)).astype(np.float32)
    valid = np.arange(steps)[None, :, None] < lengths[:, None, None]
    dy = rng.normal(size=x.shape).astype(np.float32) * valid
    block.lengths, block.key = lengths, (0,)
    ours = block.forward(x, training=True).copy()
    dx = block.backward(dy)
    theirs = torch.nn.TransformerEncoderLayer(features, heads, ff, dropout=0.0, activation="gelu", batch_first=True,
                                              norm_first=norm_first)
    pairs = {"norm1.gamma": theirs.norm1.weight, "norm1.beta": theirs.norm1.bias,
             "norm2.gamma": theirs.norm2.weight, "norm2.beta": theirs.norm2.bias,
             "attention.W": theirs.self_attn.in_proj_weight, "attention.b": theirs.self_attn.in_proj_bias,
             "attention.W_out": theirs.self_attn.out_proj.weight, "attention.b_out": theirs.self_attn.out_proj.bias,
             "ff1.W": theirs.linear1.weight, "ff1.b": theirs.linear1.bias,
             "ff2.W": theirs.linear2.weight, "ff2.b": theirs.linear2.bias}
    with torch.no_grad():
        for name, parameter in pairs.items():
            value = block.params[name]
            parameter.copy_(torch.from_numpy((value.T if value.ndim == 2 else value).copy()))
    x_t = torch.from_numpy(x).requires_grad_(True)
    y_t = theirs(x_t, src_key_padding_mask=torch.from_numpy(np.arange(steps)[None, :] >= lengths[:, None]))
    y_t.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(ours * valid, y_t.detach().numpy() * valid, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx * valid, x_t.grad.numpy() * valid, rtol=1e-4, atol=1e-5)
    for name, parameter in pairs.items():
        grad = parameter.grad.numpy()
        np.testing.assert_allclose(block.grads[name], grad.T if grad.ndim == 2 else grad, rtol=1e-3, atol=1e-5,
                                   err_msg=name)


def test_l2_reaches_the_weight_matrices_alone():
    model = Sequential([Transformer(2, 6)], (None, 4))
    decayed = {name for (name, shape), start in zip(model.layout, np.cumsum([0] + [np.prod(s) for _, s in
                                                                                  model.layout])[:-1])
               if model.decay_mask[start]}
    assert decayed == {"00_transformer/attention.W", "00_transformer/attention.W_out", "00_transformer/ff1.W",
                       "00_transformer/ff2.W"}


def test_config_checks():
    layers = [{"type": "transformer", "heads": 2, "ff_units": 8}, {"type": "global_avg_pool"},
              {"type": "dense", "units": 3}]
    model = build_model(ModelConfig(layers=layers), (None, 4), 3, np, sequence={"longest": 5, "shortest": 1})
    assert model.layer_specs()[0] == {"type": "transformer", "heads": 2, "ff_units": 8, "rate": 0.0,
                                      "norm_first": True, "causal": False}
    with pytest.raises(ConfigError, match=r"model.layers\[0\].ff_units is 0"):
        build_model(ModelConfig(layers=[{"type": "transformer", "ff_units": 0}]), (None, 4), 4, np)
    with pytest.raises(ConfigError, match="5 features do not split into 2 heads"):
        build_model(ModelConfig(layers=[{**layers[0]}, *layers[1:]]), (None, 5), 3, np)
    with pytest.raises(ConfigError, match=r"\(transformer\) cannot be cut into segments"):
        check_layers(4, layers, [])


def test_the_shipped_config_builds_for_fashion_rows():
    import os

    from mpitrain.config.sections import load_config
    config = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs",
                                      "fashion_transformer.yaml"), [])
    model = build_model(config.model, (None, 28), 10, np, sequence={"longest": 28, "shortest": 28})
    assert [type(layer).__name__ for layer in model.layers].count("Transformer") == 2
    assert model.layers[1].max_steps == 28 and config.optimizer.type == "adamw"
