"""The two example scripts run under `mpiexec -n 2`, and their runs evaluate and predict like any other (the
README's quick start runs in tests/system/test_fashion.py)."""
import os
import re
import sys

import h5py

from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.testing.datasets import make_digits_dataset
from mpitrain.testing.launch import MPITRAIN, REPO, mpiexec


def test_examples_run_under_mpiexec_and_their_runs_evaluate_like_any_other(tmp_path):
    make_digits_dataset(tmp_path / "digits")
    outputs, printed = {}, {}
    for script, epochs in (("mlp_sharing.py", 2), ("custom_layers.py", 1)):
        run_dir = tmp_path / script
        result = mpiexec(2, sys.executable, os.path.join(REPO, "examples", script), tmp_path / "digits",
                         "--run-dir", run_dir, "--epochs", epochs, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        accuracy = float(re.search(r"test accuracy (\d\.\d+)", result.stdout).group(1))
        assert accuracy > 0.3  # 10 classes: chance is 0.1
        outputs[script], printed[script] = accuracy, result.stdout
        assert (run_dir / "config.yaml").exists() and (run_dir / "summary.json").exists()
    assert re.search(r"bytes sent per step per rank \((\d+\.\d+)% of a dense gradient\)", printed["mlp_sharing.py"])
    evaluated = mpiexec(2, MPITRAIN, "eval", tmp_path / "custom_layers.py", timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"accuracy {outputs['custom_layers.py']:.4f}" in evaluated.stdout  # the config.yaml rebuilt the model
    run = tmp_path / "mlp_sharing.py"  # its synchronizer replaced the config's allreduce: both files say sharing
    saved = load_checkpoint(list_checkpoints(str(run))[-1]).config_yaml
    assert saved == (run / "config.yaml").read_text() and "mode: sharing" in saved
    predicted = mpiexec(2, MPITRAIN, "predict", tmp_path / "mlp_sharing.py", timeout=120)
    assert predicted.returncode == 0, predicted.stderr
    with h5py.File(tmp_path / "mlp_sharing.py" / "predictions-test.h5") as f:
        assert f"{(f['predicted'][...] == f['label'][...]).mean():.4f}" == f"{outputs['mlp_sharing.py']:.4f}"

