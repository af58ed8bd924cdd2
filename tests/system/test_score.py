"""Spark batch scoring (etl/score.py, `mpitrain score`): its predictions are `mpitrain predict`'s (real Spark, local[2])."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.shards import Manifest, read_manifest, shard_path, write_manifest, write_shard
from mpitrain.etl.cli import main_score
from mpitrain.etl.idx import IMAGES_MAGIC, LABELS_MAGIC, find_splits, read_records
from mpitrain.etl.scoring import plan_scoring, score
from mpitrain.etl.sources import SourceOptions
from mpitrain.testing import launch
from mpitrain.testing.datasets import make_digits_dataset, siblings, write_config, write_idx
from mpitrain.testing.launch import FASHION, MPITRAIN, command, mpiexec, require_fashion_mnist

REPO = Path(launch.REPO)
SUBSET = {"train": 1200, "test": 300}  # real Fashion-MNIST rows
PREFIX = {"train": "train", "test": "t10k"}


def predictions(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    with h5py.File(run_dir / "predictions-test.h5") as f:
        return f["probabilities"][...], f["predicted"][...]


def read_output(out: Path, key: str) -> dict[str, np.ndarray]:
    """The output's columns sorted by `key`."""
    table = pq.read_table(str(out))  # skips _metrics.json and _SUCCESS, as Spark does
    order = np.argsort(table.column(key).to_numpy())
    columns = {name: table.column(name).to_numpy(zero_copy_only=False)[order] for name in table.column_names}
    columns["probabilities"] = np.stack(columns["probabilities"]).astype(np.float32)
    return columns


def train_and_predict(dataset: Path, tmp_path: Path, layers: list, ranks: int) -> Path:
    config = write_config(tmp_path / "config.yaml", dataset, model={"layers": layers},
                          train={"epochs": 1, "batch_size": 32})
    result = mpiexec(ranks, MPITRAIN, "train", config, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    result = command(MPITRAIN, "predict", tmp_path / "run", "--split", "test")
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "run"


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """An MLP trained on digits; the dataset's test rows are records order[:n_test] of scikit-learn's digits."""
    folder = tmp_path_factory.mktemp("digits")
    make_digits_dataset(folder / "data")
    run_dir = train_and_predict(folder / "data", folder, [{"type": "dense", "units": 32, "activation": "relu"},
                                                          {"type": "dense", "units": 10}], ranks=1)
    order = np.random.default_rng(0).permutation(1797)[:359]
    return run_dir, order


def digits_rows():
    from sklearn.datasets import load_digits
    digits = load_digits()
    return digits.images.reshape(-1, 64).astype(np.uint8), digits.target


def test_run_dir_on_the_digits_source_gives_predict_probabilities_and_replaces_only_when_asked(spark, digits_run,
                                                                                             tmp_path):
    run_dir, order = digits_run
    out = tmp_path / "p.parquet"
    metrics = score(spark, plan_scoring(str(run_dir), "digits:", str(out)))
    got = read_output(out, "row")
    assert list(got) == ["row", "predicted", "probabilities", "label"] and len(got["row"]) == 1797
    assert got["predicted"].dtype == np.int32 and (got["row"] == np.arange(1797)).all()
    expected, predicted = predictions(run_dir)
    np.testing.assert_allclose(got["probabilities"][order], expected, rtol=0, atol=1e-5)
    assert (got["predicted"] == got["probabilities"].argmax(axis=1)).all()
    assert (got["label"] == digits_rows()[1]).all()
    written = json.loads((out / "_metrics.json").read_text())
    assert written == json.loads(json.dumps(metrics))
    assert (written["records"], written["bad_records"], written["rows"], written["split"]) == (1797, 0, 1797, "train")
    assert written["accuracy"] == pytest.approx((got["predicted"] == got["label"]).mean())
    assert np.array(written["confusion"]).sum() == 1797 and written["checkpoint"].startswith(str(run_dir))

    # an existing output is refused before Spark starts, replaced with --overwrite, and never a foreign folder
    args = ["--model", str(run_dir), "--source", "digits:", "--out", str(out), "--master", "local[1]"]
    assert main_score(args) == 2
    with pytest.raises(DataError, match=f"{out}: exists; pass --overwrite to replace it"):
        plan_scoring(str(run_dir), "digits:", str(out))
    before = sorted(os.listdir(out))
    score(spark, plan_scoring(str(run_dir), "digits:", str(out), overwrite=True))
    assert sorted(os.listdir(out)) != before and siblings(out) == ["p.parquet"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match="is not a predictions folder \\(no _metrics.json\\); refusing to replace it"):
        plan_scoring(str(run_dir), "digits:", str(tmp_path / "notes"), overwrite=True)


def test_a_run_dir_scores_with_its_checkpoints_own_config_not_an_edited_config_yaml(spark, digits_run, tmp_path):
    run_dir, order = digits_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    config = copy / "config.yaml"  # edited after training: the checkpoint was trained on normalized inputs
    assert "normalize: true" in config.read_text()
    config.write_text(config.read_text().replace("normalize: true", "normalize: false")
                      .replace(str(run_dir), str(copy)))
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in copy.rglob("*") if p.is_file()}
    out = tmp_path / "p.parquet"
    score(spark, plan_scoring(str(copy), "digits:", str(out)))
    expected, _ = predictions(run_dir)  # `mpitrain predict` before config.yaml was edited
    np.testing.assert_allclose(read_output(out, "row")["probabilities"][order], expected, rtol=0, atol=1e-5)
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in copy.rglob("*") if p.is_file()} == before


def write_csv(path: Path, lines: list[str]) -> None:
    path.write_text("label," + ",".join(f"p{i}" for i in range(64)) + "\n" + "\n".join(lines) + "\n")


def test_csv_bad_records_are_counted_then_fail_or_are_dropped_as_in_the_etl(spark, digits_run, tmp_path, caplog):
    run_dir, order = digits_run
    x, y = digits_rows()
    good = [",".join(map(str, [y[i], *x[i]])) for i in order[:40]]
    bad = ["3,1,2",  # too few fields
           ",".join(["12", *map(str, x[0])]),  # not a class of the model
           ",".join(["4", "3.5", *map(str, x[0][1:])])]  # not a stored uint8 value
    lines = good[:10] + bad[:1] + good[10:20] + bad[1:] + good[20:]
    write_csv(tmp_path / "rows.csv", lines)
    out = tmp_path / "p.parquet"
    with pytest.raises(DataError) as failed:
        score(spark, plan_scoring(str(run_dir), f"csv:{tmp_path / 'rows.csv'}", str(out)))
    assert str(failed.value).startswith(f"csv:{tmp_path / 'rows.csv'}: 3 of 43 records are bad, more than "
                                        "--max-bad-fraction 0 allows; the first: ")
    assert "malformed line '3,1,2', expected 65 numbers" in str(failed.value)
    assert siblings(out) == []  # nothing written, no temporary folder left

    with caplog.at_level(logging.WARNING, logger="mpitrain.etl.job"):
        metrics = score(spark, plan_scoring(str(run_dir), f"csv:{tmp_path / 'rows.csv'}", str(out),
                                            max_bad_fraction=0.1))
    assert (metrics["records"], metrics["bad_records"], metrics["rows"]) == (43, 3, 40)
    assert "label 12.0 at record '12,0,0,5,13,...', expected 0..9" in caplog.text
    got = read_output(out, "row")
    # one partition: `row` numbers the file's lines (the header is line 0), bad ones left out
    assert list(got["row"]) == [*range(1, 11), *range(12, 22), *range(24, 44)]
    expected, _ = predictions(run_dir)
    np.testing.assert_allclose(got["probabilities"], expected[:40], rtol=0, atol=1e-5)


def test_unlabeled_parquet_with_key_columns(spark, digits_run, tmp_path):
    run_dir, order = digits_run
    x, _ = digits_rows()
    ids = [f"img-{i:04d}" for i in order[:30]]
    pixels = [list(map(int, x[i])) for i in order[:30]]
    pixels[7] = pixels[7][:50]  # an array of the wrong length: a bad record
    pq.write_table(pa.table({"id": ids, "pixels": pixels}), str(tmp_path / "rows.parquet"))
    out = tmp_path / "p.parquet"
    options = SourceOptions(labeled=False, keys=("id",))
    metrics = score(spark, plan_scoring(str(run_dir), f"parquet:{tmp_path / 'rows.parquet'}", str(out),
                                        max_bad_fraction=0.05, options=options))
    assert (metrics["rows"], metrics["bad_records"]) == (29, 1) and "accuracy" not in metrics
    got = read_output(out, "id")
    assert list(got) == ["id", "predicted", "probabilities"]
    keep = [i for i in range(30) if i != 7]
    assert list(got["id"]) == sorted(ids[i] for i in keep)
    by_id = dict(zip(got["id"], got["probabilities"]))
    expected, _ = predictions(run_dir)
    np.testing.assert_allclose([by_id[ids[i]] for i in keep], expected[keep], rtol=0, atol=1e-5)


def test_requests_the_model_cannot_serve_fail_before_spark(digits_run, tmp_path):
    run_dir, _ = digits_run
    with pytest.raises(ConfigError, match=r"idx:.*: rows of shape \[1, 28, 28\], but the model takes \[1, 8, 8\]"):
        fashion = tmp_path / "idx"
        fashion_subset(fashion, {"train": 10, "test": 10})
        plan_scoring(str(run_dir), f"idx:{fashion}", str(tmp_path / "p"))
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(DataError, match="--model .*junk.onnx: not a valid ONNX model"):
        plan_scoring(str(tmp_path / "junk.onnx"), "digits:", str(tmp_path / "p"))
    result = command(MPITRAIN, "score", "--model", tmp_path / "junk.onnx", "--source", "digits:", "--out",
                     tmp_path / "p")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"mpitrain score: error: --model {tmp_path / 'junk.onnx'}: not a valid ONNX")
    with pytest.raises(ConfigError, match="--no-label: only csv, parquet and images sources may lack labels"):
        plan_scoring(str(run_dir), "digits:", str(tmp_path / "p"), options=SourceOptions(labeled=False))
    assert not (tmp_path / "p").exists()


def fashion_subset(folder: Path, rows: dict[str, int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The first rows of each real Fashion-MNIST split, as IDX files of their own; returns them."""
    require_fashion_mnist()
    folder.mkdir()
    data = {}
    for split, (images, labels) in find_splits(FASHION).items():
        x, y = read_records(images, 0, rows[split]), read_records(labels, 0, rows[split])
        write_idx(folder / f"{PREFIX[split]}-images-idx3-ubyte.gz", x, IMAGES_MAGIC)
        write_idx(folder / f"{PREFIX[split]}-labels-idx1-ubyte", y, LABELS_MAGIC)
        data[split] = (x, y)
    return data


def test_spark_submit_scores_real_fashion_mnist_like_mpitrain_predict(tmp_path):
    """A conv net trained on 2 ranks, exported; `spark-submit etl/score.py` on the IDX test records, which the
    dataset holds in record order, so record i is predict's row i."""
    data = fashion_subset(tmp_path / "idx", SUBSET)
    dataset = tmp_path / "data"
    splits = {split: [write_shard(str(dataset), shard_path(split, 0), x.reshape(-1, 1, 28, 28), y.astype(np.int32))]
              for split, (x, y) in data.items()}
    write_manifest(str(dataset), Manifest(
        feature_shape=(1, 28, 28), feature_dtype="uint8", scale=1 / 255, offset=0.0,
        mean=float(data["train"][0].mean() / 255), std=float(data["train"][0].std() / 255), num_classes=10,
        label_counts={s: np.bincount(y, minlength=10).tolist() for s, (_, y) in data.items()}, splits=splits,
        source=f"idx:{tmp_path / 'idx'}"))
    run_dir = train_and_predict(dataset, tmp_path, [
        {"type": "conv2d", "filters": 6, "kernel": 5, "stride": 2, "padding": "same", "activation": "relu"},
        {"type": "maxpool2d", "pool": 2}, {"type": "flatten"}, {"type": "dense", "units": 10}], ranks=2)
    assert command(MPITRAIN, "export", run_dir, "--out", tmp_path / "model.onnx").returncode == 0

    out = tmp_path / "predictions.parquet"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run([str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
                           "--conf", "spark.ui.enabled=false", str(REPO / "etl" / "score.py"),
                           "--model", str(tmp_path / "model.onnx"), "--source", f"idx:{tmp_path / 'idx'}",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {out}: 300 rows of idx:{tmp_path / 'idx'} split 'test' scored" in done.stdout
    got = read_output(out, "row")
    expected, predicted = predictions(run_dir)
    assert (got["row"] == np.arange(300)).all() and (got["label"] == data["test"][1]).all()
    np.testing.assert_allclose(got["probabilities"], expected, rtol=0, atol=1e-5)
    metrics = json.loads((out / "_metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx((predicted == data["test"][1]).mean(), abs=2 / 300)
    assert metrics["accuracy"] > 0.5  # chance is 0.1
    assert f"accuracy {metrics['accuracy']:.4f}" in done.stdout and "confusion matrix" in done.stdout


TABLE_TARGETS = {  # target: (loss, target names, source kind, --label)
    "multilabel": ("multilabel_cross_entropy", ["a", "b"], "parquet", "b,a"),  # columns in another order
    "regression": ("mse", ["y1", "y2"], "csv", ""),  # the label columns named as the model's target names
    "binary": ("binary_cross_entropy", [], "csv", ""),  # no names: csv's first column
}


def table_model(tmp_path: Path, target: str) -> tuple[str, callable]:
    """A random dense model of a target kind on rows of 5 float32 values, exported to ONNX; and its outputs."""
    from mpitrain.nn.layers import Dense
    from mpitrain.nn.losses import sigmoid
    from mpitrain.nn.model import Sequential
    from mpitrain.rundir.export import export_onnx

    loss, names, _, _ = TABLE_TARGETS[target]
    model = Sequential([Dense(8, activation="tanh"), Dense(max(len(names), 1))], (5,), loss=loss)
    model.init_params(0, "xavier")
    statistics = {"target_mean": [100.0, -3.0], "target_std": [20.0, 0.5]} if target == "regression" else {}
    manifest = Manifest(feature_shape=(5,), feature_dtype="float32", scale=1.0, offset=0.0, mean=0.5, std=2.0,
                        num_classes=0, label_counts={}, splits={}, target=target, target_names=names, **statistics)
    export_onnx(model, manifest, str(tmp_path / "model.onnx"))
    # regression: trained on standardized targets, scored in the target's own units (mpitrain.data.units)
    head = (lambda values: values * [20.0, 0.5] + [100.0, -3.0]) if target == "regression" else sigmoid
    return str(tmp_path / "model.onnx"), lambda x: head(model.forward((x - 0.5) / 2.0, False))


@pytest.mark.parametrize("target", list(TABLE_TARGETS))
def test_other_targets_score_probabilities_or_values_with_their_metrics(spark, tmp_path, target):
    """Label columns as the model names them or as --label a,b says; a bad label is a bad record; the metrics are
    the kind's exact ones over the good rows, and `mpitrain score` prints them."""
    from mpitrain.etl.scoring import metric_lines
    from mpitrain.training.scores import target_metrics

    _, names, kind, label = TABLE_TARGETS[target]
    model, forward = table_model(tmp_path, target)
    rng = np.random.default_rng(7)
    n, k = 60, max(len(names), 1)
    x = rng.normal(0, 2, (n, 5)).astype(np.float32)
    expected = forward(x)
    y = rng.normal([100.0, -3.0], [20.0, 0.5], (n, k)) if target == "regression" else \
        (rng.random((n, k)) < expected).astype(np.float64)
    y[9, -1] = np.nan if target == "regression" else 0.5  # a bad label
    good = np.arange(n) != 9
    if kind == "parquet":
        pq.write_table(pa.table({"id": [f"r{i:02d}" for i in range(n)], "x": list(x), "a": y[:, 0].astype(np.int8),
                                 "b": y[:, 1]}),
                       str(tmp_path / "rows.parquet"))
        options = SourceOptions(label=label, keys=("id",))
    else:
        columns = [f"f{j}" for j in range(5)] + (names or ["label"])
        order = [5, 0, 1, 2, 6, 3, 4] if target == "regression" else [5, 0, 1, 2, 3, 4]  # labels first and between
        table = np.column_stack([x, y])[:, order]
        (tmp_path / "rows.csv").write_text(",".join(columns[i] for i in order) + "\n" + "".join(
            ",".join("" if np.isnan(v) else repr(float(v)) for v in row) + "\n" for row in table))
        options = SourceOptions(label=label)
    out = tmp_path / "p.parquet"
    metrics = score(spark, plan_scoring(model, f"{kind}:{tmp_path / f'rows.{kind}'}", str(out), max_bad_fraction=0.05,
                                        options=options))
    assert (metrics["records"], metrics["bad_records"], metrics["rows"], metrics["target"]) == (n, 1, n - 1, target)
    key = "id" if kind == "parquet" else "row"
    got = pq.read_table(str(out)).sort_by(key).to_pydict()
    assert list(got) == [key, "predicted", *([] if target == "regression" else ["probabilities"]), "label"]
    outputs = np.array(got["predicted" if target == "regression" else "probabilities"], np.float32)
    labels = np.array(got["label"], np.float32)
    np.testing.assert_allclose(outputs, expected[good], rtol=1e-5, atol=1e-5)
    want = y[good][:, [names.index(c) for c in label.split(",")]] if label else y[good]  # --label b,a: b first
    np.testing.assert_array_equal(labels, want.astype(np.float32))
    if target != "regression":
        assert (np.array(got["predicted"]) == (outputs > 0.5)).all()
    for key, value in target_metrics(target, labels, outputs).items():
        assert metrics[key] == pytest.approx(value, rel=1e-6), key
    assert json.loads((out / "_metrics.json").read_text()) == json.loads(json.dumps(metrics))
    headline = {"binary": "auc", "multilabel": "auc_macro", "regression": "r2"}[target]
    assert f"{headline} {metrics[headline]:.4f}" in metric_lines(metrics)[0]


def test_other_targets_refuse_labels_they_cannot_read(spark, tmp_path):
    """A label column that is not numbers when the job reads the schema, before any task; the count of label
    columns, a source without label columns and several labels of a class model before Spark starts."""
    model, _ = table_model(tmp_path, "multilabel")
    pq.write_table(pa.table({"x": [[0.0] * 5], "a": ["yes"], "b": [1.0]}), str(tmp_path / "rows.parquet"))
    with pytest.raises(ConfigError, match="label column 'a' is string; expected numbers or booleans"):
        score(spark, plan_scoring(model, f"parquet:{tmp_path / 'rows.parquet'}", str(tmp_path / "p")))
    (tmp_path / "rows.csv").write_text("a,b,f0,f1,f2,f3,f4\n")
    with pytest.raises(ConfigError, match=r"--label a: 1 label columns, but the multilabel model has 2 outputs "
                                          r"\['a', 'b'\]; expected one label column per output"):
        plan_scoring(model, f"csv:{tmp_path / 'rows.csv'}", str(tmp_path / "p"), options=SourceOptions(label="a"))
    with pytest.raises(ConfigError, match="a multilabel model reads its labels from columns of csv or parquet "
                                          "records .--label.; score digits records with --no-label"):
        plan_scoring(model, "digits:", str(tmp_path / "p"))
    with pytest.raises(ConfigError, match="--label a,b: a class model reads one label column"):
        plan_scoring(digits_model(tmp_path), f"csv:{tmp_path / 'rows.csv'}", str(tmp_path / "p"),
                     options=SourceOptions(label="a,b"))
    assert not (tmp_path / "p").exists()


def digits_model(tmp_path: Path) -> str:
    """A random class model of digits' rows, exported."""
    from mpitrain.nn.layers import Dense
    from mpitrain.nn.model import Sequential
    from mpitrain.rundir.export import export_onnx

    model = Sequential([Dense(10)], (64,))
    model.init_params(0, "xavier")
    manifest = Manifest(feature_shape=(64,), feature_dtype="uint8", scale=1 / 16, offset=0.0, mean=0.3, std=0.4,
                        num_classes=10, label_counts={}, splits={})
    export_onnx(model, manifest, str(tmp_path / "digits.onnx"))
    return str(tmp_path / "digits.onnx")


# --- a table model: raw records encoded by the model's own columns (TableEncoder), then scored by its graph ---

TABLE_ROWS = 500
COLORS = ["red", "green", "blue", "black", "white"]


def clicks_csv(path: Path, records: dict) -> None:
    """`records` ({column: values}, None missing) as a CSV, an empty field for a missing value."""
    lines = [",".join(records)] + [",".join("" if v is None else str(v) for v in row) for row in zip(*records.values())]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def clicks_model(spark, tmp_path_factory):
    """A CSV of clicks (a string and an integer categorical column, `age` with missing values, a binary label, and an
    `id` the model does not read) -> `mpitrain etl --categorical --standardize --numeric-missing impute` (shop's 8
    values past --max-vocabulary 6: a file vocabulary, --vocabulary-files) -> a graph
    model (embeddings, concat with the numbers) trained on 2 ranks -> `mpitrain export` and `predict` on the test
    split. Returns (folder, the records, the model file, the run dir)."""
    import argparse

    from mpitrain.etl.cli import add_arguments, plan_from_args
    from mpitrain.etl.job import write_dataset

    folder = tmp_path_factory.mktemp("clicks")
    rng = np.random.default_rng(3)
    color, shop = rng.integers(0, len(COLORS), TABLE_ROWS), rng.integers(0, 8, TABLE_ROWS)
    amount, age = np.round(rng.normal(50, 20, TABLE_ROWS), 4), np.round(rng.normal(40, 12, TABLE_ROWS), 2)
    logit = np.array([-1.0, 0.5, 1.0, -0.5, 0.0])[color] + 0.2 * (shop - 4) + (amount - 50) / 20
    records = {"id": [f"r{i:04d}" for i in range(TABLE_ROWS)],
               "color": [None if i % 23 == 0 else COLORS[c] for i, c in enumerate(color)], "shop": shop.tolist(),
               "amount": amount.tolist(), "age": [None if i % 7 == 0 else float(a) for i, a in enumerate(age)],
               "clicked": (rng.random(TABLE_ROWS) < 1 / (1 + np.exp(-logit))).astype(int).tolist()}
    clicks_csv(folder / "clicks.csv", records)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    write_dataset(spark, plan_from_args(parser.parse_args([
        "--source", f"csv:{folder / 'clicks.csv'}", "--label", "clicked", "--target", "binary",
        "--features", "amount,age", "--categorical", "color,shop", "--standardize", "--numeric-missing", "impute",
        "--max-vocabulary", "6", "--vocabulary-files", "--out", str(folder / "data"), "--shards", "2"])))
    graph = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 3},
             {"name": "flat", "type": "flatten", "input": "emb"},
             {"name": "joined", "type": "concat", "inputs": ["flat", "numeric"]},
             {"name": "hidden", "type": "dense", "input": "joined", "units": 8, "activation": "relu"},
             {"name": "out", "type": "dense", "input": "hidden", "units": 1}]
    config = write_config(folder / "config.yaml", folder / "data", train={"epochs": 2, "batch_size": 32},
                          model={"layers": [], "graph": graph, "loss": "binary_cross_entropy"})
    for args in ([MPITRAIN, "train", config], [MPITRAIN, "export", folder / "run", "--out", folder / "model.onnx"],
                 [MPITRAIN, "predict", folder / "run", "--split", "test"]):
        result = mpiexec(2, *args, timeout=180) if args[1] == "train" else command(*args)
        assert result.returncode == 0, result.stdout + result.stderr
    return folder, records, folder / "model.onnx", folder / "run"


def onnx_outputs(model: Path, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ONNX Runtime's outputs of a table model for rows of numbers `x` and their categorical `ids` (int64 there)."""
    import onnxruntime as ort
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "categorical": ids.astype(np.int64)})[0]


def test_a_table_model_scores_raw_records_through_its_columns(spark, clicks_model, tmp_path, monkeypatch, capsys,
                                                              caplog):
    """(a) the test split's own records score as `mpitrain predict` scored its rows; (b) new records with categories
    never seen in training (id 1), a missing category (id 0), a missing age (imputed) and one text age (a bad record,
    the encoder's reason): their scores are ONNX Runtime's on `TableEncoder(columns).encode` of them."""
    import onnx

    from mpitrain import cli
    from mpitrain.data.encoding import MISSING_ID, OUT_OF_VOCABULARY_ID, TableEncoder
    from mpitrain.etl import cli as etl_cli
    from mpitrain.rundir.export import metadata
    from mpitrain.testing.datasets import read_split
    from mpitrain.training.scores import target_metrics

    folder, records, model, run_dir = clicks_model
    monkeypatch.setattr(etl_cli, "spark_session", lambda master, name: contextlib.nullcontext(spark))
    columns = json.loads(metadata(onnx.load(str(model)))["manifest"])["columns"]
    assert columns == read_manifest(str(folder / "data")).columns
    encoder = TableEncoder(columns, str(folder / "data"))  # where shop's vocabulary files are
    assert [c["name"] for c in columns["numeric"]] == ["amount", "age", "age_missing"]
    assert ["vocabulary_path" in c for c in columns["categorical"]] == [False, True]

    def mpitrain_score(source: Path, out: Path, *more) -> dict:
        assert cli.main(["score", "--model", str(model), "--source", f"csv:{source}", "--out", str(out), *more]) == 0
        return json.loads((out / "_metrics.json").read_text())

    # (a) the records of the test split, found by their encoded rows (one record per row: `amount` differs), in the
    # split's order: `row` (the line number) is predict's row
    x_test, _ = read_split(folder / "data", "test")
    encoded = encoder.encode(records)
    assert not encoded.bad.any()
    where = {row.tobytes() + ids.tobytes(): i for i, (row, ids) in enumerate(zip(encoded.x, encoded.ids))}
    order = [where[row.tobytes() + ids.tobytes()] for row, ids in zip(x_test.x, x_test.columns["categorical"])]
    clicks_csv(tmp_path / "test.csv", {name: [values[i] for i in order] for name, values in records.items()})
    metrics = mpitrain_score(tmp_path / "test.csv", tmp_path / "a")
    got = read_output(tmp_path / "a", "row")
    assert list(got) == ["row", "predicted", "probabilities", "label"]
    assert (got["row"] == np.arange(1, len(order) + 1)).all()
    expected, predicted = predictions(run_dir)
    np.testing.assert_allclose(got["probabilities"], expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got["probabilities"], onnx_outputs(model, x_test.x, x_test.columns["categorical"]),
                               rtol=0, atol=1e-5)
    assert (np.stack(got["predicted"]) == predicted).all()
    labels = np.stack(got["label"])
    assert (labels[:, 0] == [records["clicked"][i] for i in order]).all()
    assert metrics["rows"] == len(order) and metrics["auc"] == pytest.approx(
        target_metrics("binary", labels, got["probabilities"])["auc"], rel=1e-9)
    assert f"auc {metrics['auc']:.4f}" in capsys.readouterr().out

    # (b) new records: unseen categories, a missing one, missing and text ages; columns in another order, no label
    new = {"age": [33.5, None, 51.0, "abc", 40.0, 28.25], "extra": ["x"] * 6,
           "shop": [3, 99, 0, 5, 7, 12], "color": ["purple", "red", None, "blue", "GREEN", "green"],
           "amount": [10.5, 61.25, 50.0, 44.0, 90.0, 5.0]}
    clicks_csv(tmp_path / "new.csv", new)
    with caplog.at_level(logging.WARNING, logger="mpitrain.etl.job"):
        metrics = mpitrain_score(tmp_path / "new.csv", tmp_path / "b", "--no-label", "--max-bad-fraction", "0.2")
    assert (metrics["records"], metrics["bad_records"], metrics["rows"]) == (6, 1, 5) and "auc" not in metrics
    assert "column 'age' holds 'abc', expected a number" in caplog.text
    got = read_output(tmp_path / "b", "row")
    assert list(got) == ["row", "predicted", "probabilities"] and list(got["row"]) == [1, 2, 3, 5, 6]
    mine = encoder.encode({name: [v for i, v in enumerate(values) if i != 3] for name, values in new.items()})
    assert not mine.bad.any()
    ids = {name: mine.ids[:, j] for j, name in enumerate(encoder.categorical)}
    assert list(ids["color"][[0, 2, 3]]) == [OUT_OF_VOCABULARY_ID, MISSING_ID, OUT_OF_VOCABULARY_ID]  # GREEN: not green
    assert list(ids["shop"][[1, 4]]) == [OUT_OF_VOCABULARY_ID] * 2 and ids["shop"][0] >= 2
    assert mine.x[1, 1] == 0 and list(mine.x[:, 2]) == [0, 1, 0, 0, 0]  # the missing age: its mean, standardized
    np.testing.assert_allclose(got["probabilities"], onnx_outputs(model, mine.x, mine.ids), rtol=0, atol=1e-5)


def test_a_table_model_refuses_a_source_without_its_columns(clicks_model, tmp_path):
    folder, records, model, _ = clicks_model
    clicks_csv(tmp_path / "rows.csv", {name: values for name, values in records.items() if name != "shop"})
    result = command(MPITRAIN, "score", "--model", model, "--source", f"csv:{tmp_path / 'rows.csv'}", "--out",
                     tmp_path / "p")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"mpitrain score: error: csv:{tmp_path / 'rows.csv'}: no column 'shop', which "
                                    "the model reads (numeric ['amount', 'age'], categorical ['color', 'shop'])")
    assert not (tmp_path / "p").exists() and siblings(tmp_path / "p") == []
