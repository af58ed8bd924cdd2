"""Empty sequences (a bag column's empty lists, docs/sequences.md#bag-columns) through every sequence layer: finite
outputs and gradients, the other rows' outputs as without the empty one, pools of nothing giving zeros, and ONNX
Runtime giving what the model gives."""
import numpy as np
import pytest

from mpitrain.data.sequences import Inputs, SequenceBatch
from mpitrain.testing.gradients import padded_batch
from tests.unit.nn.test_graph_sequences import graph_model, manifest, softmax

CASES = {
    "lstm": [{"name": "r", "type": "lstm", "input": "a", "units": 3}],
    "gru": [{"name": "r", "type": "gru", "input": "a", "units": 3}],
    "conv1d, max pool": [{"name": "c", "type": "conv1d", "input": "a", "filters": 2, "kernel": 2},
                         {"name": "r", "type": "global_max_pool", "input": "c"}],
    "max pool": [{"name": "r", "type": "global_max_pool", "input": "a"}],
    "average pool": [{"name": "r", "type": "global_avg_pool", "input": "a"}],
    "transformer": [{"name": "p", "type": "positional", "input": "a"},
                    {"name": "t", "type": "transformer", "input": "p", "heads": 2, "ff_units": 4},
                    {"name": "r", "type": "global_avg_pool", "input": "t"}],
    "[CLS] token": [{"name": "c", "type": "cls_token", "input": "a"},
                    {"name": "t", "type": "transformer", "input": "c", "heads": 2, "ff_units": 4},
                    {"name": "r", "type": "cls_pool", "input": "t"}],
}
LENGTHS = [3, 0, 5]  # the middle row's sequence is empty


def batch(lengths, dtype, seed=1):
    rng = np.random.default_rng(seed)
    values, lengths = padded_batch([rng.normal(size=(n, 2)) for n in lengths], 8, seed)
    return Inputs(np.zeros((len(lengths), 0), dtype), {"a": SequenceBatch(values.astype(dtype), lengths)})


def model_of(nodes, dtype="float64"):
    return graph_model(nodes + [{"name": "out", "type": "dense", "input": "r", "units": 3}], dtype=dtype,
                       columns=(("a", 2),), features=(0,))


@pytest.mark.parametrize("case", CASES)
def test_an_empty_sequence_gives_finite_outputs_and_gradients_and_leaves_the_other_rows_alone(case):
    model = model_of(CASES[case])
    x = batch(LENGTHS, np.float64)
    with np.errstate(all="raise"):
        model.train_batch(x, np.array([0, 1, 2]))
        outputs = model.forward(x, training=False).copy()
    assert np.isfinite(model.grads).all()
    alone = Inputs(x.x[[0, 2]], {"a": SequenceBatch(x.columns["a"].values[[0, 2]],
                                                            x.columns["a"].lengths[[0, 2]])})
    np.testing.assert_allclose(outputs[[0, 2]], model.forward(alone, training=False), rtol=0, atol=1e-12)


@pytest.mark.parametrize("pool", ["global_max_pool", "global_avg_pool"])
def test_a_pool_of_an_empty_sequence_is_zeros_and_passes_back_no_gradient(pool):
    model = model_of([{"name": "r", "type": pool, "input": "a"}])
    x = batch(LENGTHS, np.float64)
    pooled = model.nodes[0].layers[0]
    pooled.lengths = x.columns["a"].lengths
    assert (pooled.forward(x.columns["a"].values, training=True)[1] == 0).all()
    dx = pooled.backward(np.ones((3, 2)))
    assert (dx[1] == 0).all() and (dx[0, :3] != 0).any()


@pytest.mark.parametrize("case", CASES)
def test_onnx_runtime_gives_what_the_model_gives_on_a_batch_with_an_empty_sequence(case):
    pytest.importorskip("onnxruntime")
    model = model_of(CASES[case], dtype="float32")
    x = batch(LENGTHS, np.float32)
    import onnxruntime

    from mpitrain.rundir.export import onnx_model
    session = onnxruntime.InferenceSession(onnx_model(model, manifest(features=(0,), columns=(("a", 2),)))
                                           .SerializeToString(), providers=["CPUExecutionProvider"])
    (ours,) = session.run(None, {"x": x.columns["a"].values, "lengths": x.columns["a"].lengths})
    np.testing.assert_allclose(ours, softmax(model.forward(x, training=False)), rtol=1e-5, atol=1e-6)
