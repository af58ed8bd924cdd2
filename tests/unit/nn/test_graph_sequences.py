"""Graph models on sequence columns (docs/sequences.md): two sequence inputs and fixed features, float64 gradients
against central differences with garbage in the padding, outputs and gradients independent of a batch's padding,
a graph on one column alone computing what the `layers:` model does, its ONNX graph under onnxruntime, and one
clear error per graph that cannot work."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError, MpitrainError
from mpitrain.config.sections import ModelConfig
from mpitrain.data.sequences import Inputs, SequenceBatch
from mpitrain.data.shards import Manifest
from mpitrain.nn.graph import build_network
from mpitrain.nn.losses import softmax_cross_entropy
from mpitrain.nn.model import build_model
from mpitrain.testing.gradients import numeric_grad, padded_batch

# `a`'s two branches keep its steps, so they may be joined step by step; `b` is pooled before it meets the others
GRAPH = [{"name": "ca", "type": "conv1d", "input": "a", "filters": 2, "kernel": 2, "activation": "tanh"},
         {"name": "da", "type": "dense", "input": "a", "units": 2},
         {"name": "ja", "type": "concat", "inputs": ["ca", "da"]},
         {"name": "ra", "type": "lstm", "input": "ja", "units": 3},
         {"name": "cb", "type": "conv1d", "input": "b", "filters": 3, "kernel": 3, "stride": 2, "padding": "same"},
         {"name": "pb", "type": "global_max_pool", "input": "cb"},
         {"name": "j", "type": "concat", "inputs": ["ra", "pb", "numeric"]},
         {"name": "out", "type": "dense", "input": "j", "units": 3}]


def manifest(features=(2,), columns=(("a", 2), ("b", 1)), step_target="") -> Manifest:
    """A dataset of sequence columns ((name, F) each) beside fixed `features` ((0,): none), 3 classes."""
    return Manifest(features, "float32", 1.0, 0.0, 0.0, 1.0, 3, {}, {}, step_target=step_target,
                    sequences=[{"name": name, "features": width, "max_length": 50, "longest": 20}
                               for name, width in columns])


def graph_model(graph=GRAPH, dtype="float64", seed=0, **dataset):
    model = build_network(ModelConfig(graph=graph, dtype=dtype), manifest(**dataset), np)
    model.init_params(seed, "xavier")
    model.params += np.random.default_rng(seed).normal(0, 0.1, model.n_params).astype(dtype)
    return model


def inputs(rng, lengths_a, lengths_b, steps_a, steps_b, seed=1):
    """A batch of columns `a` (2 features) and `b` (1) of those lengths, padded to `steps_*` with garbage, and two
    fixed features per row."""
    a = SequenceBatch(*padded_batch([rng.normal(size=(n, 2)) for n in lengths_a], steps_a, seed))
    b = SequenceBatch(*padded_batch([rng.normal(size=(n, 1)) for n in lengths_b], steps_b, seed + 1))
    return Inputs(rng.normal(size=(len(lengths_a), 2)), {"a": a, "b": b})


def test_two_sequence_inputs_and_fixed_features_have_the_gradients_of_central_differences():
    rng = np.random.default_rng(0)
    model = graph_model()
    assert model.output_shape == (3,) and model.sequences == {"a": (None, 2), "b": (None, 1)}
    x, y = inputs(rng, [5, 2, 7], [9, 3, 4], 8, 16), np.array([0, 2, 1])
    model.train_batch(x, y)
    analytic = model.grads.copy()
    numeric = numeric_grad(lambda: softmax_cross_entropy(model.forward(x, training=True), y)[0], model.params)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-8)
    assert np.abs(analytic).min() < np.abs(analytic).max()  # not all zero: every input reaches the loss


def test_a_row_gives_the_same_outputs_and_gradients_whatever_its_batch_and_padding():
    rng = np.random.default_rng(1)
    ours = inputs(rng, [4, 6], [5, 2], 6, 5)
    others = inputs(rng, [11, 3], [14, 9], 11, 14)
    wider = Inputs(np.concatenate([ours.x, others.x]), {
        name: SequenceBatch(*padded_batch([batch.values[r, :batch.lengths[r]] for batch in (ours.columns[name],
                                                                                            others.columns[name])
                                           for r in range(2)], 24, seed=7))
        for name in ("a", "b")})
    model = graph_model()
    outputs, grads = [], []
    for batch, rows in ((ours, [0, 1]), (wider, [0, 1])):
        logits = model.forward(batch, training=True)
        outputs.append(logits[rows].copy())
        dy = np.zeros_like(logits)
        dy[rows] = np.random.default_rng(5).normal(size=(2, 3))  # the loss weighs our two rows alone
        model.backward(dy)
        grads.append(model.grads.copy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(grads[0], grads[1], rtol=0, atol=1e-10)
    assert np.abs(grads[0]).max() > 0


def test_a_graph_on_one_sequence_column_alone_computes_what_the_layers_model_does():
    layers = [{"type": "conv1d", "filters": 3, "kernel": 2, "activation": "relu"}, {"type": "global_avg_pool"},
              {"type": "dense", "units": 3}]
    graph = [{"name": "c", "type": "conv1d", "input": "a", "filters": 3, "kernel": 2, "activation": "relu"},
             {"name": "p", "type": "global_avg_pool", "input": "c"},
             {"name": "out", "type": "dense", "input": "p", "units": 3}]
    alone = manifest(features=(0,), columns=(("a", 2),))
    model = build_network(ModelConfig(graph=graph), alone, np)
    sequential = build_model(ModelConfig(layers=layers), alone.input_shape, 3, np)
    model.init_params(0, "xavier")
    sequential.init_params(0, "xavier")
    rng = np.random.default_rng(2)
    batch = SequenceBatch(*padded_batch([rng.normal(size=(n, 2)).astype(np.float32) for n in (3, 8, 5)], 8))
    assert model.input_shape == (None, 2) and model.groups == {}
    np.testing.assert_array_equal(model.forward(batch), sequential.forward(batch))


def test_a_class_per_step_graph_gives_a_sequence_of_the_first_columns_steps():
    graph = [{"name": "r", "type": "gru", "input": "a", "units": 4, "return_sequences": True},
             {"name": "d", "type": "dense", "input": "a", "units": 2},
             {"name": "j", "type": "concat", "inputs": ["r", "d"]},
             {"name": "out", "type": "dense", "input": "j", "units": 3}]
    model = graph_model(graph, step_target="tags")
    x = inputs(np.random.default_rng(3), [5, 2], [4, 4], 8, 8)
    x.columns.pop("b")
    assert model.output_shape == (None, 3) and model.forward(x).shape == (2, 8, 3)


@pytest.mark.parametrize("graph, dataset, message", [
    ([{"name": "j", "type": "concat", "inputs": ["a", "b"]}, {"name": "p", "type": "global_max_pool", "input": "j"},
      {"name": "out", "type": "dense", "input": "p", "units": 3}], {"columns": (("a", 2), ("b", 2))},
     "model.graph[0] (j, concat) on inputs of shape [[None, 2], [None, 2]]: it merges sequences of different lengths "
     "('a' those of 'a', 'b' those of 'b')"),
    ([{"name": "c", "type": "conv1d", "input": "a", "filters": 2, "kernel": 2, "stride": 2},
      {"name": "d", "type": "dense", "input": "a", "units": 2}, {"name": "s", "type": "add", "inputs": ["c", "d"]},
      {"name": "p", "type": "global_max_pool", "input": "s"}, {"name": "out", "type": "dense", "input": "p", "units": 3}],
     {}, "model.graph[2] (s, add) on inputs of shape [[None, 2], [None, 2]]: it merges sequences of different "
         "lengths ('c' those of 'c', 'd' those of 'a')"),
    ([{"name": "out", "type": "dense", "input": "b", "units": 3}], {"step_target": "tags"},
     "the last node 'out' gives a sequence of the lengths of 'b', but the dataset's class per step follows the steps "
     "of its first sequence column 'a'"),
    ([{"name": "p", "type": "global_max_pool", "input": "numeric"}], {},
     "model.graph[0] (p, global_max_pool) on inputs of shape [[2]]: a globalmaxpool1d layer takes sequences"),
    ([{"name": "out", "type": "dense", "input": "numeric", "units": 3}], {"columns": (("numeric", 2),)},
     "the dataset's sequence column 'numeric' has the name of its column group 'numeric'"),
])
def test_a_graph_that_cannot_read_its_sequences_is_one_error_naming_the_node(graph, dataset, message):
    with pytest.raises(ConfigError) as e:
        build_network(ModelConfig(graph=graph), manifest(**dataset), np)
    assert message in str(e.value)


def test_a_layers_model_on_several_inputs_is_refused_naming_the_columns():
    with pytest.raises(ConfigError, match=r"sequence columns \['a', 'b'\] and fixed features; expected model.graph"):
        build_network(ModelConfig(layers=[{"type": "lstm", "units": 2}, {"type": "dense", "units": 3}]), manifest(), np)


def test_embeddings_of_a_node_that_gives_a_sequence_are_refused():
    from mpitrain.training.activations import node_of
    model = graph_model()
    assert node_of(model, None, "pb") == "pb"
    with pytest.raises(MpitrainError, match=r"--embeddings 'ja': the node gives a sequence"):
        node_of(model, None, "ja")


def onnx_run(model, dataset: Manifest, x: Inputs):
    """The ONNX graph of `model` for `dataset` run by onnxruntime on `x` (float32); (its inputs, its output)."""
    import onnxruntime

    from mpitrain.rundir.export import onnx_model
    session = onnxruntime.InferenceSession(onnx_model(model, dataset).SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    feeds = {"x": x.x, **{name: b.values for name, b in x.columns.items()},
             **{f"{name}_lengths": b.lengths for name, b in x.columns.items()}}
    names = [i.name for i in session.get_inputs()]
    return session.get_inputs(), session.run(None, {name: feeds[name] for name in names})[0]


def float32_inputs(*args) -> Inputs:
    x = inputs(*args)
    return Inputs(x.x.astype(np.float32), {name: SequenceBatch(batch.values.astype(np.float32), batch.lengths)
                                                   for name, batch in x.columns.items()})


def softmax(logits):
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_the_onnx_graph_takes_x_and_each_columns_values_and_lengths_and_gives_predicts_outputs():
    from mpitrain.rundir.export import input_rows_shape, onnx_model, sequence_inputs
    model = graph_model(dtype="float32")
    x = float32_inputs(np.random.default_rng(4), [5, 1, 7, 3], [9, 3, 4, 12], 8, 16)
    graph_inputs, got = onnx_run(model, manifest(), x)
    assert [(i.name, i.shape) for i in graph_inputs] == [
        ("x", ["N", 2]), ("a", ["N", "T_a", 2]), ("a_lengths", ["N"]), ("b", ["N", "T_b", 1]), ("b_lengths", ["N"])]
    np.testing.assert_allclose(got, softmax(model.forward(x).astype(np.float64)), rtol=0, atol=1e-5)
    proto = onnx_model(model, manifest())  # what scoring reads of it: the fixed features' rows, each column's inputs
    assert input_rows_shape(proto) == ("float32", (2,))
    assert sequence_inputs(proto, ["a", "b"]) == {"a": ("a", "a_lengths"), "b": ("b", "b_lengths")}
    with pytest.raises(MpitrainError, match=r"the ONNX model has inputs \['x', 'a', 'a_lengths', 'b', 'b_lengths'\]; "
                                            r"expected 'c' for its dataset's sequence columns \['a', 'c'\]"):
        sequence_inputs(proto, ["a", "c"])


def test_a_class_per_step_graph_of_two_columns_exports_its_valid_steps():
    graph = [{"name": "r", "type": "lstm", "input": "a", "units": 4, "return_sequences": True},
             {"name": "out", "type": "dense", "input": "r", "units": 3}]
    dataset = manifest(features=(0,), step_target="tags")
    model = graph_model(graph, dtype="float32", features=(0,), step_target="tags")
    x = float32_inputs(np.random.default_rng(6), [5, 8, 2], [3, 4, 6], 8, 8)
    graph_inputs, got = onnx_run(model, dataset, x)
    assert [i.name for i in graph_inputs] == ["a", "a_lengths", "b", "b_lengths"]  # no fixed features: no x
    assert graph_inputs[0].shape == ["N", "T_a", 2]
    valid = np.arange(8)[None, :] < x.columns["a"].lengths[:, None]
    np.testing.assert_allclose(got[valid], softmax(model.forward(x).astype(np.float64))[valid], rtol=0, atol=1e-5)


def test_an_onnx_input_name_two_columns_would_share_is_refused():
    from mpitrain.rundir.export import onnx_model
    clash = manifest(columns=(("x", 2), ("b", 1)))
    graph = [{"name": "p", "type": "global_max_pool", "input": "x"},
             {"name": "j", "type": "concat", "inputs": ["p", "numeric"]},
             {"name": "out", "type": "dense", "input": "j", "units": 3}]
    model = build_network(ModelConfig(graph=graph), clash, np)
    with pytest.raises(MpitrainError, match=r"give two inputs named 'x'"):
        onnx_model(model, clash)
