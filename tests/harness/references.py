"""Issue 28's reference results: a table through the whole pipeline, scored beside scikit-learn on the same split.

    result = run_reference("wine", folder, etl=lambda argv: ...)   # CSV, ETL, `mpiexec -n 2 mpitrain train`, eval
    result["mpitrain"], result["reference"], result["met"]

Each reference writes its table as a CSV (scikit-learn's bundled breast cancer, wine and diabetes sets, and
`make_multilabel_classification(n_samples=2000, n_classes=5, random_state=0)`), runs the ETL with its options
(`etl` runs an `mpitrain etl` argument list: the tests on their shared Spark session, the benchmark as the README's
command), trains on 2 ranks as the README does, evaluates with `mpitrain eval`, and fits scikit-learn's model on
the very rows of the dataset's train split, scoring it on its test split: the reference is measured in the same run
on the same rows. The test (tests/system/test_references.py) asserts `met`; benchmarks/tables.py writes the table.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mpitrain.testing.datasets import write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec


@dataclass(frozen=True)
class Reference:
    """One reference: its table, the ETL options, the model, the metric and what it must reach."""

    target: str
    table: Callable  # () -> (features (n, k), labels (n,) or (n, m), label column names)
    etl: list[str]  # `mpitrain etl` options beyond source, out and shards
    model: dict  # the config's model section
    metric: str  # a key of eval-test.json
    goal: str  # what `met` checks, in words
    met: Callable  # (mpitrain's score, the reference's score) -> bool
    sklearn: Callable  # (x_train, y_train, x_test, y_test) -> the reference's score
    train: dict = field(default_factory=lambda: {"epochs": 60, "batch_size": 16})
    optimizer: dict = field(default_factory=lambda: {"type": "adam", "lr": 0.01})
    seeds: tuple = (0,)  # the ETL's --seed of each split scored; the goal is checked on the median

def _bundled(name: str):
    def table():
        import sklearn.datasets
        data = getattr(sklearn.datasets, f"load_{name}")()
        return data.data, data.target, ["target"]
    return table


def _multilabel():
    from sklearn.datasets import make_multilabel_classification
    x, y = make_multilabel_classification(n_samples=2000, n_classes=5, random_state=0)
    return x, y, [f"label{j}" for j in range(y.shape[1])]


def _logistic_auc(x_train, y_train, x_test, y_test) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y_test[:, 0], LogisticRegression(max_iter=5000).fit(x_train, y_train[:, 0])
                               .predict_proba(x_test)[:, 1]))


def _logistic_accuracy(x_train, y_train, x_test, y_test) -> float:
    from sklearn.linear_model import LogisticRegression
    return float(LogisticRegression(max_iter=5000).fit(x_train, y_train).score(x_test, y_test))


def _least_squares_r2(x_train, y_train, x_test, y_test) -> float:
    from sklearn.linear_model import LinearRegression
    return float(LinearRegression().fit(x_train, y_train[:, 0]).score(x_test, y_test[:, 0]))


def _one_vs_rest_auc(x_train, y_train, x_test, y_test) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.multiclass import OneVsRestClassifier
    model = OneVsRestClassifier(LogisticRegression(max_iter=5000)).fit(x_train, y_train)
    return float(roc_auc_score(y_test, model.predict_proba(x_test), average="macro"))


REFERENCES = {
    "breast cancer": Reference(
        "binary", _bundled("breast_cancer"), ["--target", "binary", "--standardize"],
        {"layers": [{"type": "dense", "units": 1}], "loss": "binary_cross_entropy"},  # logistic regression
        "auc", "AUC >= 0.99", lambda score, reference: score >= 0.99, _logistic_auc,
        train={"epochs": 30, "batch_size": 16}, seeds=(0, 1, 2)),
    "wine": Reference(
        "class", _bundled("wine"), ["--standardize"],
        {"layers": [{"type": "dense", "units": 3}]},  # multinomial logistic regression
        "accuracy", "accuracy >= 0.97", lambda score, reference: score >= 0.97, _logistic_accuracy,
        train={"epochs": 30, "batch_size": 8}, seeds=(0, 1, 2)),
    "diabetes": Reference(
        "regression", _bundled("diabetes"), ["--target", "regression", "--standardize"],
        {"layers": [{"type": "dense", "units": 1}], "loss": "mse"},  # a linear model: what least squares fits
        "r2", "R² within 0.03 of least squares", lambda score, reference: score >= reference - 0.03,
        _least_squares_r2, train={"epochs": 60, "batch_size": 16}, optimizer={"type": "adam", "lr": 0.003}),
    "multilabel": Reference(
        "multilabel", _multilabel, ["--target", "multilabel", "--standardize"],
        {"layers": [{"type": "dense", "units": 5}], "loss": "multilabel_cross_entropy"},  # one logistic per label
        "auc_macro", "macro AUC within 0.01 of one-vs-rest logistic regression",
        lambda score, reference: score >= reference - 0.01, _one_vs_rest_auc, train={"epochs": 30, "batch_size": 32}),
}


def write_csv(path, x: np.ndarray, y: np.ndarray, label_names: list[str]) -> None:
    """Features f0.. and the label columns, with a header; integers as integers."""
    y = y.reshape(len(y), -1)
    header = ",".join([f"f{j}" for j in range(x.shape[1])] + label_names)
    label_format = "%d" if np.issubdtype(y.dtype, np.integer) else "%.10g"
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="",
               fmt=["%.10g"] * x.shape[1] + [label_format] * y.shape[1])


def read_split(dataset: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Every row of a split of a dataset folder, in order: (x, y) as stored, a table's x its numbers and then its
    categorical ids, side by side as float64 (exact), the matrix scikit-learn takes."""
    import h5py

    from mpitrain.data.shards import read_manifest
    parts = []
    for shard in read_manifest(dataset).shards(split):
        with h5py.File(os.path.join(dataset, shard.path), "r") as f:
            parts.append((np.column_stack([f["x"][...], f["ids"][...]]) if "ids" in f else f["x"][...], f["y"][...]))
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def run_reference(name: str, folder, etl: Callable[[list[str]], None], ranks: int = 2, evaluate: bool = True,
                  config: str | None = None) -> dict:
    """The reference `name` in `folder` on each of its splits (`Reference.seeds`): the medians of mpitrain's and
    scikit-learn's scores, whether the goal is met on them, and each split's scores (`splits`). mpitrain's score is
    `mpitrain eval`'s (eval-test.json), or without `evaluate` the training's own evaluation of the same final model
    (summary.json's, which eval equals: tests/mpi/test_targets.py), one launch fewer per split. With `config` (a
    config file, e.g. a shipped one), that file is trained on each split instead of the reference's own model.

    One split of a small table can be hard for any model (wine's seed-0 test split of 36 rows costs scikit-learn's
    logistic regression two rows, 0.944), so the absolute goals are checked on the median of three splits, with
    scikit-learn's score on the same splits beside them."""
    reference = REFERENCES[name]
    splits = [score_split(name, os.path.join(str(folder), f"seed{seed}"), etl, ranks, seed, evaluate, config)
              for seed in reference.seeds]
    score = float(np.median([split["mpitrain"] for split in splits]))
    baseline = float(np.median([split["reference"] for split in splits]))
    return {"dataset": name, "target": reference.target, "metric": reference.metric, "goal": reference.goal,
            "mpitrain": score, "reference": baseline, "met": bool(reference.met(score, baseline)), "ranks": ranks,
            "train_rows": splits[0]["train_rows"], "test_rows": splits[0]["test_rows"], "splits": splits}


def score_split(name: str, folder: str, etl: Callable[[list[str]], None], ranks: int, seed: int,
                evaluate: bool = True, config: str | None = None) -> dict:
    """One split (the ETL's `--seed`) of reference `name` in `folder`: mpitrain's (the reference's model, or the
    config file `config` on the split's data) and scikit-learn's scores."""
    reference = REFERENCES[name]
    os.makedirs(folder, exist_ok=True)
    x, y, label_names = reference.table()
    csv, data = os.path.join(folder, "table.csv"), os.path.join(folder, "data")
    write_csv(csv, x, y, label_names)
    etl(["--source", f"csv:{csv}", "--out", data, "--shards", "2", "--label", ",".join(label_names),
         "--seed", str(seed), *reference.etl])
    if config is None:
        command = [write_config(os.path.join(folder, "exp.yaml"), data, model=reference.model, train=reference.train,
                                optimizer=reference.optimizer)]
    else:
        command = [config, "--set", f"data.path={data}", "--set", f"run_dir={os.path.join(folder, 'run')}"]
    trained = mpiexec(ranks, MPITRAIN, "train", *command, timeout=300)
    if trained.returncode:
        raise RuntimeError(f"{name}: training failed:\n{trained.stderr[-3000:]}")
    if evaluate:
        scored = mpiexec(ranks, MPITRAIN, "eval", os.path.join(folder, "run"), timeout=120)
        if scored.returncode:
            raise RuntimeError(f"{name}: eval failed:\n{scored.stderr[-3000:]}")
        with open(os.path.join(folder, "run", "eval-test.json")) as f:
            score = json.load(f)[reference.metric]
    else:
        with open(os.path.join(folder, "run", "summary.json")) as f:
            score = json.load(f)["evaluation"][reference.metric]
    train_x, train_y = read_split(data, "train")
    test_x, test_y = read_split(data, "test")
    return {"seed": seed, "mpitrain": score, "reference": reference.sklearn(train_x, train_y, test_x, test_y),
            "train_rows": len(train_x), "test_rows": len(test_x)}
