"""Deep belief nets end to end: RBM pretraining under real `mpiexec -n 2` on scikit-learn digits, then fine-tuning."""
import json
import os
import shutil

import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import Config, ModelConfig, load_config
from mpitrain.nn.model import build_model
from mpitrain.testing import launch
from mpitrain.testing.datasets import make_dataset, make_digits_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec
from mpitrain.training.pretrain import _hidden_layers, dbn_layers

REPO = launch.REPO
PRETRAIN = {"layers": [32, 16], "epochs": 4, "lr": 0.1, "momentum": 0.5,
            "sync": {"mode": "averaging", "frequency": "epoch"}}


def dbn_config(folder, data, **sections):
    sections = {"data": {"normalize": False}, "model": {"layers": []}, "pretrain": PRETRAIN,
                "optimizer": {"type": "sgd", "lr": 0.5, "momentum": 0.9},
                "train": {"epochs": 2, "batch_size": 16}, "sync": {"mode": "averaging", "frequency": "epoch"},
                **sections}
    os.makedirs(folder, exist_ok=True)
    return write_config(os.path.join(folder, "exp.yaml"), data, **sections)


def records(run_dir, kind):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    path = tmp_path_factory.mktemp("digits") / "data"
    make_digits_dataset(path)
    return path


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, digits):
    """One 2-rank run: 64-32-16 DBN pretrained with epoch averaging, then fine-tuned for 2 epochs."""
    folder = tmp_path_factory.mktemp("dbn")
    config = dbn_config(folder, digits)
    result = mpiexec(2, MPITRAIN, "train", config)
    assert result.returncode == 0, result.stderr
    return config, folder / "run"


def test_epoch_averaging_keeps_replicas_identical_and_lowers_reconstruction_error(pretrained):
    _, run_dir = pretrained
    pretrain = records(run_dir, "pretrain")
    assert [(r["layer"], r["epoch"]) for r in pretrain] == [(layer, epoch) for layer in (0, 1) for epoch in range(4)]
    for layer, (n_visible, n_hidden) in enumerate([(64, 32), (32, 16)]):
        errors = [r["reconstruction_error"] for r in pretrain if r["layer"] == layer]
        assert all(later < earlier for earlier, later in zip(errors, errors[1:])), errors
        layer_records = [r for r in pretrain if r["layer"] == layer]
        assert all((r["n_visible"], r["n_hidden"]) == (n_visible, n_hidden) for r in layer_records)
        assert all(len(r["replica_hashes"]) == 2 and len(set(r["replica_hashes"])) == 1 for r in layer_records)
        assert all(np.isfinite(r["pseudo_log_likelihood"]) and r["pseudo_log_likelihood"] < 0 for r in layer_records)
    # one averaging of the flat RBM buffer (float32) per epoch, spread over the epoch's steps
    steps = 1437 // 2 // 16
    assert pretrain[0]["bytes_sent_per_step"] == pytest.approx((64 * 32 + 64 + 32) * 4 / steps)
    s = summary(run_dir)
    assert len(set(s["replica_hashes"])) == 1 and s["test_accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert sorted(os.listdir(run_dir / "pretrain")) == ["layer-00.h5", "layer-01.h5"]


def test_resume_skips_finished_layers_and_ends_where_an_uninterrupted_run_does(pretrained, tmp_path):
    config, straight = pretrained
    run_dir = tmp_path / "run"
    shutil.copytree(straight, run_dir)
    # as if killed while pretraining layer 2: only layer 1's checkpoint is on disk
    os.remove(run_dir / "pretrain" / "layer-01.h5")
    shutil.rmtree(run_dir / "checkpoints")
    os.remove(run_dir / "summary.json")
    finished = os.stat(run_dir / "pretrain" / "layer-00.h5").st_mtime_ns
    result = mpiexec(2, MPITRAIN, "train", config, f"--set=run_dir={run_dir}")
    assert result.returncode == 0, result.stderr
    assert "pretrain layer 1/2: loaded" in result.stderr and "pretrain layer 1/2 epoch" not in result.stderr
    assert "pretrain layer 2/2 epoch 4/4" in result.stderr
    assert os.stat(run_dir / "pretrain" / "layer-00.h5").st_mtime_ns == finished
    assert [(r["layer"], r["epoch"]) for r in records(run_dir, "pretrain")] == \
        [(r["layer"], r["epoch"]) for r in records(straight, "pretrain")]
    assert [r["epoch"] for r in records(run_dir, "epoch")] == [0, 1]
    assert summary(run_dir)["replica_hashes"] == summary(straight)["replica_hashes"]


def test_a_layer_checkpoint_of_another_shape_is_refused(pretrained, tmp_path):
    config, straight = pretrained
    run_dir = tmp_path / "run"
    shutil.copytree(straight / "pretrain", run_dir / "pretrain")
    result = mpiexec(2, MPITRAIN, "train", config, f"--set=run_dir={run_dir}", "--set=pretrain.layers=[24, 16]",
                     timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("layer-00.h5: holds") == 1
    assert "layer-00.h5: holds 00_rbm/W of shape [64, 32] where this config's model has 00_rbm/W of shape " \
           "[64, 24]" in result.stderr
    result = mpiexec(2, MPITRAIN, "train", config, f"--set=run_dir={run_dir}", "--set=resume=never", timeout=60)
    assert result.returncode == 2 and "holds pretrained layers of an earlier run" in result.stderr


@pytest.mark.parametrize("mode", ["allreduce", "sharing", "none"])
def test_pretraining_under_other_sync_modes(digits, tmp_path, mode):
    sync = {"mode": mode, "threshold": 1.0e-3} if mode == "sharing" else {"mode": mode}
    config = dbn_config(tmp_path, digits, pretrain={**PRETRAIN, "layers": [24], "epochs": 2, "sync": sync},
                        train={"epochs": 1, "batch_size": 16})
    result = mpiexec(2, MPITRAIN, "train", config)
    assert result.returncode == 0, result.stderr
    pretrain = records(tmp_path / "run", "pretrain")
    assert [r["epoch"] for r in pretrain] == [0, 1]
    assert pretrain[1]["reconstruction_error"] < pretrain[0]["reconstruction_error"]
    if mode == "none":
        assert pretrain[1]["replica_hashes"] == []  # independent replicas: nothing to compare
    else:
        assert len(set(pretrain[1]["replica_hashes"])) == 1
    assert len(set(summary(tmp_path / "run")["replica_hashes"])) == 1


def test_inputs_outside_0_1_for_bernoulli_units_fail_every_rank(tmp_path):
    make_dataset(tmp_path / "data", n_train=64, n_test=16)
    manifest_path = tmp_path / "data" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["scale"] = 1.0  # uint8 values 0..255 as they are
    manifest_path.write_text(json.dumps(manifest))
    config = dbn_config(tmp_path, tmp_path / "data")
    result = mpiexec(2, MPITRAIN, "train", config, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("pretrain.visible: bernoulli needs inputs in [0, 1]") == 1, result.stderr
    assert not (tmp_path / "run" / "pretrain").exists()


def test_shipped_dbn_config_and_pretrain_sync_defaults(tmp_path):
    config = load_config(os.path.join(REPO, "configs/fashion_dbn.yaml"))
    assert config.pretrain.layers == [500, 500, 2000] and config.model.layers == []
    assert (config.pretrain.sync.mode, config.pretrain.sync.frequency) == ("averaging", "epoch")
    path = tmp_path / "exp.yaml"
    path.write_text("data: {path: d, normalize: false}\npretrain: {layers: [8], sync: {average_updater: true}}\n")
    sync = load_config(str(path)).pretrain.sync  # keys left out keep the pretrain defaults
    assert (sync.mode, sync.frequency, sync.average_updater) == ("averaging", "epoch", True)


@pytest.mark.parametrize("text, message", [
    ("pretrain: {layers: [500, 0]}", r"pretrain.layers is \[500, 0\], expected a list of hidden-unit counts"),
    ("pretrain: {layers: [8], cd_k: 0}", r"pretrain.cd_k is 0, expected an integer in \[1, 1000\]"),
    ("pretrain: {layers: [8], cdk: 2}", r"unknown key 'pretrain.cdk'; did you mean 'pretrain.cd_k'\?"),
    ("pretrain: {layers: [8], visible: binary}", r"pretrain.visible is 'binary', expected one of"),
    ("pretrain: {layers: [8], propagate: sampled}", r"pretrain.propagate is 'sampled', expected one of"),
    ("pretrain: {layers: [8], momentum: 1.5}", r"pretrain.momentum is 1.5, expected a number in \[0, 1\)"),
    ("pretrain: {layers: [8], sync: {mode: ring}}", r"pretrain.sync.mode is 'ring', expected one of"),
    ("pretrain: {layers: [8], sync: {frequency: 0}}", r"pretrain.sync.frequency is 0"),
])
def test_bad_pretrain_config_names_the_key(tmp_path, text, message):
    path = tmp_path / "exp.yaml"
    path.write_text("data: {path: d, normalize: false}\n" + text + "\n")
    with pytest.raises(ConfigError, match=message):
        load_config(str(path))


def test_bernoulli_units_need_unnormalized_inputs(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("data: {path: d}\npretrain: {layers: [8]}\n")
    with pytest.raises(ConfigError, match=r"data.normalize is True, expected false with pretrain.visible: bernoulli"):
        load_config(str(path))
    path.write_text("data: {path: d}\npretrain: {layers: [8], visible: gaussian}\n")
    assert load_config(str(path)).pretrain.visible == "gaussian"


@pytest.mark.parametrize("layers, message", [
    ([{"type": "dense", "units": 8, "activation": "relu"}, {"type": "dense", "units": 3}],
     "its parameter layer 1 is a dense layer of 8 units followed by a relu layer"),
    ([{"type": "dense", "units": 9, "activation": "sigmoid"}, {"type": "dense", "units": 3}],
     "its parameter layer 1 is a dense layer of 9 units"),
    ([{"type": "dense", "units": 8, "activation": "sigmoid"}, {"type": "dense", "units": 4, "activation": "sigmoid"},
      {"type": "dense", "units": 3}], "its parameter layer 2 is a dense layer of 4 units"),
    ([{"type": "dense", "units": 8, "activation": "sigmoid"}, {"type": "dense", "units": 5, "activation": "sigmoid"}],
     "model.layers needs an output layer after these 2 layers"),
])
def test_model_layers_must_match_pretrain_layers(layers, message):
    model = build_model(ModelConfig(layers=layers), (1, 4, 4), layers[-1]["units"], np)
    with pytest.raises(ConfigError, match=message):
        _hidden_layers(model, [8, 5])


def test_derived_dbn_layers_are_what_pretraining_expects():
    model = build_model(ModelConfig(layers=dbn_layers([8, 5], 3)), (1, 4, 4), 3, np)
    assert [layer.params["W"].shape for layer in _hidden_layers(model, [8, 5])] == [(16, 8), (8, 5)]
    assert Config().pretrain.layers == []  # off unless asked for
