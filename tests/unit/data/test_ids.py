"""Categorical ids as integers end to end in the reader: a shard's `ids` (int32) reach evaluation batches and
training batches as stored, ids beyond float32's integers (2**24) included; a manifest of the float32 ids of old
is refused saying how to write it again; a shard's id beyond its column is one error naming the column."""
import json

import numpy as np
import pytest

from mpitrain.base.errors import DataError
from mpitrain.data.encoding import ID_DTYPE, MAX_IDS
from mpitrain.data.reader import DatasetReader
from mpitrain.data.sequences import Inputs
from mpitrain.data.shards import MANIFEST_NAME, Manifest, read_manifest, shard_path, write_manifest, write_shard
from tests.unit.data.test_reader import ranks, train_batches

COLUMNS = {"numeric": [{"name": "n"}], "categorical": [{"name": "user", "ids": MAX_IDS, "hash_buckets": MAX_IDS - 1,
                                                          "hash": "fnv1a64-splitmix64"}, {"name": "shop", "ids": 5,
                                                                                          "vocabulary": [1, 2, 3]}]}


def write_table(path, ids: np.ndarray) -> Manifest:
    """Rows 0..n-1: x the row number, ids as given, labels alternating; one train shard, the manifest."""
    n = len(ids)
    x, y = np.arange(n, dtype=np.float32)[:, None], np.arange(n, dtype=np.int32) % 2
    splits = {"train": [write_shard(str(path), shard_path("train", 0), x, y, ids=ids)]}
    manifest = Manifest((1,), "float32", 1.0, 0.0, 0.0, 1.0, 2, {"train": [n // 2, n - n // 2]}, splits,
                        checksums="fletcher32", columns=COLUMNS, id_dtype=ID_DTYPE)
    write_manifest(str(path), manifest)
    return manifest


def big_ids(n: int) -> np.ndarray:
    users = np.array([2**24 + 1, 2**31 - 1, 2**24 + 3, 7] * (n // 4), np.int64)[:n]
    return np.column_stack([users, np.arange(n) % 5]).astype(np.int32)


def test_ids_beyond_two_to_the_24_reach_evaluation_and_training_batches_as_stored(tmp_path):
    ids = big_ids(40)
    manifest = write_table(tmp_path, ids)
    assert read_manifest(str(tmp_path)).input_groups["categorical"].ids == (MAX_IDS, 5)
    assert DatasetReader(str(tmp_path), ranks(1)).row_bytes == 4 + 2 * 4  # a float32 number, two int32 ids
    assert manifest.input_groups["numeric"].shape == (1,)
    (x, y), = DatasetReader(str(tmp_path), ranks(1)).eval_rows("train").batches(64)
    assert isinstance(x, Inputs) and x.columns["categorical"].dtype == np.int32
    np.testing.assert_array_equal(x.columns["categorical"], ids)
    for batch, labels in train_batches(tmp_path, 8).epoch(0):
        rows = batch.x[:, 0].astype(int)  # each row's number: its ids are the stored ones of that row
        np.testing.assert_array_equal(batch.columns["categorical"], ids[rows])


def test_a_manifest_of_float32_ids_is_refused_saying_how_to_write_it_again(tmp_path):
    write_table(tmp_path, big_ids(8))
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    data.pop("id_dtype")
    data["feature_shape"] = [3]  # as the ETL wrote a table before: numbers then ids in x
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"manifest.json: its ids are stored in float32 x, as an earlier mpitrain "
                                        r"wrote them .* run `mpitrain etl` .* on the source again"):
        read_manifest(str(tmp_path))


def test_an_id_beyond_its_column_is_one_error_naming_the_shard_and_column(tmp_path):
    ids = big_ids(8)
    ids[5, 1] = 5  # shop has ids 0..4
    write_table(tmp_path, ids)
    with pytest.raises(DataError, match=r"shard-00000.h5: categorical column 'shop' holds id 5, expected 0\.\.4"):
        next(DatasetReader(str(tmp_path), ranks(1)).eval_rows("train").batches(64))
