"""Graph models: embedding, concat and add gradients in float64 against central differences, the issue's config as
written, one clear error per wrong node, and an embedding's backward writing only the rows a batch touched."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.data.sequences import Inputs
from mpitrain.data.shards import InputGroup, Manifest
from mpitrain.nn.graph import build_graph, build_network
from mpitrain.nn.losses import binary_cross_entropy, softmax_cross_entropy
from mpitrain.nn.model import build_model
from mpitrain.testing.gradients import numeric_grad

ISSUE_GRAPH = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 3},
               {"name": "flat", "type": "flatten", "input": "emb"},
               {"name": "joined", "type": "concat", "inputs": ["flat", "numeric"]},
               {"name": "hidden", "type": "dense", "input": "joined", "units": 5, "activation": "relu"},
               {"name": "out", "type": "dense", "input": "hidden", "units": 1}]
GROUPS = {"numeric": InputGroup(0, (3,)), "categorical": InputGroup(0, (2,), (6, 4))}


def table_rows(rng, n):
    """A table's batch as the reader gives it: 3 numbers in x, an int32 id of each categorical column (6 and 4 ids)."""
    return Inputs(rng.normal(size=(n, 3)),
                  {"categorical": np.column_stack([rng.integers(0, 6, n), rng.integers(0, 4, n)]).astype(np.int32)})


def check_gradients(graph, n=6, seed=0):
    rng = np.random.default_rng(seed)
    model = build_graph(ModelConfig(graph=graph, loss="binary_cross_entropy", dtype="float64"), GROUPS, (3,), 1, np)
    model.init_params(seed, "xavier")
    model.params += rng.normal(0, 0.1, model.n_params)
    x, y = table_rows(rng, n), rng.integers(0, 2, (n, 1)).astype(np.float64)
    model.train_batch(x, y)
    np.testing.assert_allclose(model.grads, numeric_grad(lambda: binary_cross_entropy(model.forward(x), y)[0],
                                                         model.params), rtol=1e-5, atol=1e-8)
    return model


def test_the_issue_graph_has_the_gradients_of_central_differences():
    model = check_gradients(ISSUE_GRAPH)
    assert [name for name, _ in model.layout][:2] == ["emb/table0", "emb/table1"]  # the tables come first
    assert model.dense_start == 6 * 3 + 4 * 3 and model.output_shape == (1,)


def test_add_a_residual_path_and_per_column_dimensions_have_the_gradients_of_central_differences():
    check_gradients([{"name": "emb", "type": "embedding", "input": "categorical", "dim": [2, 3]},
                     {"name": "joined", "type": "concat", "inputs": ["emb", "numeric"]},
                     {"name": "a", "type": "dense", "input": "joined", "units": 4, "activation": "tanh"},
                     {"name": "b", "type": "dense", "input": "a", "units": 4},
                     {"name": "sum", "type": "add", "inputs": ["a", "b"]},
                     {"name": "out", "type": "dense", "input": "sum", "units": 1}])


RESIDUAL_BLOCKS = [  # configs/fashion_resnet.yaml's kinds of node, small: a stem, an identity block, a widening block
    {"name": "stem", "type": "conv2d", "input": "numeric", "filters": 2, "kernel": 3, "padding": "same"},
    {"name": "stem_bn", "type": "batchnorm", "input": "stem", "activation": "relu"},
    {"name": "b1_conv", "type": "conv2d", "input": "stem_bn", "filters": 2, "kernel": 3, "padding": "same"},
    {"name": "b1_bn", "type": "batchnorm", "input": "b1_conv"},
    {"name": "b1_sum", "type": "add", "inputs": ["b1_bn", "stem_bn"]},
    {"name": "b1_relu", "type": "relu", "input": "b1_sum"},
    {"name": "b1_pool", "type": "maxpool2d", "input": "b1_relu", "pool": 2},
    {"name": "b2_conv", "type": "conv2d", "input": "b1_pool", "filters": 3, "kernel": 3, "padding": "same"},
    {"name": "b2_bn", "type": "batchnorm", "input": "b2_conv"},
    {"name": "b2_skip", "type": "conv2d", "input": "b1_pool", "filters": 3, "kernel": 1},
    {"name": "b2_skip_bn", "type": "batchnorm", "input": "b2_skip"},
    {"name": "b2_sum", "type": "add", "inputs": ["b2_bn", "b2_skip_bn"]},
    {"name": "b2_relu", "type": "relu", "input": "b2_sum"},
    {"name": "gap", "type": "avgpool2d", "input": "b2_relu", "pool": 3},
    {"name": "features", "type": "flatten", "input": "gap"},
    {"name": "logits", "type": "dense", "input": "features", "units": 3}]


def test_residual_blocks_with_batch_norm_on_image_rows_have_the_gradients_of_central_differences():
    """Conv, batch norm (batch statistics: training) and add skips inside a graph that reads whole image rows."""
    rng = np.random.default_rng(0)
    manifest = Manifest((1, 6, 6), "uint8", 1 / 255, 0.0, 0.0, 1.0, 3, {}, {})
    model = build_network(ModelConfig(graph=RESIDUAL_BLOCKS, dtype="float64"), manifest, np)
    assert model.whole_row and model.output_shape == (3,)
    model.init_params(0, "he")
    model.params += rng.normal(0, 0.1, model.n_params)
    x, y = rng.normal(size=(5, 1, 6, 6)), rng.integers(0, 3, 5)
    model.train_batch(x, y)
    loss = lambda: softmax_cross_entropy(model.forward(x, training=True), y)[0]  # noqa: E731
    np.testing.assert_allclose(model.grads, numeric_grad(loss, model.params), rtol=1e-4, atol=1e-8)


def test_an_embedding_backward_writes_only_the_touched_rows_and_clears_them_next_step():
    rng = np.random.default_rng(1)
    model = build_graph(ModelConfig(graph=ISSUE_GRAPH, loss="binary_cross_entropy"), GROUPS, (3,), 1, np)
    model.init_params(0, "xavier")
    x, y = table_rows(rng, 8), np.ones((8, 1), np.float32)
    for ids in ([0, 1], [5, 5]):
        x.columns["categorical"][:, 0] = np.resize(ids, 8)
        model.train_batch(x, y)
        table = model.sparse_tables[0]
        grad = model.grads[table.start:table.stop].reshape(table.rows, table.dim)
        assert np.flatnonzero(np.abs(grad).sum(axis=1)).tolist() == sorted(set(ids))
        assert table.touched.tolist() == sorted(set(ids))


def test_a_graph_without_merges_computes_what_the_sequential_of_its_layers_does():
    layers = [{"type": "dense", "units": 4, "activation": "relu"}, {"type": "dense", "units": 2}]
    graph = [{"name": "h", "type": "dense", "input": "numeric", "units": 4, "activation": "relu"},
             {"name": "o", "type": "dense", "input": "h", "units": 2}]
    sequential = build_model(ModelConfig(layers=layers), (3,), 2, np)
    model = build_graph(ModelConfig(graph=graph), {"numeric": InputGroup(0, (3,))}, (3,), 2, np)
    sequential.init_params(0, "xavier")
    model.init_params(0, "xavier")
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_array_equal(model.forward(x), sequential.forward(x))


def test_an_activation_node_acts_on_what_it_reads_and_leaves_the_node_written_above_it_alone():
    """A relu node reading the input, below a dense node without an activation: each node's value is its own (the
    relu was once fused into the dense layer above it, so the relu passed its input through and the dense was
    rectified), and the gradients are central differences'."""
    graph = [{"name": "a", "type": "dense", "input": "numeric", "units": 3},
             {"name": "r", "type": "relu", "input": "numeric"},
             {"name": "s", "type": "add", "inputs": ["a", "r"]},
             {"name": "o", "type": "dense", "input": "s", "units": 1}]
    model = check_gradients(graph)
    x = table_rows(np.random.default_rng(1), 4)
    np.testing.assert_array_equal(model.forward(x, until="r"), np.maximum(x.x, 0))
    a = model.layers[0]
    np.testing.assert_allclose(model.forward(x, until="a"), x.x @ a.params["W"] + a.params["b"])


@pytest.mark.parametrize("graph, message", [
    ([{"name": "h", "type": "dense", "input": "nothing", "units": 1}], "reads 'nothing': no input or node above"),
    ([{"name": "h", "type": "dense", "input": "numeric", "units": 2},
      {"name": "o", "type": "dense", "input": "numeric", "units": 1}], "node 'h' leads nowhere"),
    ([{"name": "numeric", "type": "dense", "input": "numeric", "units": 1}], "name 'numeric' is taken"),
    ([{"name": "e", "type": "embedding", "input": "numeric"}, {"name": "o", "type": "dense", "input": "e", "units": 1}],
     "an embedding reads the dataset's `categorical` ids"),
    ([{"name": "c", "type": "concat", "input": "numeric"}], "takes `inputs`, a list of two or more names"),
    ([{"name": "o", "type": "dense", "input": "numeric", "units": 3}], "expected [1] for the dataset's 1"),
    ([{"name": "o", "type": "dense", "input": "numeric", "units": 0}], "model.graph[0].units is 0"),
    ([{"name": "e", "type": "embedding", "input": "categorical", "dim": [2]},
      {"name": "o", "type": "dense", "input": "e", "units": 1}], "dim lists 1 dimensions, expected one per"),
])
def test_a_wrong_node_is_one_error_naming_it(graph, message):
    with pytest.raises(ConfigError) as e:
        build_graph(ModelConfig(graph=graph, loss="binary_cross_entropy"), GROUPS, (3,), 1, np)
    assert message in str(e.value)


def test_a_layers_model_on_a_table_with_categorical_columns_is_refused():
    manifest = Manifest((2,), "float32", 1.0, 0.0, 0.0, 1.0, 2, {}, {},
                        columns={"numeric": [{"name": "age"}], "categorical": [{"name": "country", "ids": 9}]})
    with pytest.raises(ConfigError, match=r"categorical columns \['country'\].*expected model.graph"):
        build_network(ModelConfig(layers=[{"type": "dense", "units": 2}]), manifest, np)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_stepping_only_the_written_rows_of_a_table_gives_the_whole_buffer_step(momentum):
    from mpitrain.config.sections import OptimizerConfig
    from mpitrain.nn.updaters import create_updater
    from mpitrain.parallel.sync.base import apply_update
    rng = np.random.default_rng(2)
    models = [build_graph(ModelConfig(graph=ISSUE_GRAPH, loss="binary_cross_entropy"), GROUPS, (3,), 1, np)
              for _ in range(2)]
    config = OptimizerConfig(type="sgd", lr=0.1, momentum=momentum, l2=1e-3)
    updaters = [create_updater(config, model.params, model.decay_mask) for model in models]
    for model in models:
        model.init_params(0, "xavier")
    for _ in range(3):
        x, y = table_rows(rng, 8), rng.integers(0, 2, (8, 1)).astype(np.float32)
        for model, updater, whole in zip(models, updaters, (False, True)):
            model.train_batch(x, y)
            if whole:
                model.params += updater.delta(model.grads, model.params)
            else:
                apply_update(model, updater)
    assert updaters[0].steps_rows_alone == (momentum == 0)
    np.testing.assert_array_equal(models[0].params, models[1].params)


def test_an_id_beyond_its_table_is_a_data_error_naming_the_column():
    from mpitrain.base.errors import DataError
    model = build_graph(ModelConfig(graph=ISSUE_GRAPH, loss="binary_cross_entropy"), GROUPS, (3,), 1, np)
    x = table_rows(np.random.default_rng(0), 4)
    x.columns["categorical"][2, 1] = 4  # column 1 has ids 0..3
    with pytest.raises(DataError, match=r"categorical column 1 holds id 4, expected 0\.\.3"):
        model.forward(x)
