"""Targets beside class labels (issue 28): binary, multilabel and regression datasets train on 2 ranks with their
losses, evaluate with their metrics and pictures, predict probabilities or values, export to ONNX graphs that give
`mpitrain predict`'s outputs, and a loss that does not fit the target is one line before anything runs. The
regression target is in raw units (hundreds beside units): it trains standardized, and eval, predict and the export
give values in the target's own units."""
import json

import h5py
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from matplotlib.image import imread
from sklearn.metrics import r2_score

from mpitrain.testing.datasets import TARGET_NAMES, make_dataset, read_split, write_config
from mpitrain.testing.launch import MPITRAIN, command, mpiexec, train_each
from mpitrain.training.distributed_scores import HISTOGRAM_BINS
from mpitrain.training.scores import target_metrics

HIDDEN = {"type": "dense", "units": 16, "activation": "relu"}
CASES = {  # target: (loss, outputs, what the test split's metrics must reach, eval's picture, the graph's head)
    "binary": ("binary_cross_entropy", 1, lambda m: m["auc"] > 0.95 and m["accuracy"] > 0.85, "curves", ["Sigmoid"]),
    "multilabel": ("multilabel_cross_entropy", 2, lambda m: m["auc_macro"] > 0.95, "curves", ["Sigmoid"]),
    "regression": ("mse", 2, lambda m: m["r2"] > 0.8 and m["accuracy"] is None, "scatter", ["Gemm", "Mul", "Add"]),
}


@pytest.fixture(scope="module")
def every_target(tmp_path_factory) -> dict:
    """A model trained for each target kind on 2 ranks (4 epochs of 1200 rows), the three in turn in one job (as a
    Python script would: ranks/train_each.py); {target: folder}."""
    folders, configs = {}, []
    for target, (loss, outputs, *_) in sorted(CASES.items()):
        folders[target] = tmp_path_factory.mktemp(target)
        make_dataset(folders[target] / "data", n_train=1200, n_test=300, target=target)
        configs.append(write_config(folders[target] / "exp.yaml", folders[target] / "data",
                                    train={"epochs": 4, "batch_size": 16},
                                    model={"layers": [HIDDEN, {"type": "dense", "units": outputs}], "loss": loss},
                                    optimizer={"type": "adam", "lr": 0.01}))
    result = train_each(2, *configs)
    assert result.returncode == 0, result.stderr
    return folders


@pytest.fixture(scope="module", params=sorted(CASES))
def trained(request, every_target):
    """(target, the folder of its trained run)."""
    return request.param, every_target[request.param]


def test_a_target_trains_with_its_loss_and_evaluates_with_its_metrics_and_picture(trained):
    target, folder = trained
    run_dir = folder / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert CASES[target][2](summary["evaluation"]), summary["evaluation"]
    assert summary["evaluation"]["rows"] == 300 and len(set(summary["replica_hashes"])) == 1
    scored = mpiexec(2, MPITRAIN, "eval", run_dir, timeout=60)
    assert scored.returncode == 0, scored.stderr
    written = json.loads((run_dir / "eval-test.json").read_text())
    assert written["loss"] == pytest.approx(summary["evaluation"]["loss"], rel=1e-6)
    picture = run_dir / f"{CASES[target][3]}-test.png"
    assert f"wrote {run_dir / 'eval-test.json'} and {picture}" in scored.stdout
    assert imread(picture).ndim == 3 and not (run_dir / "confusion-test.png").exists()
    reported = command(MPITRAIN, "report", run_dir, timeout=60)  # the report's page shows eval's picture
    assert reported.returncode == 0, reported.stderr
    assert f"run (allreduce): {picture.stem}</h2>" in (run_dir / "report.html").read_text()


def test_predict_writes_probabilities_or_values_and_the_onnx_graph_gives_them(trained):
    target, folder = trained
    run_dir, dataset = folder / "run", folder / "data"
    result = mpiexec(2, MPITRAIN, "predict", run_dir, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"wrote {run_dir / 'predictions-test.h5'}: 300 rows of split 'test'" in result.stdout
    x, y = read_split(dataset, "test")
    width = len(TARGET_NAMES[target])
    with h5py.File(run_dir / "predictions-test.h5") as f:
        assert f.attrs["target"] == target and list(f.attrs["target_names"]) == TARGET_NAMES[target]
        assert sorted(f) == (["label", "predicted"] if target == "regression" else
                             ["label", "predicted", "probabilities"])
        labels, predicted = f["label"][...], f["predicted"][...]
        outputs = predicted if target == "regression" else f["probabilities"][...]
    assert outputs.dtype == np.float32 and outputs.shape == (300, width) and (labels == y).all()
    if target != "regression":
        assert predicted.dtype == np.int32 and (predicted == (outputs > 0.5)).all()
        assert ((0 <= outputs) & (outputs <= 1)).all()
    written = json.loads((run_dir / "eval-test.json").read_text())  # the test above ran eval first
    for key, value in target_metrics(target, labels, outputs).items():  # eval clips log_loss at float64's eps
        assert written[key] == pytest.approx(value, rel=1e-5), key
    if target == "regression":  # in the target's own units: scikit-learn's R² of predict's values is eval's
        assert written["r2"] == pytest.approx(r2_score(labels, outputs), rel=1e-5)
        assert (np.abs(outputs.mean(axis=0) - y.mean(axis=0)) < 0.2 * y.std(axis=0)).all()  # each column's scale

    out = folder / "model.onnx"
    exported = command(MPITRAIN, "export", run_dir, "--out", out)
    assert exported.returncode == 0, exported.stderr
    name = "values" if target == "regression" else "probabilities"
    assert f"-> {name} float32[N, {width}]" in exported.stdout
    proto = onnx.load(str(out))
    head = CASES[target][4] + ["Identity"]  # regression: the values times the target's std plus its mean
    assert [n.op_type for n in proto.graph.node][-len(head):] == head
    assert json.loads({p.key: p.value for p in proto.metadata_props}["manifest"])["target"] == target
    session = ort.InferenceSession(out.read_bytes(), providers=["CPUExecutionProvider"])
    got = session.run([name], {"x": x})[0]
    assert got.dtype == np.float32 and got.shape == outputs.shape
    np.testing.assert_allclose(got, outputs, rtol=1e-6, atol=1e-5)


def test_eval_above_its_exact_limit_scores_in_the_histogram_mode_and_says_so(trained):
    """`mpitrain eval --max-exact-rows` below the split's rows: AUC and average precision from histograms, the mode in
    eval-SPLIT.json and the output, every other figure the exact eval's, the picture drawn as before."""
    target, folder = trained
    run_dir = folder / "run"
    written = {}
    for limit in ([], ["--max-exact-rows", "0"]):
        result = mpiexec(2, MPITRAIN, "eval", run_dir, "--split", "train", *limit, timeout=60)
        assert result.returncode == 0, result.stderr
        written[bool(limit)] = json.loads((run_dir / "eval-train.json").read_text())
        assert imread(run_dir / f"{CASES[target][3]}-train.png").ndim == 3
    exact, histogram = written[False], written[True]
    ranked = {"auc", "auc_macro", "average_precision", "average_precision_macro", "auc_mode", "auc_bins",
              "auc_error_bound"}
    for key in (set(exact) | set(histogram)) - ranked:
        if isinstance(exact[key], str):
            assert histogram[key] == exact[key], key
        else:
            np.testing.assert_allclose(np.array(histogram[key], float), np.array(exact[key], float), rtol=1e-12,
                                       atol=1e-12, err_msg=key)
    if target == "regression":  # every figure a sum: nothing to approximate
        assert not ranked & set(histogram)
        return
    assert exact["auc_mode"] == "exact" and histogram["auc_mode"] == "histogram"
    assert f"AUC and average precision from histograms of {HISTOGRAM_BINS} bins: AUC within" in result.stdout
    error = np.abs(np.array(histogram["auc"], float) - np.array(exact["auc"], float))
    assert (error <= np.array(histogram["auc_error_bound"], float)).all()


def test_a_loss_that_does_not_fit_the_target_is_one_line_before_anything_is_written(tmp_path):
    make_dataset(tmp_path / "data", n_train=200, target="regression")
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data",
                          model={"layers": [HIDDEN, {"type": "dense", "units": 2}]})  # softmax_cross_entropy
    result = mpiexec(2, MPITRAIN, "train", config, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("model.loss is softmax_cross_entropy, but the dataset's target is regression") == 1
    assert not (tmp_path / "run").exists()
