"""Segments of a batch for truncated BPTT (mpitrain/nn/segments.py): the recurrent layers' states carry over from one
segment to the next, so the segments' outputs are the whole sequence's; the layers a model cannot be cut at are
refused when the config is read, naming the layer."""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import load_config
from mpitrain.nn.layers import Dense, Dropout, Tanh
from mpitrain.nn.model import Sequential
from mpitrain.nn.recurrent import GRU, LSTM
from mpitrain.nn.segments import Segments
from mpitrain.testing.sequences import padded_batch

LENGTHS = [3, 16, 8, 13, 11]  # the first ends in segment 0 of 5 steps: its states must stay frozen after


def tagging_model(seed: int = 0) -> Sequential:
    """LSTM -> tanh -> GRU -> dense per step, float64, parameters drawn then perturbed (biases not zero)."""
    model = Sequential([LSTM(5, return_sequences=True), Tanh(), GRU(4, return_sequences=True), Dense(3)], (None, 2),
                       dtype="float64")
    model.init_params(seed, "xavier")
    model.params += np.random.default_rng(seed).normal(0, 0.1, model.n_params)
    return model


def tagged_batch(lengths=LENGTHS, steps: int = 16, seed: int = 1):
    """Sequences of `lengths` (2 features) and random classes per step, padded to `steps` (NaN, -1)."""
    rng = np.random.default_rng(seed)
    return padded_batch([rng.normal(size=(n, 2)) for n in lengths], [rng.integers(0, 3, n) for n in lengths], steps)


@pytest.mark.parametrize("steps", [1, 5, 7])
def test_the_segments_outputs_are_the_whole_sequences_outputs(steps):
    model = tagging_model()
    x, y = tagged_batch()
    whole = model.forward(x).copy()
    valid = y >= 0
    segments = Segments(model, steps)
    assert segments.count(16) == -(-16 // steps)
    for s in range(segments.count(16)):
        batch, classes = segments.cut(x, y, s)
        assert batch.values.flags.c_contiguous and batch.values.shape[1] == min(steps, 16 - s * steps)
        np.testing.assert_array_equal(batch.lengths, np.clip(x.lengths - s * steps, 0, steps))
        out = model.forward(batch)
        segments.keep()
        here = valid[:, s * steps:(s + 1) * steps]
        np.testing.assert_array_equal(classes >= 0, here)
        np.testing.assert_allclose(out[here], whole[:, s * steps:(s + 1) * steps][here], rtol=1e-12, atol=1e-12)
    segments.reset()  # the next batch starts from zeros: an ordinary forward again
    np.testing.assert_array_equal(model.forward(x)[valid], whole[valid])


def test_states_after_a_sequences_end_are_frozen_and_start_at_zero_with_each_batch():
    model = tagging_model()
    x, y = tagged_batch()
    segments = Segments(model, 5)
    lstm = model.layers[0]
    model.forward(segments.cut(x, y, 0)[0])
    segments.keep()
    ended = {name: state[0].copy() for name, state in lstm.final_states().items()}  # length 3: ended in segment 0
    model.forward(segments.cut(x, y, 1)[0])
    for name, state in lstm.final_states().items():
        np.testing.assert_array_equal(state[0], ended[name])
        assert np.abs(state[1] - segments._kept(lstm, 5, np.float64)[name][1]).max() > 1e-3  # the others moved on
    segments.cut(x, y, 0)  # a new batch's first segment: zeros, whatever was kept
    assert lstm.initial_states is None


@pytest.mark.parametrize("layers, refused", [
    ("[{type: lstm, units: 4, return_sequences: true, bidirectional: true}, {type: dense, units: 2}]",
     r"model.layers\[0\] \(lstm\) cannot be cut into segments: a bidirectional layer"),
    ("[{type: gru, units: 4}, {type: dense, units: 2}]",
     r"model.layers\[0\] \(gru\) cannot be cut into segments: it returns its last state"),
    ("[{type: dense, units: 4}, {type: conv1d, filters: 4, kernel: 3}, {type: dense, units: 2}]",
     r"model.layers\[1\] \(conv1d\) cannot be cut into segments: its kernel reads steps before"),
    ("[{type: lstm, units: 4, return_sequences: true}, {type: global_avg_pool}, {type: dense, units: 2}]",
     r"model.layers\[1\] \(global_avg_pool\) cannot be cut into segments: it reduces a whole sequence"),
    ("[{type: lstm, units: 4, return_sequences: true}, {type: batchnorm}, {type: dense, units: 2}]",
     r"model.layers\[1\] \(batchnorm\) cannot be cut into segments: it does not take sequences step by step"),
])
def test_layers_that_cannot_be_cut_are_refused_with_the_config(tmp_path, layers, refused):
    path = tmp_path / "exp.yaml"
    path.write_text(f"data: {{path: d}}\nmodel: {{layers: {layers}}}\ntrain: {{tbptt_steps: 8}}\n")
    with pytest.raises(ConfigError, match=rf"exp.yaml: train.tbptt_steps is 8, but {refused}") as error:
        load_config(str(path))
    assert "\n" not in str(error.value)
    assert load_config(str(path), ["train.tbptt_steps=0"]).train.tbptt_steps == 0  # refused for TBPTT alone


def test_a_per_step_model_the_graph_and_the_domain(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("data: {path: d}\nmodel: {layers: [{type: token_embedding, dim: 4}, {type: dropout, rate: 0.1}, "
                    "{type: lstm, units: 4, return_sequences: true}, {type: dense, units: 4, activation: relu}, "
                    "{type: gru, units: 4, return_sequences: true}, {type: dense, units: 2}]}\n")
    assert load_config(str(path), ["train.tbptt_steps=16"]).train.tbptt_steps == 16
    with pytest.raises(ConfigError, match=r"--set train.tbptt_steps=-1: train.tbptt_steps is -1, expected an "
                                          r"integer in \[0, 1e6\]"):
        load_config(str(path), ["train.tbptt_steps=-1"])
    with pytest.raises(ConfigError, match=r"train.tbptt_steps is 4, but the model is a model.graph"):
        load_config(str(path), ["model.layers=[]", "model.graph=[{name: h, type: dense, input: numeric, units: 2}]",
                                "train.tbptt_steps=4"])


def test_dropout_and_per_step_layers_run_in_segments():
    """Dense and element-wise layers need no state: a model of them and an LSTM still gives the whole outputs."""
    model = Sequential([Dense(4, activation="relu"), Dropout(0.5), LSTM(3, return_sequences=True), Dense(2)],
                       (None, 2), dtype="float64")
    model.init_params(3, "xavier")
    x, y = tagged_batch()
    whole = model.forward(x).copy()  # dropout is off outside training
    segments = Segments(model, 6)
    for s in range(segments.count(16)):
        batch, classes = segments.cut(x, y, s)
        out = model.forward(batch)
        segments.keep()
        np.testing.assert_allclose(out[classes >= 0], whole[:, s * 6:(s + 1) * 6][classes >= 0], rtol=1e-12)
