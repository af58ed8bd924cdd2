"""Position embeddings (`positional`, learned or sinusoidal): gradients against central differences on padded
sequences (float64), the sinusoids' closed form, padding invariance, `max_steps: auto` from the dataset's longest
sequence in a list of layers and in a graph, and one clear error for a sequence longer than the table, an input that
is no sequence, and truncated BPTT."""
import math

import numpy as np
import pytest

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.config.sections import ModelConfig
from mpitrain.data.shards import InputGroup
from mpitrain.nn.graph import build_graph
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import build_model
from mpitrain.nn.positional import Positional, sinusoidal_table
from mpitrain.nn.segments import check_layers
from mpitrain.nn.sequence import GlobalAvgPool1D
from mpitrain.testing.gradients import check_sequence_gradients, sequence_model, sequences

SEQUENCE = {"longest": 9, "shortest": 2}


@pytest.mark.parametrize("encoding", ["learned", "sinusoidal"])
@pytest.mark.parametrize("lengths", [np.array([5, 1, 3]), None], ids=["masked", "unmasked"])
def test_gradients_on_padded_sequences(encoding, lengths):
    model = check_sequence_gradients([Dense(4), Positional(encoding, max_steps=8), GlobalAvgPool1D(), Dense(3)],
                                     features=3, lengths=lengths, steps=6)
    assert ("01_positional/table", (8, 4)) in model.layout if encoding == "learned" else model.n_params == 3 * 4 + 4 + 15


def test_sinusoids_have_their_closed_form():
    table = sinusoidal_table(50, 6)
    for t, i in [(0, 0), (7, 1), (49, 2)]:
        angle = t / 10000 ** (2 * i / 6)
        assert table[t, 2 * i] == pytest.approx(math.sin(angle)) and table[t, 2 * i + 1] == pytest.approx(math.cos(angle))
    assert sinusoidal_table(4, 5).shape == (4, 5)  # an odd width: the last sine has no cosine


def test_each_step_gets_its_row_whatever_the_padding():
    model = sequence_model([Positional(max_steps=12)], 2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 2))
    short = model.forward(sequences(x, np.array([5, 3])), training=False).copy()
    longer = model.forward(sequences(np.concatenate([x, rng.normal(size=(2, 7, 2))], axis=1), np.array([5, 3])),
                           training=False)
    np.testing.assert_array_equal(longer[:, :5], short)
    np.testing.assert_allclose(short - x, np.broadcast_to(model.layers[0].params["table"][:5], short.shape),
                               rtol=0, atol=1e-15)


def test_max_steps_auto_is_the_datasets_longest():
    layers = [{"type": "positional"}, {"type": "global_avg_pool"}, {"type": "dense", "units": 3}]
    assert build_model(ModelConfig(layers=layers), (None, 2), 3, np, sequence=SEQUENCE).layers[0].max_steps == 9
    graph = [{"name": "where", "type": "positional", "input": "events", "encoding": "sinusoidal"},
             {"name": "pool", "type": "global_avg_pool", "input": "where"},
             {"name": "out", "type": "dense", "input": "pool", "units": 3}]
    model = build_graph(ModelConfig(graph=graph), {"numeric": InputGroup(0, (1,))}, (1,), 3, np,
                        sequences={"events": (None, 2)}, steps=11)
    assert model.layers[0].max_steps == 11 and model.n_params == 2 * 3 + 3


def test_errors_name_what_is_wrong():
    layers = [{"type": "positional"}, {"type": "global_avg_pool"}, {"type": "dense", "units": 3}]
    model = build_model(ModelConfig(layers=layers), (None, 2), 3, np, sequence=SEQUENCE)
    with pytest.raises(DataError, match="a sequence of 10 steps, but the positional layer's table holds 9"):
        model.forward(sequences(np.zeros((2, 16, 2), np.float32), np.array([10, 3])))
    model.forward(sequences(np.zeros((2, 16, 2), np.float32), np.array([9, 3])))  # padded past it: fine
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(positional\) on inputs of shape \[4\]: a positional "
                                          r"layer numbers a sequence's steps"):
        build_model(ModelConfig(layers=[{"type": "positional", "max_steps": 4}, {"type": "dense", "units": 3}]),
                    (4,), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[0\].encoding is 'rotary', expected one of"):
        build_model(ModelConfig(layers=[{"type": "positional", "encoding": "rotary"}]), (None, 2), 3, np,
                    sequence=SEQUENCE)
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(positional\) cannot be cut into segments: a "
                                          "segment's steps would be numbered from 0 again"):
        check_layers(4, layers, [])


def test_gradients_of_a_batch_padded_past_the_table():
    check_sequence_gradients([Dense(4), Positional(max_steps=5), GlobalAvgPool1D(), Dense(3)], features=3,
                             lengths=np.array([5, 1, 3]), steps=7)
