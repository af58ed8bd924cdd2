"""Frozen layers under real `mpiexec -n 2`, all runs in one job (ranks/train_each.py): a trained autoencoder's
encoder, frozen under a new classifier head (`model.init_from` plus `freeze: true`), keeps its values bit for bit in
every sync mode under AdamW's weight decay, resumes bit for bit, and sends no byte (the gradients and parameters the modes exchange are
the trainable part's); a deep belief net's first pretrained layer, frozen, keeps its RBM's weights while the one above fine-tunes; the fine-tuned model's
ONNX export equals `mpitrain predict`."""
import json

import h5py
import numpy as np
import onnxruntime as ort
import pytest

from mpitrain.nn.flat import flat_views
from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.testing.datasets import make_digits_dataset, read_split, write_config
from mpitrain.testing.launch import MPITRAIN, command, train_each

MODES = {"allreduce": {"mode": "allreduce"}, "averaging-3": {"mode": "averaging", "frequency": 3},
         "averaging-epoch": {"mode": "averaging", "frequency": "epoch", "average_updater": True},
         "sharing": {"mode": "sharing", "threshold": 1.0e-3}}
UNFROZEN = ("allreduce", "averaging-3")  # twins without freeze, to compare their traffic
ENCODER = {"type": "dense", "units": 16, "activation": "relu"}
TRAIN = {"epochs": 2, "batch_size": 16, "seed": 1, "log_every": 20}
ADAMW = {"type": "adamw", "lr": 0.01, "weight_decay": 0.1}  # decay moves any parameter the updater sees


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One job of 2 ranks: the autoencoder (64-16-64), then a classifier over its frozen encoder per sync mode, the
    unfrozen twins, sharing's run resumed for a third epoch beside one of 3 epochs straight, and a deep belief net with its first pretrained layer frozen. {name: run directory}."""
    folder = tmp_path_factory.mktemp("freeze")
    data = folder / "data"
    make_digits_dataset(data)
    configs = [write_config(folder / "source.yaml", data, run_dir=str(folder / "source"), train=TRAIN,
                            model={"target": "reconstruction", "loss": "mse",
                                   "layers": [ENCODER, {"type": "dense", "units": 64}]},
                            optimizer={"type": "adam", "lr": 0.01})]
    for name, sync in [*MODES.items(), *((f"{mode}-unfrozen", MODES[mode]) for mode in UNFROZEN)]:
        encoder = ENCODER if name.endswith("-unfrozen") else {**ENCODER, "freeze": True}
        configs.append(write_config(folder / f"{name}.yaml", data, run_dir=str(folder / name), train=TRAIN,
                                    sync=sync, optimizer=ADAMW,
                                    model={"layers": [encoder, {"type": "dense", "units": 10}],
                                           "init_from": str(folder / "source")}))
    straight = write_config(folder / "sharing-straight.yaml", data, run_dir=str(folder / "sharing-straight"),
                            train={**TRAIN, "epochs": 3}, sync=MODES["sharing"], optimizer=ADAMW,
                            model={"layers": [{**ENCODER, "freeze": True}, {"type": "dense", "units": 10}],
                                   "init_from": str(folder / "source")})
    # sharing's run once more, one epoch longer: it resumes each rank's own updater state and residual (sizes of the
    # trainable part) from its last checkpoint, and must end where a run of 3 epochs straight does
    configs += [str(folder / "sharing.yaml"), "--set", "train.epochs=3", straight]
    dbn = [{"type": "dense", "units": 32, "activation": "sigmoid", "freeze": True},
           {"type": "dense", "units": 16, "activation": "sigmoid"}, {"type": "dense", "units": 10}]
    configs.append(write_config(folder / "dbn.yaml", data, run_dir=str(folder / "dbn"), train={**TRAIN, "epochs": 4},
                                data={"normalize": False}, optimizer={"type": "sgd", "lr": 0.5, "momentum": 0.9,
                                                                      "l2": 1e-4},
                                model={"layers": dbn}, pretrain={"layers": [32, 16], "epochs": 4, "lr": 0.1,
                                                                 "momentum": 0.5, "monitor_rows": 50}))
    result = train_each(2, *configs)
    assert result.returncode == 0, result.stderr
    return {path.name: path for path in folder.iterdir() if path.is_dir() and path.name != "data"}


def arrays(path) -> dict:
    """{name: array} of a checkpoint file's parameters."""
    ckpt = load_checkpoint(str(path))
    return {name: view for (name, _), view in zip(ckpt.layout, flat_views(ckpt.params, ckpt.layout))}


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_frozen_encoder_keeps_the_autoencoders_values_in_every_mode(runs, mode):
    source = arrays(list_checkpoints(str(runs["source"]))[-1])
    checkpoints = list_checkpoints(str(runs[mode]))
    first, last = arrays(checkpoints[0]), arrays(checkpoints[-1])
    for name in ("00_dense/W", "00_dense/b"):
        np.testing.assert_array_equal(last[name], source[name])
        np.testing.assert_array_equal(first[name], source[name])
    assert not np.array_equal(first["02_dense/W"], last["02_dense/W"])  # the head trained
    s = summary(runs[mode])
    assert s["n_params"] - s["n_trainable"] == 64 * 16 + 16 and len(set(s["replica_hashes"])) == 1
    # 10 classes (chance 0.1): the frozen 16 codes of an autoencoder under a linear head; sharing's thresholded
    # steps of 170 parameters learn slower (0.55 here, the unfrozen twin 0.82: tests/mpi/test_mpi.py checks it)
    assert s["test_accuracy"] > (0.4 if mode == "sharing" else 0.6)


def test_frozen_parameters_send_no_byte(runs):
    frozen, unfrozen = summary(runs["allreduce"]), summary(runs["allreduce-unfrozen"])
    assert frozen["bytes_sent_per_step"] == frozen["n_trainable"] * 4 == (16 * 10 + 10) * 4
    assert unfrozen["bytes_sent_per_step"] == unfrozen["n_params"] * 4
    frozen, unfrozen = summary(runs["averaging-3"]), summary(runs["averaging-3-unfrozen"])  # the same averagings
    assert frozen["bytes_sent_per_step"] == pytest.approx(unfrozen["bytes_sent_per_step"] * frozen["n_trainable"]
                                                          / frozen["n_params"], rel=1e-12)
    epoch = summary(runs["averaging-epoch"])  # parameters and AdamW's two moments, once per epoch
    assert epoch["bytes_sent_per_step"] == pytest.approx(3 * epoch["n_trainable"] * 4 / epoch["steps_per_epoch"])
    sharing = summary(runs["sharing"])
    assert 0 < sharing["bytes_sent_per_step_max"] <= sharing["n_trainable"] * 4


def test_a_resumed_frozen_run_ends_where_a_straight_one_does(runs):
    resumed, straight = (arrays(list_checkpoints(str(runs[name]))[-1]) for name in ("sharing", "sharing-straight"))
    assert resumed.keys() == straight.keys()
    for name in resumed:
        np.testing.assert_array_equal(resumed[name], straight[name])
    assert summary(runs["sharing"])["epochs"] == 3


def test_a_deep_belief_nets_frozen_layer_keeps_the_pretrained_weights(runs):
    run_dir = runs["dbn"]
    last = arrays(list_checkpoints(str(run_dir))[-1])
    rbms = [arrays(run_dir / "pretrain" / f"layer-{index:02d}.h5") for index in (0, 1)]
    np.testing.assert_array_equal(last["00_dense/W"], rbms[0]["00_rbm/W"])
    np.testing.assert_array_equal(last["00_dense/b"], rbms[0]["00_rbm/c_hidden"])
    assert not np.array_equal(last["02_dense/W"], rbms[1]["01_rbm/W"])  # the layer above fine-tunes
    s = summary(run_dir)
    assert s["n_trainable"] == 32 * 16 + 16 + 16 * 10 + 10 and s["test_accuracy"] > 0.6  # chance is 0.1


def test_the_fine_tuned_models_onnx_export_equals_predict(runs, tmp_path):
    run_dir, out = runs["allreduce"], tmp_path / "tuned.onnx"
    for arguments in (["predict", run_dir, "--split", "test"], ["export", run_dir, "--out", out]):
        result = command(MPITRAIN, *arguments)
        assert result.returncode == 0, result.stdout + result.stderr
    with h5py.File(run_dir / "predictions-test.h5") as f:
        expected = f["probabilities"][...]
    x, _ = read_split(run_dir.parent / "data", "test")
    session = ort.InferenceSession(out.read_bytes(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=0, atol=1e-5)
