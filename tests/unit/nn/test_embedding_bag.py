"""The embedding bag (`embedding_bag`): PyTorch's `nn.EmbeddingBag` in each mode on the same table (outputs and the
table's gradient, an empty bag included), an empty bag giving zeros, backward touching only the rows in the bags
(garbage ids in the padding ignored), float64 gradients through a graph against central differences, the graph's
sparse tables and `ids: auto` from the dataset, ONNX Runtime against the model's forward, and the config's checks."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.config.sections import ModelConfig
from mpitrain.data.sequences import Inputs, SequenceBatch
from mpitrain.data.shards import Manifest
from mpitrain.nn.embedding_bag import EmbeddingBag
from mpitrain.nn.graph import build_network
from mpitrain.nn.losses import softmax_cross_entropy
from mpitrain.testing.gradients import numeric_grad, padded_batch
from tests.unit.nn.test_graph_sequences import onnx_run, softmax

IDS, DIM = 9, 3
BAGS = [[4, 1, 4], [], [8], [0, 2, 5, 7, 3]]  # a repeated id, an empty bag


def bag_layer(mode: str, dtype=np.float64, seed: int = 0) -> EmbeddingBag:
    layer = EmbeddingBag(dim=DIM, mode=mode, ids=IDS)
    shapes = layer.param_shapes((None, 1))
    rng = np.random.default_rng(seed)
    layer.bind({"table": rng.normal(size=shapes["table"]).astype(dtype)}, {"table": np.full(shapes["table"], np.nan,
                                                                                          dtype)})
    return layer


def bag_batch(bags=BAGS, steps: int = 8):
    """The bags as a padded batch of ids (N, steps, 1) with out-of-table garbage in the padding, and their lengths."""
    x, lengths = padded_batch([np.array(bag, np.float64).reshape(-1, 1) for bag in bags], steps)
    return np.where(np.arange(steps)[None, :, None] < lengths[:, None, None], x, 1e6), lengths


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_pytorchs_embedding_bag_on_the_same_table(mode):
    torch = pytest.importorskip("torch")
    layer = bag_layer(mode)
    x, lengths = bag_batch()
    layer.lengths = lengths
    ours = layer.forward(x, training=True).copy()
    dy = np.random.default_rng(1).normal(size=ours.shape)
    layer.backward(dy)
    theirs = torch.nn.EmbeddingBag(IDS, DIM, mode=mode).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(layer.params["table"]))
    flat = torch.tensor([i for bag in BAGS for i in bag])
    offsets = torch.tensor(np.cumsum([0] + [len(bag) for bag in BAGS[:-1]]))
    y = theirs(flat, offsets)
    y.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(ours, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ours[1], 0)  # the empty bag
    np.testing.assert_allclose(layer.grads["table"], theirs.weight.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_backward_touches_the_rows_in_the_bags_alone(mode):
    layer = bag_layer(mode)
    x, lengths = bag_batch()
    layer.lengths = lengths
    layer.forward(x, training=True)
    layer.grads["table"][...] = 0  # as the model's buffer is after a dense step
    layer.backward(np.ones((len(BAGS), DIM)))
    used = sorted({i for bag in BAGS for i in bag})
    np.testing.assert_array_equal(layer.tables[0].touched, used)
    unused = [i for i in range(IDS) if i not in used]
    assert (layer.grads["table"][unused] == 0).all()
    if mode != "max":  # max: a row in a bag whose values never won gets a gradient of zero
        assert (np.abs(layer.grads["table"][used]).sum(axis=1) > 0).all()


def test_an_id_outside_the_table_is_a_data_error():
    layer = bag_layer("sum")
    layer.lengths = np.array([2])
    with pytest.raises(DataError, match=r"a bag holds id 9, outside the embedding_bag's table of 9 ids"):
        layer.forward(np.array([[[1.0], [9.0]]]), training=False)


def manifest(features=(2,)) -> Manifest:
    """Two fixed features and a bag column `bag` of ids 0..IDS-1 (the ETL's count), 3 classes."""
    return Manifest(features, "float32", 1.0, 0.0, 0.0, 1.0, 3, {}, {},
                    sequences=[{"name": "bag", "features": 1, "max_length": 50, "longest": 8, "ids": IDS}])


def graph(mode: str) -> list:
    return [{"name": "bagged", "type": "embedding_bag", "input": "bag", "dim": DIM, "mode": mode},
            {"name": "joined", "type": "concat", "inputs": ["bagged", "numeric"]},
            {"name": "out", "type": "dense", "input": "joined", "units": 3}]


def inputs(dtype=np.float64) -> Inputs:
    x, lengths = bag_batch()
    numbers = np.random.default_rng(3).normal(size=(len(BAGS), 2))
    return Inputs(numbers.astype(dtype), {"bag": SequenceBatch(x.astype(dtype), lengths)})


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_a_graphs_gradients_are_central_differences_and_its_table_is_sparse(mode):
    model = build_network(ModelConfig(graph=graph(mode), dtype="float64"), manifest(), np)
    assert model.nodes[0].layers[0].ids == IDS  # ids: auto, from the dataset's column
    assert model.trainable.sparse_tables == model.nodes[0].layers[0].tables and model.trainable.dense_start == IDS * DIM
    model.init_params(0, "xavier")
    x, y = inputs(), np.array([0, 2, 1, 1])
    model.train_batch(x, y)
    analytic = model.grads.copy()
    numeric = numeric_grad(lambda: softmax_cross_entropy(model.forward(x, training=True), y)[0], model.params)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-8)


def test_a_token_embedding_in_a_graph_takes_its_columns_ids_too():
    graph = [{"name": "tokens", "type": "token_embedding", "input": "bag", "dim": 2},
             {"name": "pool", "type": "global_avg_pool", "input": "tokens"},
             {"name": "out", "type": "dense", "input": "pool", "units": 3}]
    model = build_network(ModelConfig(graph=graph), manifest(features=(0,)), np)
    assert model.nodes[0].layers[0].params["table"].shape == (IDS, 2)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_onnx_runtime_equals_the_models_forward(mode):
    model = build_network(ModelConfig(graph=graph(mode)), manifest(), np)
    model.init_params(0, "xavier")
    x = inputs(np.float32)
    _, got = onnx_run(model, manifest(), x)
    np.testing.assert_allclose(got, softmax(model.forward(x).astype(np.float64)), rtol=0, atol=1e-5)


def test_config_checks():
    with pytest.raises(ConfigError, match=r"\(bagged, embedding_bag\) .*: mode 'median', expected one of \('sum', 'mean', 'max'\)"):
        build_network(ModelConfig(graph=[{**graph("sum")[0], "mode": "median"}, *graph("sum")[1:]]), manifest(), np)
    with pytest.raises(ConfigError, match=r"\(bagged, embedding_bag\) on inputs of shape \[\[2\]\]: an embedding_bag reads "
                                          r"a sequence of ids"):
        build_network(ModelConfig(graph=[{**graph("sum")[0], "input": "numeric"}, *graph("sum")[1:]]), manifest(), np)
