"""ONNX export: onnxruntime on the exported graph gives `mpitrain predict`'s probabilities on the real test rows."""
from __future__ import annotations

import h5py
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mpitrain.base.errors import ConfigError, DataError, MpitrainError
from mpitrain.data.reader import input_scaling
from mpitrain.data.shards import Manifest, sha256_file
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import AvgPool2D, Conv2D, MaxPool2D
from mpitrain.nn.layers import Dense, Dropout, Flatten, Layer, ReLU
from mpitrain.nn.losses import sigmoid, softmax
from mpitrain.nn.model import Sequential
from mpitrain.rundir.export import export_onnx, onnx_model
from mpitrain.testing.datasets import make_dataset, make_digits_dataset, read_split, write_config
from mpitrain.testing.launch import MPITRAIN, command, mpiexec

LENET = [{"type": "conv2d", "filters": 6, "kernel": 3, "padding": "same", "activation": "relu"},
         {"type": "maxpool2d", "pool": 2},
         {"type": "conv2d", "filters": 8, "kernel": 3, "activation": "tanh"},
         {"type": "flatten"},
         {"type": "dense", "units": 16, "activation": "relu"},
         {"type": "dense", "units": 10}]
# stride-2 "same" convs (odd and even kernels), avg pooling with padding, batch norm on images and on dense rows
BN_CNN = [{"type": "conv2d", "filters": 8, "kernel": 3, "stride": 2, "padding": "same"},
          {"type": "batchnorm"}, {"type": "relu"},
          {"type": "avgpool2d", "pool": 3, "stride": 1, "padding": "same"},
          {"type": "conv2d", "filters": 6, "kernel": 2, "stride": 2, "padding": "same", "activation": "relu"},
          {"type": "maxpool2d", "pool": 2, "padding": "same"},
          {"type": "dropout", "rate": 0.2},
          {"type": "flatten"},
          {"type": "dense", "units": 16},
          {"type": "batchnorm"}, {"type": "relu"},
          {"type": "dropout", "rate": 0.3},
          {"type": "dense", "units": 10}]
MODELS = {
    "mlp": ("synthetic", 2, {"model": {"layers": [{"type": "dense", "units": 16, "activation": "relu"},
                                                  {"type": "dense", "units": 3}]}}),
    "lenet": ("digits", 2, {"model": {"layers": LENET}}),
    "bn_cnn": ("digits", 1, {"model": {"layers": BN_CNN}}),
    # a deep belief net: RBM pretraining of sigmoid dense layers, then fine-tuning; inputs in [0, 1]
    "dbn": ("digits", 2, {"model": {"layers": []}, "data": {"normalize": False},
                          "pretrain": {"layers": [24, 12], "epochs": 1, "monitor_rows": 50}}),
}


def trained_run(tmp_path, name):
    """Train model `name` for a few steps on its small dataset and write its test predictions."""
    data, ranks, sections = MODELS[name]
    dataset = tmp_path / "data"
    (make_dataset if data == "synthetic" else make_digits_dataset)(dataset)
    config = write_config(tmp_path / "config.yaml", dataset, train={"epochs": 1, "batch_size": 32}, **sections)
    result = mpiexec(ranks, MPITRAIN, "train", config, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "run"
    result = command(MPITRAIN, "predict", run_dir, "--split", "test")
    assert result.returncode == 0, result.stdout + result.stderr
    return dataset, run_dir


@pytest.mark.parametrize("name", list(MODELS))
def test_onnxruntime_gives_mpitrain_predict_probabilities(tmp_path, name):
    dataset, run_dir = trained_run(tmp_path, name)
    out = tmp_path / "model.onnx"
    result = command(MPITRAIN, "export", run_dir, "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"wrote {out}:" in result.stdout and "rows uint8[N, " in result.stdout

    proto = onnx.load(str(out))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version == 17
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    assert [n.op_type for n in proto.graph.node[:3]] == ["Cast", "Mul", "Add"]
    props = {p.key: p.value for p in proto.metadata_props}
    with h5py.File(run_dir / "predictions-test.h5") as f:
        expected, predicted, checkpoint = f["probabilities"][...], f["predicted"][...], f.attrs["checkpoint"]
    assert props["run_dir"] == str(run_dir) and props["checkpoint"] == checkpoint
    assert props["manifest_sha256"] == sha256_file(str(dataset / "manifest.json"))

    x, _ = read_split(dataset, "test")
    session = ort.InferenceSession(out.read_bytes(), providers=["CPUExecutionProvider"])
    probabilities = session.run(None, {"x": x})[0]
    assert probabilities.dtype == np.float32 and probabilities.shape == expected.shape
    np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-5)
    top2 = np.sort(expected, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2e-5  # a near-tie may flip within 1e-5
    assert clear.mean() > 0.5 and (probabilities.argmax(axis=1) == predicted)[clear].all()
    if name == "dbn":
        assert [n.op_type for n in proto.graph.node].count("Sigmoid") == 2


def _random_model(layers, shape, dtype="float32", loss="softmax_cross_entropy"):
    model = Sequential(layers, shape, dtype=dtype, loss=loss)
    model.init_params(0, "xavier")
    rng = np.random.default_rng(1)
    model.params[...] += rng.normal(0, 0.1, model.params.size).astype(dtype)
    model.stats[...] = rng.uniform(0.5, 1.5, model.stats.size).astype(dtype)  # running statistics that matter
    return model


def _manifest(shape, dtype="uint8", num_classes=4, **target):
    return Manifest(feature_shape=shape, feature_dtype=dtype, scale=1 / 255, offset=0.1, mean=0.4, std=0.3,
                    num_classes=num_classes, label_counts={}, splits={}, **target)


@pytest.mark.parametrize("size", [5, 6, 7, 8, 9])
@pytest.mark.parametrize("kernel,stride", [(1, 2), (2, 1), (2, 2), (3, 2), (4, 2), (4, 3), (5, 3)])
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_window_geometry_matches_im2col(size, kernel, stride, padding):
    """Conv and both poolings, odd and even kernels and strides: the graph's pads reproduce kernels/im2col.py."""
    if padding == "valid" and kernel > size:
        return
    shape = (2, size, size + 1)
    model = _random_model([Conv2D(3, kernel, stride=stride, padding=padding),
                           AvgPool2D(kernel, stride=stride, padding="same"),
                           MaxPool2D([kernel, 1], stride=stride, padding="same"), Flatten(), Dense(4)], shape)
    manifest = _manifest(shape)
    rows = np.random.default_rng(2).integers(0, 256, (5, *shape)).astype(np.uint8)
    scale, shift = input_scaling(manifest, True)
    expected = softmax(model.forward((rows * np.float32(scale) + np.float32(shift)).astype(np.float32), False))
    session = ort.InferenceSession(onnx_model(model, manifest).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": rows})[0], expected, rtol=0, atol=1e-6)


def test_float64_model_and_float32_rows_without_normalizing(tmp_path):
    shape = (6,)
    model = _random_model([Dense(5), BatchNorm(), ReLU(), Dropout(0.5), Dense(3)], shape, dtype="float64")
    manifest = _manifest(shape, "float32", 3)
    rows = np.random.default_rng(3).normal(0, 50, (8, 6)).astype(np.float32)
    proto = export_onnx(model, manifest, str(tmp_path / "m.onnx"), normalize=False, metadata={"note": "x"})
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": rows})[0]
    expected = softmax(model.forward(rows.astype(np.float64) / 255 + 0.1, False))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert {p.key: p.value for p in proto.metadata_props}["note"] == "x"
    before = (tmp_path / "m.onnx").read_bytes()
    with pytest.raises(MpitrainError, match=f"{tmp_path / 'm.onnx'}: exists; pass --overwrite to replace it"):
        export_onnx(model, manifest, str(tmp_path / "m.onnx"), normalize=True)
    assert (tmp_path / "m.onnx").read_bytes() == before
    export_onnx(model, manifest, str(tmp_path / "m.onnx"), normalize=True, overwrite=True)
    assert (tmp_path / "m.onnx").read_bytes() != before


@pytest.mark.parametrize("target, loss, names, head, output", [
    ("binary", "binary_cross_entropy", ["clicked"], sigmoid, "probabilities"),
    ("multilabel", "multilabel_cross_entropy", ["a", "b", "c"], sigmoid, "probabilities"),
    ("regression", "huber", ["price", "volume"], lambda values: values, "values"),
])
def test_other_targets_end_in_a_sigmoid_or_the_values(target, loss, names, head, output):
    """Binary and multilabel graphs give sigmoid probabilities, regression graphs the values; a loss that does not
    fit the target is refused."""
    shape = (2, 3, 3)
    model = _random_model([Conv2D(2, 2), ReLU(), Flatten(), Dense(5), BatchNorm(), Dense(len(names))], shape,
                          loss=loss)
    manifest = _manifest(shape, target=target, target_names=names)
    rows = np.random.default_rng(4).integers(0, 256, (7, *shape)).astype(np.uint8)
    scale, shift = input_scaling(manifest, True)
    expected = head(model.forward((rows * np.float32(scale) + np.float32(shift)).astype(np.float32), False))
    proto = onnx_model(model, manifest)
    assert [o.name for o in proto.graph.output] == [output]
    assert [d.dim_value for d in proto.graph.output[0].type.tensor_type.shape.dim[1:]] == [len(names)]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": rows})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match=f"ONNX export: model.loss is softmax_cross_entropy, but the dataset's "
                                          f"target is {target}"):
        onnx_model(_random_model([Flatten(), Dense(len(names))], shape), manifest)


def test_a_layer_onnx_cannot_express_is_named():
    class Swish(Layer):
        def forward(self, x, training):
            return x / (1 + np.exp(-x))

    model = _random_model([Dense(4), Swish(), Dense(2)], (3,))
    with pytest.raises(MpitrainError, match="layer 1 of the model is a Swish, which has no ONNX export; "
                                            r"exportable layers are \['Attention', 'AvgPool2D', 'BatchNorm'"):
        onnx_model(model, _manifest((3,), num_classes=2))


def test_export_refuses_a_dataset_replaced_since_training_and_a_run_without_checkpoints(tmp_path):
    dataset, run_dir = tmp_path / "data", tmp_path / "run"
    make_dataset(dataset, n_train=64, n_test=16)
    config = write_config(tmp_path / "config.yaml", dataset, train={"epochs": 1, "batch_size": 32})
    assert command(MPITRAIN, "train", config).returncode == 0
    make_dataset(dataset, n_train=64, n_test=16, seed=5)  # new rows, a new manifest.json
    result = command(MPITRAIN, "export", run_dir, "--out", tmp_path / "m.onnx")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("mpitrain export: error: ") and "trained on a dataset whose manifest.json had sha256" in result.stderr
    assert not (tmp_path / "m.onnx").exists()
    for path in (run_dir / "checkpoints").iterdir():
        path.unlink()
    with pytest.raises(DataError, match="no checkpoint; train the run first"):
        from mpitrain.rundir.export import export_run
        export_run(str(run_dir))
