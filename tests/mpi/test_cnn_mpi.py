"""Conv nets with batch norm and dropout under real `mpiexec -n 2`: every sync mode keeps one
model (parameters AND running statistics), and the statistics are averaged across ranks."""
import json
import os
import sys

import h5py
import numpy as np
import pytest

from mpitrain.rundir.checkpoint import list_checkpoints
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, RANK_SCRIPTS, mpiexec

CNN = {"layers": [  # LeNet's shape, small: two conv + pool blocks (batch norm in the first), dense, softmax
    {"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same"}, {"type": "batchnorm"}, {"type": "relu"},
    {"type": "maxpool2d", "pool": 2}, {"type": "conv2d", "filters": 6, "kernel": 3, "activation": "relu"},
    {"type": "maxpool2d", "pool": 2}, {"type": "flatten"}, {"type": "dense", "units": 12, "activation": "relu"},
    {"type": "dropout", "rate": 0.2}, {"type": "dense", "units": 3}]}


def test_batchnorm_statistics_become_the_ranks_mean_in_every_mode():
    result = mpiexec(2, sys.executable, os.path.join(RANK_SCRIPTS, "batchnorm_stats.py"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("OK") == 9, result.stdout


@pytest.mark.parametrize("sync", [{"mode": "allreduce"}, {"mode": "averaging", "frequency": 3},
                                  {"mode": "sharing", "threshold": 1.0e-2}, {"mode": "none"}])
def test_a_conv_net_with_batchnorm_and_dropout_trains_in_every_mode(tmp_path, sync):
    make_dataset(tmp_path / "data", n_train=480, shape=(1, 12, 12))
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", model=CNN, sync=sync)
    result = mpiexec(2, MPITRAIN, "train", config)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.8  # 3 classes: chance is 1/3
    assert len(set(summary["replica_hashes"])) == (2 if sync["mode"] == "none" else 1)
    with h5py.File(list_checkpoints(str(tmp_path / "run"))[-1]) as f:
        running_mean, running_var = f["layers/01_batchnorm/mean"][...], f["layers/01_batchnorm/var"][...]
    assert running_mean.shape == (4,) and not np.allclose(running_mean, 0) and not np.allclose(running_var, 1)
