"""The pieces of benchmarks/sequences.py and transformers.py: IDX images as Parquet sequences of their pixel rows
(what `mpitrain etl --sequence rows` reads), a UEA problem's .ts files from the sktime package as Parquet, and the
FLOPs per sample its speed rows are divided by. (That its PyTorch twins compute what
mpitrain's layers compute the benchmark checks itself before it times them, `torch_sequences.check_twins`.)"""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from mpitrain.testing.datasets import make_idx_folder
from mpitrain.testing.flops import sgemm_rate, training_flops
from mpitrain.testing.sequences import write_image_rows_parquet, write_uea_parquet


@pytest.mark.parametrize("split", ["train", "test"])  # train's IDX files are gzipped, test's plain
def test_images_become_parquet_records_of_28_steps_of_28_pixels_over_255(tmp_path, split):
    images, labels = make_idx_folder(tmp_path / "idx")[split]
    assert write_image_rows_parquet(tmp_path / "rows.parquet", str(tmp_path / "idx"), split, limit=3) == 3
    table = pq.read_table(tmp_path / "rows.parquet")
    assert table.column_names == ["label", "rows"]
    assert table.column("label").to_pylist() == labels[:3].tolist()
    rows = np.array(table.column("rows").to_pylist(), np.float32)
    np.testing.assert_array_equal(rows, images[:3].astype(np.float32) / 255)


def test_basicmotions_becomes_parquet_records_of_100_steps_of_6_channels(tmp_path):
    assert write_uea_parquet(tmp_path / "train.parquet", "BasicMotions", "TRAIN") == 40
    table = pq.read_table(tmp_path / "train.parquet")
    assert table.column_names == ["label", "channels"]
    labels = table.column("label").to_pylist()
    assert sorted(set(labels)) == ["badminton", "running", "standing", "walking"] and labels.count("walking") == 10
    records = np.array(table.column("channels").to_pylist(), np.float32)
    assert records.shape == (40, 100, 6)
    # the file's first record, channel 1 (its first line after @data): 0.079106, 0.079106, -0.903497, ...
    np.testing.assert_allclose(records[0, :3, 0], [0.079106, 0.079106, -0.903497], rtol=1e-6)


def test_training_flops_are_three_times_the_forward_products():
    lstm = [{"type": "lstm", "units": 3}, {"type": "dense", "units": 4}]
    assert training_flops(lstm, features=2, length=10) == 3 * (10 * 2 * (2 + 3) * 4 * 3 + 2 * 3 * 4)
    conv = [{"type": "conv1d", "filters": 4, "kernel": 3, "activation": "relu"},
            {"type": "conv1d", "filters": 5, "kernel": 2, "stride": 2, "padding": "valid"},
            {"type": "global_max_pool"}, {"type": "dense", "units": 6}]
    # causal: 10 steps out; valid, span 2, stride 2: (10 - 2) // 2 + 1 = 5 steps
    assert training_flops(conv, features=2, length=10) == 3 * (10 * 2 * 3 * 2 * 4 + 5 * 2 * 2 * 4 * 5 + 2 * 5 * 6)


def test_a_transformers_flops_are_its_projections_scores_and_feed_forward_net():
    layers = [{"type": "dense", "units": 8}, {"type": "positional"},
              {"type": "transformer", "heads": 2, "ff_units": 16}, {"type": "layernorm"},
              {"type": "global_avg_pool"}, {"type": "dense", "units": 3}]
    block = 10 * 2 * 4 * 8 * 8 + 2 * 2 * 10 * 10 * 8 + 10 * 2 * 2 * 8 * 16  # q, k, v, out; scores, values; ff
    assert training_flops(layers, features=2, length=10) == 3 * (10 * 2 * 2 * 8 + block + 2 * 8 * 3)


def test_a_layer_without_a_count_is_refused():
    with pytest.raises(ValueError, match="no FLOP count for a gru layer"):
        training_flops([{"type": "gru", "units": 3}], features=2, length=10)


def test_the_sgemm_rate_is_a_rate():
    assert 1e8 < sgemm_rate(n=64, repeat=2) < 1e14
