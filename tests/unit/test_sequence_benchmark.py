"""The pieces of benchmarks/sequences.py: IDX images as Parquet sequences of their pixel rows (what `mpitrain etl
--sequence rows` reads), the FLOPs per sample its speed rows are divided by, and PyTorch twins
(benchmarks/torch_sequences.py) that compute what mpitrain's layers compute on ragged batches."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from mpitrain.data.sequences import SequenceBatch
from mpitrain.nn.layers import Dense
from mpitrain.nn.recurrent import LSTM
from mpitrain.nn.sequence import Conv1D, GlobalMaxPool1D
from mpitrain.testing.datasets import make_idx_folder
from mpitrain.testing.flops import sgemm_rate, training_flops
from mpitrain.testing.gradients import padded_batch, sequence_model
from mpitrain.testing.launch import REPO
from mpitrain.testing.sequences import write_image_rows_parquet


@pytest.mark.parametrize("split", ["train", "test"])  # train's IDX files are gzipped, test's plain
def test_images_become_parquet_records_of_28_steps_of_28_pixels_over_255(tmp_path, split):
    images, labels = make_idx_folder(tmp_path / "idx")[split]
    assert write_image_rows_parquet(tmp_path / "rows.parquet", str(tmp_path / "idx"), split, limit=3) == 3
    table = pq.read_table(tmp_path / "rows.parquet")
    assert table.column_names == ["label", "rows"]
    assert table.column("label").to_pylist() == labels[:3].tolist()
    rows = np.array(table.column("rows").to_pylist(), np.float32)
    np.testing.assert_array_equal(rows, images[:3].astype(np.float32) / 255)


def test_training_flops_are_three_times_the_forward_products():
    lstm = [{"type": "lstm", "units": 3}, {"type": "dense", "units": 4}]
    assert training_flops(lstm, features=2, length=10) == 3 * (10 * 2 * (2 + 3) * 4 * 3 + 2 * 3 * 4)
    conv = [{"type": "conv1d", "filters": 4, "kernel": 3, "activation": "relu"},
            {"type": "conv1d", "filters": 5, "kernel": 2, "stride": 2, "padding": "valid"},
            {"type": "global_max_pool"}, {"type": "dense", "units": 6}]
    # causal: 10 steps out; valid, span 2, stride 2: (10 - 2) // 2 + 1 = 5 steps
    assert training_flops(conv, features=2, length=10) == 3 * (10 * 2 * 3 * 2 * 4 + 5 * 2 * 2 * 4 * 5 + 2 * 5 * 6)


def test_a_layer_without_a_count_is_refused():
    with pytest.raises(ValueError, match="no FLOP count for a gru layer"):
        training_flops([{"type": "gru", "units": 3}], features=2, length=10)


def test_the_sgemm_rate_is_a_rate():
    assert 1e8 < sgemm_rate(n=64, repeat=2) < 1e14


def torch_gates(a: np.ndarray):
    """An LSTM parameter's gate columns from mpitrain's order (i, o, f, c: ONNX's) to PyTorch's (i, f, c, o)."""
    import torch
    i, o, f, c = np.split(a, 4, axis=-1)
    return torch.from_numpy(np.concatenate([i, f, c, o], axis=-1))


def torch_twin(specs: list[dict], layers: list, features: int):
    """benchmarks/torch_sequences.py's model of `specs` (float64), holding the parameters of mpitrain's `layers`."""
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("torch_sequences", os.path.join(REPO, "benchmarks",
                                                                                   "torch_sequences.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    twin = module.SequenceModel(specs, features).double()
    with torch.no_grad():
        for layer, mine in zip(twin.layers, layers):
            if isinstance(layer, module.Conv1d):  # mpitrain's W is (kernel, F, filters), torch's (filters, F, kernel)
                layer.conv.weight.copy_(torch.from_numpy(mine.params["W"].transpose(2, 1, 0)))
                layer.conv.bias.copy_(torch.from_numpy(mine.params["b"]))
            elif isinstance(layer, module.LSTM):  # mpitrain's gates i, o, f, c (ONNX's); torch's i, f, c, o
                layer.lstm.weight_ih_l0.copy_(torch_gates(mine.params["W"]).T)
                layer.lstm.weight_hh_l0.copy_(torch_gates(mine.params["R"]).T)
                layer.lstm.bias_ih_l0.copy_(torch_gates(mine.params["b"]))
                layer.lstm.bias_hh_l0.zero_()
            elif isinstance(layer, module.Dense):
                layer.linear.weight.copy_(torch.from_numpy(mine.params["W"].T))
                layer.linear.bias.copy_(torch.from_numpy(mine.params["b"]))
    return twin, torch


@pytest.mark.parametrize("specs, layers", [
    ([{"type": "conv1d", "filters": 6, "kernel": 4, "activation": "relu"},
      {"type": "conv1d", "filters": 5, "kernel": 3, "activation": "relu"}, {"type": "global_max_pool"},
      {"type": "dense", "units": 4}],
     lambda: [Conv1D(6, 4, activation="relu"), Conv1D(5, 3, activation="relu"), GlobalMaxPool1D(), Dense(4)]),
    ([{"type": "lstm", "units": 5}, {"type": "dense", "units": 4}], lambda: [LSTM(5), Dense(4)]),
], ids=["conv1d", "lstm"])
def test_the_pytorch_twins_compute_what_mpitrain_computes_on_ragged_batches(specs, layers):
    layers = layers()
    model = sequence_model(layers, features=2)
    # garbage in the padding: each engine must ignore it
    x, lengths = padded_batch([np.random.default_rng(b).normal(size=(n, 2)) for b, n in enumerate([9, 3, 12, 5])], 16)
    expected = model.forward(SequenceBatch(x, lengths), False)
    twin, torch = torch_twin(specs, layers, features=2)
    with torch.no_grad():
        got = twin(torch.from_numpy(x), torch.from_numpy(lengths)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
