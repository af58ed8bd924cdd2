"""Layer normalization (`layernorm`): its kernels against their references (float32 and float64, each fused
activation), gradients against central differences on rows and on padded sequences (float64), padding invariance,
PyTorch's `nn.LayerNorm` forward and backward on the same values, the ONNX export, and the config's checks."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.kernels import layernorm as kernels
from mpitrain.kernels.activations import KINDS
from mpitrain.nn.layernorm import LayerNorm
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential, build_model
from mpitrain.nn.sequence import GlobalAvgPool1D
from mpitrain.testing.gradients import check_model_gradients, check_sequence_gradients

TOLERANCE = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-12}}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_kernels_equal_the_references(dtype, kind):
    rng = np.random.default_rng(0)
    rows, features = 7, 5
    x = (rng.normal(size=(rows, features)) * 3 + 10).astype(dtype)  # a large mean: the sums must not cancel
    gamma, beta = rng.normal(size=features).astype(dtype), rng.normal(size=features).astype(dtype)
    dy = rng.normal(size=(rows, features)).astype(dtype)
    results = []
    for forward, backward in ((kernels.forward, kernels.backward),
                              (kernels.forward_reference, kernels.backward_reference)):
        x_hat, y, dz, dx = (np.full((rows, features), np.nan, dtype) for _ in range(4))
        inv_std, dgamma, dbeta = np.full(rows, np.nan, dtype), *np.full((2, features), np.nan, dtype)
        forward(x, gamma, beta, 1e-5, x_hat, inv_std, y, kind)
        backward(dy, y, kind, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx)
        results.append((y, x_hat, inv_std, dgamma, dbeta, dx))
    for ours, reference in zip(*results):
        np.testing.assert_allclose(ours, reference, **TOLERANCE[dtype])


@pytest.mark.parametrize("activation", ["none", "relu", "tanh"])
def test_gradients_on_rows(activation):
    check_model_gradients([Dense(6), LayerNorm(activation=activation), Dense(3)], (4,))


@pytest.mark.parametrize("lengths", [np.array([5, 1, 3]), None], ids=["masked", "unmasked"])
def test_gradients_on_padded_sequences(lengths):
    check_sequence_gradients([Dense(4), LayerNorm(activation="tanh")], features=3, lengths=lengths, steps=6)
    check_sequence_gradients([LayerNorm(), GlobalAvgPool1D(), Dense(3)], features=3, lengths=lengths, steps=6)


def test_pytorchs_layer_norm_on_the_same_values():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 6, 8)).astype(np.float32)  # a batch of sequences: each step normalized alone
    dy = rng.normal(size=x.shape).astype(np.float32)
    layer = Sequential([LayerNorm(eps=1e-5)], (None, 8)).layers[0]  # bound to a model's buffers
    layer.params["gamma"][...] = rng.normal(size=8)
    layer.params["beta"][...] = rng.normal(size=8)
    ours = layer.forward(x, training=True).copy()
    dx = layer.backward(dy)
    theirs = torch.nn.LayerNorm(8, eps=1e-5)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(layer.params["gamma"].copy()))
        theirs.bias.copy_(torch.from_numpy(layer.params["beta"].copy()))
    x_t = torch.from_numpy(x).requires_grad_(True)
    y_t = theirs(x_t)
    y_t.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(ours, y_t.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, x_t.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.grads["gamma"], theirs.weight.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.grads["beta"], theirs.bias.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_onnx_export_equals_forward():
    ort = pytest.importorskip("onnxruntime")
    from mpitrain.data.shards import Manifest
    from mpitrain.nn.losses import softmax
    from mpitrain.rundir.export import onnx_model
    model = build_model(ModelConfig(layers=[{"type": "dense", "units": 6}, {"type": "layernorm", "activation": "relu"},
                                            {"type": "dense", "units": 3}]), (5,), 3, np)
    model.init_params(0, "xavier")
    rng = np.random.default_rng(2)
    model.params[...] += rng.normal(0, 0.3, model.n_params).astype(np.float32)
    manifest = Manifest(feature_shape=(5,), feature_dtype="float32", scale=1.0, offset=0.0, mean=0.0, std=1.0,
                        num_classes=3, label_counts={}, splits={})
    rows = rng.normal(size=(8, 5)).astype(np.float32)
    session = ort.InferenceSession(onnx_model(model, manifest, normalize=False).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": rows})[0], softmax(model.forward(rows, False)), atol=1e-6)


def test_config_checks():
    with pytest.raises(ConfigError, match=r"model.layers\[0\].eps is 0, expected a positive number"):
        build_model(ModelConfig(layers=[{"type": "layernorm", "eps": 0}, {"type": "dense", "units": 3}]), (4,), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(layernorm\) on inputs of shape \[1, 4, 4\]: a "
                                          r"layernorm layer takes features \(F,\) or a sequence \(None, F\)"):
        build_model(ModelConfig(layers=[{"type": "layernorm"}, {"type": "flatten"}, {"type": "dense", "units": 3}]),
                    (1, 4, 4), 3, np)
