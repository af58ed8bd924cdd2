"""Fine-tuning under real `mpiexec -n 2`: a run started with `model.init_from` another run copies the arrays whose
names and shapes match (a trained first layer under a new head), says so in one line, and trains to identical
replicas; a source that fits nothing is one clear error on every rank, exit 2."""
import json

import pytest

from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec

TRAIN = {"epochs": 1, "batch_size": 16, "seed": 1, "log_every": 10}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("source")
    make_dataset(folder / "data", n_train=320, n_test=64)
    config = write_config(folder / "source.yaml", folder / "data", run_dir=str(folder / "source"), train=TRAIN)
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    return folder


def test_a_new_head_over_a_trained_layer_starts_from_its_arrays(trained, tmp_path):
    layers = [{"type": "dense", "units": 16, "activation": "relu"}, {"type": "dense", "units": 8, "activation": "tanh"},
              {"type": "dense", "units": 3}]
    config = write_config(tmp_path / "tuned.yaml", trained / "data", run_dir=str(tmp_path / "tuned"), train=TRAIN,
                          model={"layers": layers, "init_from": str(trained / "source")})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if "model.init_from" in line)
    assert "copied 2 arrays (00_dense/W, 00_dense/b)" in line and "ckpt-0001-000000.h5" in line
    assert "skipped 2 of another shape (02_dense/W [16, 3] here [16, 8], 02_dense/b [3] here [8])" in line
    assert "2 start fresh (04_dense/W, 04_dense/b)" in line
    assert len(set(json.loads((tmp_path / "tuned" / "summary.json").read_text())["replica_hashes"])) == 1


def test_a_source_that_fits_nothing_is_one_error(trained, tmp_path):
    config = write_config(tmp_path / "other.yaml", trained / "data", run_dir=str(tmp_path / "other"), train=TRAIN,
                          model={"layers": [{"type": "dense", "units": 7}, {"type": "dense", "units": 3}],
                                 "init_from": str(trained / "source")})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "no array of it fits this model" in line]
    assert len(errors) == 1, result.stderr
