"""Autoencoders (`model.target: reconstruction`): the input is the loss's target (float64 gradients against central
differences, mse and binary cross-entropy), configs that cannot reconstruct are one error naming the key, and a
forward pass stops at a chosen node (`mpitrain predict --embeddings`)."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError, MpitrainError
from mpitrain.config.sections import ModelConfig
from mpitrain.data.shards import Manifest
from mpitrain.nn.graph import build_network
from mpitrain.nn.losses import mse, multilabel_cross_entropy
from mpitrain.testing.gradients import numeric_grad
from mpitrain.training.activations import node_of

IMAGES = Manifest((1, 3, 3), "uint8", 1 / 16, 0.0, 0.0, 1.0, 10, {}, {})  # 9 features, 10 classes
LAYERS = [{"type": "flatten"}, {"type": "dense", "units": 4, "activation": "tanh"}, {"type": "dense", "units": 2},
          {"type": "dense", "units": 4, "activation": "relu"}, {"type": "dense", "units": 9}]
GRAPH = [{"name": "pixels", "type": "flatten", "input": "numeric"},
         {"name": "encoder", "type": "dense", "input": "pixels", "units": 4, "activation": "tanh"},
         {"name": "code", "type": "dense", "input": "encoder", "units": 2},
         {"name": "decoder", "type": "dense", "input": "code", "units": 4, "activation": "relu"},
         {"name": "out", "type": "dense", "input": "decoder", "units": 9}]


def autoencoder(loss="mse", dtype="float64", **model):
    config = ModelConfig(**{"layers": LAYERS, **model}, target="reconstruction", loss=loss, dtype=dtype)
    network = build_network(config.validate("exp.yaml"), IMAGES, np)
    network.init_params(0, "xavier")
    return network


@pytest.mark.parametrize("loss, of", [("mse", mse), ("binary_cross_entropy", multilabel_cross_entropy)])
@pytest.mark.parametrize("kind", ["layers", "graph"])
def test_the_input_is_the_target_and_the_gradients_are_those_of_central_differences(loss, of, kind):
    model = autoencoder(loss, **({"graph": GRAPH, "layers": []} if kind == "graph" else {}))
    assert model.reconstruction and model.output_shape == (9,)
    rng = np.random.default_rng(0)
    model.params += rng.normal(0, 0.1, model.n_params)
    x = rng.uniform(0, 1, (5, 1, 3, 3))  # intensities in [0, 1], as pixels / 16 are
    labels = rng.integers(0, 10, 5).astype(np.int32)  # the dataset's labels: not read
    loss_value, _ = model.train_batch(x, labels)
    target = x.reshape(5, 9)
    assert float(loss_value) == pytest.approx(float(of(model.forward(x), target)[0]), rel=1e-12)
    np.testing.assert_allclose(model.grads, numeric_grad(lambda: of(model.forward(x), target)[0], model.params),
                               rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("model, message", [
    ({"loss": "softmax_cross_entropy"}, "exp.yaml: model.loss is softmax_cross_entropy, but model.target is "
                                        "reconstruction (the input is the target); expected mse or binary_cross_entropy"),
    ({"loss": "huber"}, "model.loss is huber, but model.target is reconstruction"),
    ({"layers": LAYERS[:-1] + [{"type": "dense", "units": 10}]},
     "model.layers: the last layer gives outputs of shape [10], expected [9] for the dataset's 9 input features "
     "(model.target: reconstruction)"),
    ({"layers": [], "graph": GRAPH[:-1] + [{"name": "out", "type": "dense", "input": "decoder", "units": 10}]},
     "model.graph: the last node 'out' gives outputs of shape [10], expected [9] for the dataset's 9 input features"),
])
def test_a_model_that_cannot_reconstruct_its_input_is_one_error_naming_the_key(model, message):
    with pytest.raises(ConfigError) as e:
        autoencoder(**model)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_forward_pass_stops_at_the_node_a_user_names():
    sequential, graph = autoencoder(dtype="float32"), autoencoder(dtype="float32", graph=GRAPH, layers=[])
    graph.params[...] = sequential.params  # the same layers in the same order: the same parameters
    x = np.random.default_rng(1).uniform(0, 1, (4, 1, 3, 3)).astype(np.float32)
    w1, b1, w2, b2 = (sequential.layers[i].params[k] for i in (1, 3) for k in ("W", "b"))
    code = np.tanh(x.reshape(4, 9) @ w1 + b1) @ w2 + b2
    config = ModelConfig(layers=LAYERS)
    np.testing.assert_allclose(sequential.forward(x, until=node_of(sequential, config, "2")), code, rtol=1e-5)
    np.testing.assert_allclose(graph.forward(x, until=node_of(graph, config, "code")), code, rtol=1e-5)
    np.testing.assert_allclose(sequential.forward(x, until=node_of(sequential, config, "1")),
                               np.tanh(x.reshape(4, 9) @ w1 + b1), rtol=1e-5)  # after its activation
    np.testing.assert_array_equal(graph.forward(x, until="out"), graph.forward(x))
    for model, node, expected in ((sequential, "5", "model.layers, 0 to 4"), (sequential, "code", "0 to 4"),
                                  (graph, "2", "expected one of ['pixels', 'encoder', 'code', 'decoder', 'out']")):
        with pytest.raises(MpitrainError) as e:
            node_of(model, config, node)
        assert f"--embeddings {node!r}: " in str(e.value) and expected in str(e.value)
