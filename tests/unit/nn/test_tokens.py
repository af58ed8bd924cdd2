"""The token_embedding layer: rows of its table by a sequence's ids, its table gradient against central differences
(float64), padding that holds anything, ids outside the table named, and the build rules (ids from the dataset,
first layer only)."""
from __future__ import annotations

import numpy as np
import pytest

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.config.sections import ModelConfig
from mpitrain.data.sequences import SequenceBatch
from mpitrain.nn.model import build_model
from mpitrain.nn.tokens import TokenEmbedding
from mpitrain.testing.gradients import numeric_grad, sequence_model


def batch(ids: list[list[int]], steps: int, padding: float = 1e6) -> SequenceBatch:
    x = np.full((len(ids), steps, 1), padding)
    for b, row in enumerate(ids):
        x[b, :len(row), 0] = row
    return SequenceBatch(x, np.array([len(row) for row in ids]))


def test_rows_are_the_tables_and_the_table_gradient_is_exact_at_valid_steps():
    model = sequence_model([TokenEmbedding(dim=3, ids=7)], 1)
    x = batch([[1, 4, 4, 0], [6, 2]], steps=6)  # padding far outside the table: read as id 0, never reported
    table = model.layers[0].params["table"]
    y = model.forward(x, training=True)
    np.testing.assert_array_equal(y[0, :4], table[[1, 4, 4, 0]])
    np.testing.assert_array_equal(y[1, :2], table[[6, 2]])
    weights = np.random.default_rng(0).normal(size=y.shape)
    weights[1, 2:] = weights[0, 4:] = 0  # a masked loss: nothing at padded steps

    def loss():
        return float((model.forward(x, training=True) * weights).sum())
    loss()
    assert model.layers[0].backward(weights, input_grad=False) is None
    np.testing.assert_allclose(model.grads, numeric_grad(loss, model.params), rtol=1e-6, atol=1e-9)


def test_an_id_outside_the_table_is_one_data_error():
    model = sequence_model([TokenEmbedding(dim=2, ids=5)], 1)
    with pytest.raises(DataError, match=r"a token id 5 is outside the token_embedding's table of 5 ids"):
        model.forward(batch([[1, 5]], steps=2), training=False)


def test_ids_come_from_the_datasets_column_and_the_layer_must_come_first():
    tokens = {"type": "token_embedding", "dim": 4}
    head = [{"type": "lstm", "units": 3}, {"type": "dense", "units": 2}]
    model = build_model(ModelConfig(layers=[tokens, *head]), (None, 1), 2, np,
                        sequence={"name": "t", "features": 1, "longest": 9, "shortest": 2, "ids": 11})
    assert model.layers[0].params["table"].shape == (11, 4)
    with pytest.raises(ConfigError, match=r"ids is 'auto', but the dataset's sequence column has no ids"):
        build_model(ModelConfig(layers=[tokens, *head]), (None, 1), 2, np, sequence={"longest": 9})
    with pytest.raises(ConfigError, match=r"model.layers\[1\] \(token_embedding\) reads the dataset's token ids, "
                                          r"expected it as the first layer"):
        build_model(ModelConfig(layers=[{"type": "dropout", "rate": 0.1}, tokens, *head]), (None, 1), 2, np)
    with pytest.raises(ConfigError, match=r"expected an integer >= 1 \(one table\)"):
        build_model(ModelConfig(layers=[{**tokens, "dim": "auto"}, *head]), (None, 1), 2, np)


def test_a_valid_conv1d_longer_than_the_shortest_sequence_is_refused_at_build():
    layers = [{"type": "conv1d", "filters": 2, "kernel": 5, "padding": "valid"}, {"type": "global_max_pool"},
              {"type": "dense", "units": 2}]
    build_model(ModelConfig(layers=layers), (None, 3), 2, np, sequence={"longest": 30, "shortest": 5})
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(conv1d\)"):
        build_model(ModelConfig(layers=layers), (None, 3), 2, np, sequence={"longest": 30, "shortest": 4})
