"""The data's units and the model's (`mpitrain.data.units`): a regression target trains standardized by its train
split's statistics and comes back in its own units; an autoencoder's reconstruction comes back as stored; a manifest
checks its target statistics."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from mpitrain.base.errors import DataError
from mpitrain.data.reader import Batches, DatasetReader
from mpitrain.data.shards import MANIFEST_NAME, read_manifest
from mpitrain.data.units import IDENTITY, input_units, output_units, target_units
from mpitrain.parallel.backend import create_backend
from mpitrain.testing.datasets import make_dataset, read_split


def test_a_regression_target_trains_standardized_per_column_and_comes_back_in_its_own_units(tmp_path):
    manifest = make_dataset(tmp_path, n_train=120, n_test=10, shards=2, target="regression")
    _, y = read_split(tmp_path, "train")
    np.testing.assert_allclose(manifest.target_mean, y.mean(axis=0, dtype=np.float64), rtol=1e-12)
    np.testing.assert_allclose(manifest.target_std, y.std(axis=0, dtype=np.float64), rtol=1e-12)
    assert manifest.target_mean[0] > 200 and abs(manifest.target_mean[1]) < 1  # columns of unlike scales

    def epoch(standardize_targets):
        reader = DatasetReader(str(tmp_path), SimpleNamespace(rank=0, size=1))
        rows = reader.train_rows("train", 40, 1.0, 0, shuffle=True)
        batches = Batches(rows, reader.manifest, create_backend("numpy"), "float32", 0, 0, prefetch=False,
                          standardize_targets=standardize_targets)
        return np.concatenate([y.copy() for _, y in batches.epoch(0)])

    trained, raw = epoch(True), epoch(False)
    np.testing.assert_allclose(trained.mean(axis=0), 0.0, atol=1e-5)  # every train row once: exactly standardized
    np.testing.assert_allclose(trained.std(axis=0), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.sort(raw, axis=0), np.sort(y, axis=0))  # false: the target as stored
    units = target_units(manifest, True)
    np.testing.assert_allclose(units.to_data(trained.astype(np.float64)), raw, rtol=1e-6, atol=1e-5)  # float32
    assert units.to_model(raw).dtype == np.float32


def test_only_a_regression_target_with_statistics_has_units_and_a_reconstruction_has_its_inputs(tmp_path):
    regression = make_dataset(tmp_path / "r", n_train=20, n_test=4, shards=1, target="regression")
    images = make_dataset(tmp_path / "c", n_train=20, n_test=4, shards=1)
    assert target_units(regression, False) is IDENTITY and target_units(images, True) is IDENTITY
    older = SimpleNamespace(target="regression", target_mean=[], target_std=[])  # a manifest of an earlier ETL
    assert target_units(older, True) is IDENTITY
    units = input_units(images, normalize=True)  # data = (model * std + mean): pixels * scale + offset, as stored
    x = np.arange(256, dtype=np.float64)
    model_input = (x * images.scale + images.offset - images.mean) / images.std
    np.testing.assert_allclose(units.to_data(model_input), x * images.scale + images.offset, atol=1e-12)
    assert input_units(images, normalize=False) is IDENTITY
    assert output_units(images, True, True, reconstruction=True, loss="binary_cross_entropy") is IDENTITY
    assert output_units(images, True, True, reconstruction=True, loss="mse") == units


@pytest.mark.parametrize("mean, std", [([1.0], [1.0, 2.0]), ([1.0, 2.0], [1.0, 0.0]), ([1.0, "x"], [1.0, 1.0]),
                                       ([1.0, 2.0], [])])
def test_a_manifest_s_target_statistics_are_one_finite_number_per_column_with_a_positive_std(tmp_path, mean, std):
    make_dataset(tmp_path, n_train=10, n_test=4, shards=1, target="regression")
    path = tmp_path / MANIFEST_NAME
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "target_mean": mean, "target_std": std}))
    with pytest.raises(DataError, match=r"manifest.json: target_mean .* expected both empty, or for a regression "
                                        r"target one finite number per target column each \(2\)"):
        read_manifest(str(tmp_path))
    path.write_text(json.dumps({**data, "target_mean": [], "target_std": []}))
    assert read_manifest(str(tmp_path)).target_mean == []
