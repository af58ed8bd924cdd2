"""A sequence column of integers (stored int32, the ETL's Parquet list of an integer type) goes into a model as it
is stored: a token_embedding takes its ids as they are, any layer that reads numbers gets them as the model's floats
(`as_numbers`), and its ONNX graph takes them as int64, Cast where numbers are read, giving the model's outputs."""
import numpy as np
import onnxruntime as ort
import pytest

from mpitrain.config.sections import ModelConfig
from mpitrain.data.sequences import SequenceBatch
from mpitrain.data.shards import Manifest
from mpitrain.nn.graph import build_network
from mpitrain.rundir.export import onnx_model

MODELS = {"as numbers": [{"type": "lstm", "units": 5}, {"type": "dense", "units": 3}],
          "as ids": [{"type": "token_embedding", "dim": 4}, {"type": "global_avg_pool"}, {"type": "dense", "units": 3}]}


def manifest() -> Manifest:
    """One column `counts` of integers 0..8 per step alone, 3 classes."""
    return Manifest((0,), "float32", 1.0, 0.0, 0.0, 1.0, 3, {}, {}, id_dtype="int32",
                    sequences=[{"name": "counts", "features": 1, "max_length": 50, "longest": 7, "ids": 9,
                                "integer": True}])


@pytest.mark.parametrize("layers", sorted(MODELS))
def test_integers_give_what_their_values_as_floats_give_and_onnx_takes_them_as_int64(layers):
    model = build_network(ModelConfig(layers=MODELS[layers]), manifest(), np)
    model.init_params(0, "xavier")
    rng = np.random.default_rng(0)
    lengths = np.array([7, 3, 5, 1])
    ids = rng.integers(0, 9, (4, 8, 1)).astype(np.int32)
    expected = model.forward(SequenceBatch(ids.astype(np.float32), lengths)).copy()
    got = model.forward(SequenceBatch(ids, lengths))
    np.testing.assert_array_equal(got, expected)
    proto = onnx_model(model, manifest())
    assert proto.graph.input[0].type.tensor_type.elem_type == 7  # int64
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    probabilities = session.run(None, {"x": ids.astype(np.int64), "lengths": lengths})[0]
    logits = expected.astype(np.float64)
    np.testing.assert_allclose(probabilities, np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), atol=1e-5)
