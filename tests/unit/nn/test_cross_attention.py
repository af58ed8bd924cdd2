"""Cross-attention (`attention` with `inputs: [queries, memory]` in a graph): float64 gradients against central
differences on two sequence columns of other lengths with garbage in their padding, PyTorch's
`nn.MultiheadAttention(kdim=, vdim=)` on the same weights with the memory's key padding mask, the output's
independence of the memory's padding, ONNX Runtime against predict, and the config's checks."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.data.sequences import Inputs, SequenceBatch
from mpitrain.nn.attention import CrossAttention
from mpitrain.nn.graph import build_network
from mpitrain.nn.losses import softmax_cross_entropy
from mpitrain.testing.gradients import numeric_grad, padded_batch
from tests.unit.nn.test_graph_sequences import float32_inputs, graph_model, inputs, manifest, onnx_run, softmax

# queries from column a (2 features, 4 after a dense node), memory column b (1 feature) of its own lengths
GRAPH = [{"name": "qa", "type": "dense", "input": "a", "units": 4},
         {"name": "cross", "type": "attention", "inputs": ["qa", "b"], "heads": 2},
         {"name": "pool", "type": "global_avg_pool", "input": "cross"},
         {"name": "out", "type": "dense", "input": "pool", "units": 3}]


def test_gradients_of_queries_memory_and_weights_are_central_differences():
    rng = np.random.default_rng(0)
    model = graph_model(GRAPH)
    assert isinstance(model.nodes[1].merge, CrossAttention)
    assert [name for name, _ in model.layout][2:7] == ["cross/W_q", "cross/W_kv", "cross/b", "cross/W_out",
                                                       "cross/b_out"]
    x, y = inputs(rng, [5, 2, 7], [9, 1, 4], 8, 16), np.array([0, 2, 1])
    model.train_batch(x, y)
    analytic = model.grads.copy()
    numeric = numeric_grad(lambda: softmax_cross_entropy(model.forward(x, training=True), y)[0], model.params)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-8)
    assert (np.abs(analytic[:12]) > 0).all()  # qa/W (2, 4), qa/b: the gradient reaches the queries' input


def test_the_output_does_not_depend_on_the_memorys_padding():
    rng = np.random.default_rng(1)
    model = graph_model(GRAPH)
    short = inputs(rng, [4, 6], [5, 2], 6, 5)
    padded = Inputs(short.x, {"a": short.columns["a"], "b": SequenceBatch(
        *padded_batch([short.columns["b"].values[r, :n] for r, n in enumerate([5, 2])], 19, seed=9))})
    np.testing.assert_allclose(model.forward(padded), model.forward(short).copy(), rtol=0, atol=1e-12)


def test_pytorchs_multihead_attention_with_kdim_on_the_same_weights():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    layer = CrossAttention(heads=2)
    assert layer.merged_shape([(None, 4), (None, 3)]) == (None, 4)
    shapes = layer.param_shapes((None, 4))
    layer.bind({k: rng.normal(0, 0.5, s).astype(np.float32) for k, s in shapes.items()},
               {k: np.zeros(s, np.float32) for k, s in shapes.items()})
    x, memory = (rng.normal(size=(3, steps, f)).astype(np.float32) for steps, f in ((5, 4), (7, 3)))
    queries, keys = np.array([5, 2, 4]), np.array([7, 1, 3])
    dy = rng.normal(size=x.shape).astype(np.float32) * (np.arange(5)[None, :, None] < queries[:, None, None])
    layer.key, layer.input_lengths = (0,), [queries, keys]
    ours = layer.forward([x, memory], training=True).copy()
    dx, dmemory = layer.backward(dy, [True, True])
    theirs = torch.nn.MultiheadAttention(4, 2, kdim=3, vdim=3, batch_first=True)
    p = layer.params
    with torch.no_grad():
        theirs.q_proj_weight.copy_(torch.from_numpy(p["W_q"].T.copy()))
        theirs.k_proj_weight.copy_(torch.from_numpy(p["W_kv"][:, :4].T.copy()))
        theirs.v_proj_weight.copy_(torch.from_numpy(p["W_kv"][:, 4:].T.copy()))
        theirs.in_proj_bias.copy_(torch.from_numpy(p["b"]))
        theirs.out_proj.weight.copy_(torch.from_numpy(p["W_out"].T.copy()))
        theirs.out_proj.bias.copy_(torch.from_numpy(p["b_out"]))
    x_t, m_t = (torch.from_numpy(a).requires_grad_(True) for a in (x, memory))
    padding = torch.from_numpy(np.arange(7)[None, :] >= keys[:, None])
    y_t, _ = theirs(x_t, m_t, m_t, key_padding_mask=padding, need_weights=False)
    y_t.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(ours, y_t.detach().numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(dx, x_t.grad.numpy(), rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(dmemory, m_t.grad.numpy(), rtol=1e-4, atol=2e-6)
    kv = np.concatenate([theirs.k_proj_weight.grad.T.numpy(), theirs.v_proj_weight.grad.T.numpy()], axis=1)
    for ours_grad, theirs_grad in ((layer.grads["W_q"], theirs.q_proj_weight.grad.T.numpy()),
                                   (layer.grads["W_kv"], kv), (layer.grads["b"], theirs.in_proj_bias.grad.numpy()),
                                   (layer.grads["W_out"], theirs.out_proj.weight.grad.T.numpy())):
        np.testing.assert_allclose(ours_grad, theirs_grad, rtol=1e-4, atol=2e-6)


def test_onnx_runtime_equals_predict_on_ragged_batches():
    model = graph_model(GRAPH, dtype="float32")
    x = float32_inputs(np.random.default_rng(4), [5, 1, 7, 3], [9, 3, 1, 12], 8, 16)
    _, got = onnx_run(model, manifest(), x)
    np.testing.assert_allclose(got, softmax(model.forward(x).astype(np.float64)), rtol=0, atol=1e-5)


@pytest.mark.parametrize("change, message", [
    ({"inputs": ["qa", "b", "a"]}, r"model.graph\[1\]: attention over several `inputs` takes a list of 2 names"),
    ({"inputs": ["qa", "b"], "causal": True}, r"model.graph\[1\] \(cross, attention\) .*causal masks later steps"),
    ({"inputs": ["qa", "numeric"]}, r"cross-attention reads two sequences \(None, F\)"),
    ({"input": "qa", "inputs": ["qa", "b"]}, r"takes a list of 2 names, not \['qa', 'b'\]"),
])
def test_config_checks(change, message):
    graph = [dict(GRAPH[0]), {"name": "cross", "type": "attention", "heads": 2, **change}, *GRAPH[2:]]
    with pytest.raises(ConfigError, match=message):
        build_network(ModelConfig(graph=graph), manifest(), np)
