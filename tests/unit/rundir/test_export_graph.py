"""Graph models as ONNX: ONNX Runtime on a table's rows equals the model's own forward within 1e-5 (embeddings as
Gather, concat, add, per-column and shared dimensions), for binary, class and regression heads; regression values
and an autoencoder's reconstruction in the data's units (`mpitrain.data.units`)."""
import numpy as np
import pytest

from mpitrain.config.sections import ModelConfig
from mpitrain.data.sequences import Inputs
from mpitrain.data.shards import Manifest
from mpitrain.data.units import output_units
from mpitrain.nn.graph import build_network
from mpitrain.rundir.export import onnx_model

COLUMNS = {"numeric": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
           "categorical": [{"name": "country", "ids": 7}, {"name": "user", "ids": 50}]}
WIDE_AND_DEEP = [{"name": "wide", "type": "embedding", "input": "categorical", "dim": 1},
                 {"name": "wflat", "type": "flatten", "input": "wide"},
                 {"name": "emb", "type": "embedding", "input": "categorical", "dim": [3, 5]},
                 {"name": "joined", "type": "concat", "inputs": ["emb", "numeric"]},
                 {"name": "hidden", "type": "dense", "input": "joined", "units": 6, "activation": "relu"},
                 {"name": "skip", "type": "dense", "input": "hidden", "units": 6, "activation": "tanh"},
                 {"name": "sum", "type": "add", "inputs": ["hidden", "skip"]},
                 {"name": "all", "type": "concat", "inputs": ["wflat", "sum", "numeric"]}]
HEADS = {"binary": ("binary_cross_entropy", 1, lambda z: 1 / (1 + np.exp(-z))),
         "class": ("softmax_cross_entropy", 3, lambda z: np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)),
         "regression": ("mse", 2, lambda z: z * [30.0, 0.5] + [250.0, -1.0])}  # the manifest's target statistics


@pytest.mark.parametrize("target", sorted(HEADS))
def test_onnx_runtime_gives_the_graph_models_outputs(target):
    import onnxruntime as ort
    loss, outputs, head = HEADS[target]
    manifest = Manifest((3,), "float32", 1.0, 0.0, 0.0, 1.0, outputs if target == "class" else 2, {}, {},
                        target=target, target_names=[] if target == "class" else [f"t{j}" for j in range(outputs)],
                        columns=COLUMNS, id_dtype="int32", **({"target_mean": [250.0, -1.0], "target_std": [30.0, 0.5]}
                                                              if target == "regression" else {}))
    graph = [*WIDE_AND_DEEP, {"name": "out", "type": "dense", "input": "all", "units": outputs}]
    model = build_network(ModelConfig(graph=graph, loss=loss), manifest, np)
    model.init_params(3, "xavier")
    rng = np.random.default_rng(0)
    numbers = rng.normal(size=(40, 3)).astype(np.float32)
    ids = np.column_stack([rng.integers(0, 7, 40), rng.integers(0, 50, 40)]).astype(np.int32)  # as a shard stores them
    expected = head(model.forward(Inputs(numbers, {"categorical": ids})).astype(np.float64))
    proto = onnx_model(model, manifest)
    assert [(i.name, i.type.tensor_type.elem_type) for i in proto.graph.input] == [("x", 1), ("categorical", 7)]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": numbers, "categorical": ids.astype(np.int64)})  # float32 numbers, int64 ids
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss, head", [("mse", lambda z: z * 0.2 + 0.4),  # the pixels / 255 data.normalize standardized
                                        ("binary_cross_entropy", lambda z: 1 / (1 + np.exp(-z)))])
def test_an_autoencoder_exports_its_reconstruction_as_predict_gives_it(loss, head):
    """`model.target: reconstruction` on uint8 images: the output `reconstruction` [N, features], through a Sigmoid
    under binary cross-entropy, equal to `mpitrain.training.evaluation.outputs_of` the model's outputs; under mse in
    the data's units as stored (pixels / 255), not the standardized units the model reconstructs."""
    import onnxruntime as ort

    from mpitrain.training.evaluation import outputs_of
    manifest = Manifest((1, 4, 4), "uint8", 1 / 255, 0.0, 0.4, 0.2, 10, {}, {})  # a class dataset: labels unread
    graph = [{"name": "pixels", "type": "flatten", "input": "numeric"},
             {"name": "code", "type": "dense", "input": "pixels", "units": 3},
             {"name": "out", "type": "dense", "input": "code", "units": 16}]
    model = build_network(ModelConfig(graph=graph, loss=loss, target="reconstruction"), manifest, np)
    model.init_params(0, "xavier")
    rows = np.random.default_rng(0).integers(0, 256, (20, 1, 4, 4)).astype(np.uint8)
    proto = onnx_model(model, manifest, normalize=True)
    assert [o.name for o in proto.graph.output] == ["reconstruction"]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = ((rows / 255 - 0.4) / 0.2).astype(np.float32)  # the manifest's scaling, data.normalize on
    units = output_units(manifest, True, True, reconstruction=True, loss=loss)
    expected = units.to_data(outputs_of(model.forward(x), "reconstruction", loss))
    np.testing.assert_allclose(expected, head(model.forward(x).astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(session.run(["reconstruction"], {"x": rows})[0], expected, rtol=1e-5, atol=1e-5)
