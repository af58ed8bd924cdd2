"""Multi-head self-attention (`attention`): its softmax kernels against their references, gradients against
central differences on padded sequences with and without the causal mask and dropout on the weights (float64),
PyTorch's `nn.MultiheadAttention` on the same weights (outputs and gradients, with its key padding and causal
masks), and the config's checks."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.kernels.attention import (
    masked_softmax,
    masked_softmax_reference,
    softmax_backward,
    softmax_backward_reference,
)
from mpitrain.nn.attention import Attention
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential, build_model
from mpitrain.nn.segments import check_layers
from mpitrain.nn.sequence import GlobalAvgPool1D
from mpitrain.testing.gradients import check_sequence_gradients, sequences

RAGGED = np.array([5, 1, 3])
WITH_EMPTY = np.array([5, 0, 3])  # a sequence of no steps: an empty bag read as tokens


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-6), (np.float64, 1e-14)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [RAGGED, WITH_EMPTY, None], ids=["masked", "empty", "unmasked"])
def test_kernels_equal_the_references(dtype, tolerance, causal, lengths):
    rng = np.random.default_rng(0)
    scores = (rng.normal(size=(3, 2, 5, 5)) * 4).astype(dtype)
    dp = rng.normal(size=scores.shape).astype(dtype)
    ours, reference = np.full_like(scores, np.nan), np.full_like(scores, np.nan)
    masked_softmax(scores, lengths, causal, ours)
    masked_softmax_reference(scores, lengths, causal, reference)
    np.testing.assert_allclose(ours, reference, rtol=tolerance, atol=tolerance)
    # a query's weights sum to 1, or are all 0 where its sequence has no step (cupy's path gave NaN, seen on a GPU)
    seen = (lengths if lengths is not None else np.ones(3)) > 0
    np.testing.assert_allclose(ours.sum(axis=-1), np.broadcast_to(seen[:, None, None], ours.shape[:3]), rtol=tolerance)
    if lengths is not None:  # keys beyond a sequence's length get exactly 0
        assert all((ours[b, :, :, n:] == 0).all() for b, n in enumerate(lengths))
    grads, expected = np.empty_like(dp), np.empty_like(dp)
    softmax_backward(dp, ours, grads)
    softmax_backward_reference(dp, ours, expected)
    np.testing.assert_allclose(grads, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("causal", [False, True], ids=["all", "causal"])
@pytest.mark.parametrize("lengths", [RAGGED, None], ids=["masked", "unmasked"])
def test_gradients_on_padded_sequences(causal, lengths):
    check_sequence_gradients([Dense(4), Attention(heads=2, causal=causal)], features=3, lengths=lengths, steps=6)
    check_sequence_gradients([Attention(causal=causal, rate=0.3), GlobalAvgPool1D(), Dense(3)], features=3,
                             lengths=lengths, steps=6)


@pytest.mark.parametrize("causal", [False, True], ids=["all", "causal"])
def test_pytorchs_multihead_attention_on_the_same_weights(causal):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    batch, steps, features, heads = 3, 7, 8, 2
    lengths = np.array([7, 2, 5])
    model = Sequential([Attention(heads=heads, causal=causal)], (None, features))
    model.init_params(0, "xavier")
    model.params[...] += rng.normal(0, 0.1, model.n_params).astype(np.float32)
    layer = model.layers[0]
    x = rng.normal(size=(batch, steps, features)).astype(np.float32)
    dy = rng.normal(size=x.shape).astype(np.float32) * (np.arange(steps)[None, :, None] < lengths[:, None, None])
    layer.lengths, layer.key = lengths, (0,)
    ours = layer.forward(x, training=True).copy()
    dx = layer.backward(dy)
    theirs = torch.nn.MultiheadAttention(features, heads, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.from_numpy(layer.params["W"].T.copy()))
        theirs.in_proj_bias.copy_(torch.from_numpy(layer.params["b"].copy()))
        theirs.out_proj.weight.copy_(torch.from_numpy(layer.params["W_out"].T.copy()))
        theirs.out_proj.bias.copy_(torch.from_numpy(layer.params["b_out"].copy()))
    x_t = torch.from_numpy(x).requires_grad_(True)
    padding = torch.from_numpy(np.arange(steps)[None, :] >= lengths[:, None])
    causal_mask = torch.triu(torch.ones(steps, steps, dtype=torch.bool), 1) if causal else None
    y_t, _ = theirs(x_t, x_t, x_t, key_padding_mask=padding, attn_mask=causal_mask, need_weights=False)
    y_t.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(ours, y_t.detach().numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(dx, x_t.grad.numpy(), rtol=1e-4, atol=2e-6)
    for ours_grad, theirs_grad in ((layer.grads["W"], theirs.in_proj_weight.grad.T),
                                   (layer.grads["b"], theirs.in_proj_bias.grad),
                                   (layer.grads["W_out"], theirs.out_proj.weight.grad.T),
                                   (layer.grads["b_out"], theirs.out_proj.bias.grad)):
        np.testing.assert_allclose(ours_grad, theirs_grad.numpy(), rtol=1e-4, atol=2e-6)


def test_a_padded_step_is_never_attended_to():
    model = Sequential([Attention(heads=2)], (None, 4), dtype="float64")
    model.init_params(0, "xavier")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 4))
    short = model.forward(sequences(x, np.array([5, 3])), training=False)[:, :5].copy()
    garbage = np.concatenate([x, rng.normal(0, 100, size=(2, 6, 4))], axis=1)
    garbage[1, 3:] = rng.normal(0, 100, size=(8, 4))
    longer = model.forward(sequences(garbage, np.array([5, 3])), training=False)
    np.testing.assert_allclose(longer[0, :5], short[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(longer[1, :3], short[1, :3], rtol=0, atol=1e-12)


def test_config_checks():
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(attention\) on inputs of shape \[None, 6\]: 6 "
                                          "features do not split into 4 heads"):
        build_model(ModelConfig(layers=[{"type": "attention", "heads": 4}]), (None, 6), 6, np, per_step=True,
                    sequence={"longest": 5, "shortest": 1})
    with pytest.raises(ConfigError, match=r"model.layers\[0\].causal is 'yes', expected true or false"):
        build_model(ModelConfig(layers=[{"type": "attention", "causal": "yes"}]), (None, 6), 6, np)
    with pytest.raises(ConfigError, match="an attention layer reads a sequence"):
        build_model(ModelConfig(layers=[{"type": "attention"}, {"type": "dense", "units": 3}]), (6,), 3, np)
    with pytest.raises(ConfigError, match=r"\(attention\) cannot be cut into segments: a step attends to steps in "
                                          "other segments"):
        check_layers(4, [{"type": "attention"}], [])
