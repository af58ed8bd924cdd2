"""Tables as tokens (`feature_tokens`, FT-Transformer): float64 gradients against central differences through a
[CLS] token, a transformer block and its pool, numeric columns alone and with the categorical embeddings, the
tokens' values by hand, ONNX Runtime against the model's forward, and the config's checks."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.data.shards import Manifest
from mpitrain.nn.feature_tokens import FeatureTokens, FeatureTokensWithEmbeddings
from mpitrain.nn.graph import build_graph, build_network
from mpitrain.rundir.export import onnx_model
from tests.unit.nn.test_graph import GROUPS, check_gradients, table_rows

HEAD = [{"name": "cls", "type": "cls_token", "input": "tokens"},
        {"name": "block", "type": "transformer", "input": "cls", "heads": 2, "ff_units": 6},
        {"name": "norm", "type": "layernorm", "input": "block"},
        {"name": "pooled", "type": "cls_pool", "input": "norm"},
        {"name": "out", "type": "dense", "input": "pooled", "units": 1}]
NUMERIC = [{"name": "tokens", "type": "feature_tokens", "input": "numeric", "dim": 4}, *HEAD]
BOTH = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 4},
        {"name": "tokens", "type": "feature_tokens", "inputs": ["numeric", "emb"], "dim": 4}, *HEAD]


@pytest.mark.parametrize("graph", [NUMERIC, BOTH], ids=["numeric", "with embeddings"])
def test_gradients_through_the_tokens_are_central_differences(graph):
    model = check_gradients(graph)
    tokens = next(node.layers[0] for node in model.nodes if node.name == "tokens")
    assert tokens.params["bias"].shape == ((3 + 2, 4) if graph is BOTH else (3, 4))  # 3 numeric, 2 categorical


def test_each_column_is_a_token_of_its_own_map():
    layer = FeatureTokensWithEmbeddings(dim=2)
    assert layer.merged_shape([(3,), (2, 2)]) == (None, 2)
    shapes = layer.param_shapes((None, 2))
    assert shapes == {"weight": (3, 2), "bias": (5, 2)}
    weight, bias = np.arange(6.0).reshape(3, 2), np.arange(10.0).reshape(5, 2) / 10
    layer.bind({"weight": weight, "bias": bias}, {name: np.zeros(s) for name, s in shapes.items()})
    x, embedded = np.array([[1.0, -2.0, 0.5]]), np.array([[[7.0, 8.0], [9.0, 10.0]]])
    y = layer.forward([x, embedded], training=True)
    np.testing.assert_allclose(y[0], [[0 + 0.0, 1 + 0.1], [-4 + 0.2, -6 + 0.3], [2 + 0.4, 2.5 + 0.5],
                                      [7.6, 8.7], [9.8, 10.9]])
    dx, d_embedded = layer.backward(np.ones_like(y), [True, True])
    np.testing.assert_allclose(dx, [[1, 5, 9]])  # each number's gradient: the sum of its weights
    np.testing.assert_array_equal(d_embedded, np.ones((1, 2, 2)))
    np.testing.assert_allclose(layer.grads["weight"], np.repeat(x.T, 2, axis=1))
    np.testing.assert_array_equal(layer.grads["bias"], np.ones((5, 2)))


@pytest.mark.parametrize("graph", [NUMERIC, BOTH], ids=["numeric", "with embeddings"])
def test_onnx_runtime_equals_the_models_forward(graph):
    import onnxruntime as ort
    columns = {"numeric": [{"name": n} for n in "abc"], "categorical": [{"name": "c", "ids": 6}, {"name": "d",
                                                                                                 "ids": 4}]}
    manifest = Manifest((3,), "float32", 1.0, 0.0, 0.0, 1.0, 1, {}, {}, target="binary", target_names=["t"],
                        columns=columns, id_dtype="int32")
    model = build_network(ModelConfig(graph=graph, loss="binary_cross_entropy"), manifest, np)
    model.init_params(3, "xavier")
    rows = table_rows(np.random.default_rng(0), 40)
    rows.x = rows.x.astype(np.float32)
    expected = 1 / (1 + np.exp(-model.forward(rows).astype(np.float64)))
    session = ort.InferenceSession(onnx_model(model, manifest).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": rows.x, "categorical": rows.columns["categorical"].astype(np.int64)}
    np.testing.assert_allclose(session.run(None, feeds)[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("node, message", [
    ({"inputs": ["categorical", "emb"]}, r"\(tokens, feature_tokens\) .*would read the categorical ids as numbers"),
    ({"inputs": ["emb", "numeric"]}, r"feature_tokens reads the numeric columns \(k,\), not inputs of shape \[2, 4\]"),
    ({"inputs": ["numeric", "emb"], "dim": 3}, r"an embedding of dim 3 per categorical column"),
    ({"inputs": ["numeric", "emb"], "dim": 0}, r"model.graph\[1\].dim is 0, expected an integer in \[1, "),
])
def test_config_checks(node, message):
    graph = [BOTH[0], {"name": "tokens", "type": "feature_tokens", "dim": 4, **node}, *HEAD]
    with pytest.raises(ConfigError, match=message):
        build_graph(ModelConfig(graph=graph, loss="binary_cross_entropy"), GROUPS, (3,), 1, np)
    assert FeatureTokens.joined_by is FeatureTokensWithEmbeddings
