"""Autoencoders and residual nets (issue 32, items 3 and 4) through the command line on 2 ranks.

configs/digits_autoencoder.yaml's model on scikit-learn's digits (data.normalize on, the default): its test MSE, in
the data's units as stored (pixels / 16), well under the mean predictor's,
`predict --embeddings code` gives the code of every row as a forward pass to that node does, the ONNX graph gives
`predict`'s reconstructions, and configs that cannot reconstruct are one line and exit 2 on every rank.
configs/fashion_resnet.yaml's graph (conv stem, residual blocks with batch norm, global pooling) trains on image rows
and exports to an ONNX graph that gives `predict`'s probabilities."""
import json
import os

import h5py
import numpy as np
import onnxruntime as ort
import pytest
import yaml

from mpitrain.config.sections import load_config
from mpitrain.data.shards import read_manifest
from mpitrain.nn.graph import build_network
from mpitrain.rundir.checkpoint import load_checkpoint
from mpitrain.testing.datasets import make_dataset, make_digits_dataset, read_split, write_config
from mpitrain.testing.launch import MPITRAIN, REPO, command, mpiexec


def shipped(name: str) -> dict:
    """A config of configs/, its model's `layers` set (empty beside a graph), so `write_config` keeps its model."""
    with open(os.path.join(REPO, "configs", name)) as f:
        config = yaml.safe_load(f)
    config["model"] = {"layers": [], **config["model"]}
    return config


def onnx_outputs(tmp_path, run_dir, x, name: str) -> np.ndarray:
    out = tmp_path / "model.onnx"
    exported = command(MPITRAIN, "export", run_dir, "--out", out)
    assert exported.returncode == 0, exported.stderr
    session = ort.InferenceSession(out.read_bytes(), providers=["CPUExecutionProvider"])
    return session.run([name], {"x": x})[0]


@pytest.fixture(scope="module")
def autoencoder(tmp_path_factory):
    """configs/digits_autoencoder.yaml's model trained on 2 ranks for 20 epochs; the folder."""
    folder = tmp_path_factory.mktemp("autoencoder")
    make_digits_dataset(folder / "data")
    config = shipped("digits_autoencoder.yaml")
    path = write_config(folder / "exp.yaml", folder / "data", model=config["model"], optimizer=config["optimizer"],
                        train={"epochs": 20, "batch_size": 16, "log_every": 1000})
    result = mpiexec(2, MPITRAIN, "train", path, timeout=300)
    assert result.returncode == 0, result.stderr
    return folder


def test_an_autoencoder_reconstructs_far_better_than_the_mean(autoencoder):
    scored = mpiexec(2, MPITRAIN, "eval", autoencoder / "run", timeout=120)
    assert scored.returncode == 0, scored.stderr
    assert (autoencoder / "run" / "scatter-test.png").exists()
    written = json.loads((autoencoder / "run" / "eval-test.json").read_text())
    train, test = (read_split(autoencoder / "data", split)[0].reshape(-1, 64) / 16 for split in ("train", "test"))
    mean_predictor = float(((test - train.mean(axis=0)) ** 2).mean())
    assert written["rows"] == len(test) and written["accuracy"] is None
    assert written["mse"] < 0.4 * mean_predictor, (written["mse"], mean_predictor)
    std = read_manifest(str(autoencoder / "data")).std  # the loss: the MSE of the standardized pixels it trains on
    assert written["loss"] == pytest.approx(written["mse"] / std ** 2, rel=1e-5)
    summary = json.loads((autoencoder / "run" / "summary.json").read_text())
    assert summary["evaluation"]["mse"] == pytest.approx(written["mse"], rel=1e-6)


def test_predict_writes_reconstructions_and_the_embeddings_of_a_node(autoencoder, tmp_path):
    run_dir, (x, y) = autoencoder / "run", read_split(autoencoder / "data", "test")
    for args in ([], ["--embeddings", "code"]):
        result = mpiexec(2, MPITRAIN, "predict", run_dir, *args, timeout=120)
        assert result.returncode == 0, result.stderr
    with h5py.File(run_dir / "predictions-test.h5") as f:
        assert sorted(f) == ["label", "predicted"] and f.attrs["target"] == "reconstruction"
        reconstruction, label = f["predicted"][...], f["label"][...]
    np.testing.assert_allclose(label, x.reshape(len(x), 64) / 16, rtol=1e-6, atol=1e-6)  # the input as stored
    with h5py.File(run_dir / "embeddings-test.h5") as f:
        assert f.attrs["node"] == "code"
        codes, labels = f["embeddings"][...], f["label"][...]
    assert codes.shape == (len(x), 10) and codes.dtype == np.float32 and (labels == y).all()
    config = load_config(str(run_dir / "config.yaml"))
    model = build_network(config.model, read_manifest(str(autoencoder / "data")), np)
    checkpoint = load_checkpoint(str(sorted((run_dir / "checkpoints").glob("ckpt-*.h5"))[-1]), rank_arrays=False)
    model.params[...], model.stats[...] = checkpoint.params, checkpoint.stats
    manifest = read_manifest(str(autoencoder / "data"))
    inputs = ((x / 16 - manifest.mean) / manifest.std).astype(np.float32)  # data.normalize
    np.testing.assert_allclose(codes, model.forward(inputs, until="code"), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reconstruction, model.forward(inputs) * manifest.std + manifest.mean, rtol=1e-5,
                               atol=1e-6)  # in the data's units
    np.testing.assert_allclose(onnx_outputs(tmp_path, run_dir, x, "reconstruction"), reconstruction, atol=1e-5)
    wrong = mpiexec(2, MPITRAIN, "predict", run_dir, "--embeddings", "hidden", timeout=120)
    assert wrong.returncode == 2 and wrong.stderr.count("--embeddings 'hidden': the model (model.graph) has no such "
                                                        "node; expected one of ['pixels', 'encoder', 'code'") == 1


@pytest.mark.parametrize("change, message", [
    ({"loss": "softmax_cross_entropy"}, "model.loss is softmax_cross_entropy, but model.target is reconstruction (the "
                                        "input is the target); expected mse or binary_cross_entropy"),
    ({"graph": [{"name": "pixels", "type": "flatten", "input": "numeric"},
                {"name": "out", "type": "dense", "input": "pixels", "units": 10}]},
     "model.graph: the last node 'out' gives outputs of shape [10], expected [64] for the dataset's 64 input "
     "features (model.target: reconstruction)"),
])
def test_a_config_that_cannot_reconstruct_is_one_line_and_exit_2_on_every_rank(tmp_path, change, message):
    make_digits_dataset(tmp_path / "data")
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data",
                          model={**shipped("digits_autoencoder.yaml")["model"], **change})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=60)
    assert result.returncode == 2 and result.stderr.count(message) == 1, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run" / "checkpoints").exists()


def test_the_residual_net_trains_on_image_rows_and_its_onnx_graph_gives_predict_s_probabilities(tmp_path):
    make_dataset(tmp_path / "data", n_train=320, n_test=32, shards=2, num_classes=10, shape=(1, 28, 28))
    config = shipped("fashion_resnet.yaml")
    path = write_config(tmp_path / "exp.yaml", tmp_path / "data", model=config["model"], optimizer=config["optimizer"],
                        train={"epochs": 4, "batch_size": 16, "log_every": 1000})
    result = mpiexec(2, MPITRAIN, "train", path, timeout=600)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "run"
    with open(run_dir / "metrics.jsonl") as f:
        losses = [r["train_loss"] for r in map(json.loads, f) if r["kind"] == "epoch"]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
    predicted = mpiexec(2, MPITRAIN, "predict", run_dir, timeout=120)
    assert predicted.returncode == 0, predicted.stderr
    with h5py.File(run_dir / "predictions-test.h5") as f:
        probabilities = f["probabilities"][...]
    x, _ = read_split(tmp_path / "data", "test")
    np.testing.assert_allclose(onnx_outputs(tmp_path, run_dir, x, "probabilities"), probabilities, atol=1e-5)
