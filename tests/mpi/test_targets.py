"""Targets beside class labels (issue 28): binary, multilabel and regression datasets train on 2 ranks with their
losses, evaluate with their metrics, and a loss that does not fit the target is one line before anything runs."""
import json

import pytest

from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec

HIDDEN = {"type": "dense", "units": 16, "activation": "relu"}
CASES = {  # target: (loss, outputs, what the test split's metrics must reach)
    "binary": ("binary_cross_entropy", 1, lambda m: m["auc"] > 0.95 and m["accuracy"] > 0.85),
    "multilabel": ("multilabel_cross_entropy", 2, lambda m: m["auc_macro"] > 0.95),
    "regression": ("mse", 2, lambda m: m["r2"] > 0.8 and m["accuracy"] is None),
}


@pytest.mark.parametrize("target", sorted(CASES))
def test_a_target_trains_with_its_loss_and_evaluates_with_its_metrics(tmp_path, target):
    loss, outputs, reached = CASES[target]
    make_dataset(tmp_path / "data", n_train=1200, n_test=300, target=target)
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", train={"epochs": 4, "batch_size": 16},
                          model={"layers": [HIDDEN, {"type": "dense", "units": outputs}], "loss": loss},
                          optimizer={"type": "adam", "lr": 0.01})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert reached(summary["evaluation"]), summary["evaluation"]
    assert summary["evaluation"]["rows"] == 300 and len(set(summary["replica_hashes"])) == 1
    scored = mpiexec(2, MPITRAIN, "eval", tmp_path / "run", timeout=60)
    assert scored.returncode == 0, scored.stderr
    written = json.loads((tmp_path / "run" / "eval-test.json").read_text())
    assert written["loss"] == pytest.approx(summary["evaluation"]["loss"], rel=1e-6)


def test_a_loss_that_does_not_fit_the_target_is_one_line_before_anything_is_written(tmp_path):
    make_dataset(tmp_path / "data", n_train=200, target="regression")
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data",
                          model={"layers": [HIDDEN, {"type": "dense", "units": 2}]})  # softmax_cross_entropy
    result = mpiexec(2, MPITRAIN, "train", config, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("model.loss is softmax_cross_entropy, but the dataset's target is regression") == 1
    assert not (tmp_path / "run").exists()
