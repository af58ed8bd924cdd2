"""GELU (exact and tanh forms) and SiLU, whose derivatives need their input: the kernels against their references
(float32 and float64, far into both tails without NaN), values and gradients against PyTorch's, gradients against
central differences on rows and padded sequences (float64), never fused into the layer before, and the ONNX
export."""
import numpy as np
import pytest

from mpitrain.config.sections import ModelConfig
from mpitrain.kernels.activations import (
    INPUT_KINDS,
    activation_backward,
    activation_backward_reference,
    bias_activation,
    bias_activation_reference,
)
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import build_model
from mpitrain.testing.gradients import check_model_gradients, check_sequence_gradients

KINDS = sorted(INPUT_KINDS)
TORCH = {"gelu": ("gelu", {}), "gelu_tanh": ("gelu", {"approximate": "tanh"}), "silu": ("silu", {})}


def values(dtype):
    x = np.concatenate([np.linspace(-8, 8, 33), [-300.0, -40.0, 40.0, 300.0]]).reshape(-1, 1)
    return np.repeat(x, 3, axis=1).astype(dtype)


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 2e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("kind", KINDS)
def test_kernels_equal_the_references(kind, dtype, tolerance):
    x = values(dtype)
    dy = np.random.default_rng(0).normal(size=x.shape).astype(dtype)
    ours, reference, no_bias = np.empty_like(x), np.empty_like(x), x[0, :0]
    bias_activation(x, no_bias, kind, ours)
    with np.errstate(over="ignore"):
        bias_activation_reference(x, no_bias, kind, reference)
    np.testing.assert_allclose(ours, reference, rtol=tolerance, atol=tolerance)
    activation_backward(dy, x, kind, ours)
    with np.errstate(over="ignore"):
        activation_backward_reference(dy, x, kind, reference)
    np.testing.assert_allclose(ours, reference, rtol=tolerance, atol=tolerance)
    assert np.isfinite(ours).all()


@pytest.mark.parametrize("kind", KINDS)
def test_values_and_gradients_are_pytorchs(kind):
    torch = pytest.importorskip("torch")
    x = values(np.float64)
    dy = np.random.default_rng(1).normal(size=x.shape)
    y, dx = np.empty_like(x), np.empty_like(x)
    bias_activation(x, x[0, :0], kind, y)
    activation_backward(dy, x, kind, dx)
    x_t = torch.from_numpy(x).requires_grad_(True)
    function, options = TORCH[kind]
    y_t = getattr(torch.nn.functional, function)(x_t, **options)
    y_t.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, y_t.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, x_t.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_against_central_differences(kind):
    check_model_gradients([Dense(6, activation=kind), Dense(3)], (4,))
    check_sequence_gradients([Dense(4, activation=kind)], features=3, lengths=np.array([5, 1, 3]), steps=6)


@pytest.mark.parametrize("kind", KINDS)
def test_never_fused_into_the_layer_before(kind):
    for spec in ({"type": "dense", "units": 4}, {"type": "layernorm"}):
        model = build_model(ModelConfig(layers=[{"type": "dense", "units": 4}, {**spec, "activation": kind},
                                                {"type": "dense", "units": 3}]), (5,), 3, np)
        assert model.layers[-3].kind == "none" and type(model.layers[-2]).__name__.lower().startswith(kind[:4])


@pytest.mark.parametrize("kind", KINDS)
def test_onnx_export_equals_forward(kind):
    ort = pytest.importorskip("onnxruntime")
    from mpitrain.data.shards import Manifest
    from mpitrain.nn.losses import softmax
    from mpitrain.rundir.export import onnx_model
    model = build_model(ModelConfig(layers=[{"type": "dense", "units": 6, "activation": kind},
                                            {"type": "dense", "units": 3}]), (5,), 3, np)
    model.init_params(0, "xavier")
    manifest = Manifest(feature_shape=(5,), feature_dtype="float32", scale=1.0, offset=0.0, mean=0.0, std=1.0,
                        num_classes=3, label_counts={}, splits={})
    rows = (np.random.default_rng(2).normal(size=(16, 5)) * 3).astype(np.float32)
    session = ort.InferenceSession(onnx_model(model, manifest, normalize=False).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": rows})[0], softmax(model.forward(rows, False)), atol=1e-6)
