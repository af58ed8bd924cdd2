"""A dense autoencoder beside PCA (issue 32's reference result): scikit-learn's digits through the whole pipeline.

Every step runs as the README's commands do, in the user's environment: `mpitrain etl --source digits:` (the
ETL's seeded, stratified test split of 20%), `mpiexec -n 2 mpitrain train configs/digits_autoencoder.yaml` (pixels
/ 16, 64 -> 128 ReLU -> a linear 10-unit code -> 128 ReLU -> 64, mean squared error) and `mpitrain eval`, whose
`mse` in eval-test.json is the autoencoder's reconstruction error on the test split. In the same run, scikit-learn's
PCA with 10 components is fitted on the very rows of the dataset's train split and reconstructs its test split
(`inverse_transform(transform(x))`); the mean predictor (every pixel's train mean) is shown beside them.

Beside it, the same config with a linear encoder and decoder (64 -> 10 -> 64, `LINEAR`, 100 epochs): what PCA
computes in closed form, so it can at best equal PCA's MSE, and reaching it checks training itself.

Goal: the autoencoder's test MSE within 2% of PCA's, read as at most 1.02 x PCA's (a 10-number code that
reconstructs better than PCA's 10 components meets it), and the linear autoencoder's within 2% of PCA's either way.

    python benchmarks/autoencoder.py --out benchmarks/results [--epochs 60]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from mpitrain.data.shards import read_manifest
from mpitrain.testing.references import read_split

from common import HERE, markdown_table, mpitrain, train, write_results

CONFIG = os.path.join(os.path.dirname(HERE), "configs", "digits_autoencoder.yaml")
COMPONENTS = 10
GOAL = 1.02  # the autoencoder's test MSE at most this times PCA's; the linear one's within 2% either way
LINEAR = [{"name": "pixels", "type": "flatten", "input": "numeric"},
          {"name": "code", "type": "dense", "input": "pixels", "units": COMPONENTS},
          {"name": "reconstruction", "type": "dense", "input": "code", "units": 64}]
LINEAR_EPOCHS = 100


def pixels(data: str, split: str) -> np.ndarray:
    """A split's rows in the data's units, which eval's mse is in whatever data.normalize is: stored * scale +
    offset, (rows, 64)."""
    manifest = read_manifest(data)
    x, _ = read_split(data, split)
    return x.reshape(len(x), -1).astype(np.float64) * manifest.scale + manifest.offset


def pca_mse(train_x: np.ndarray, test_x: np.ndarray) -> float:
    from sklearn.decomposition import PCA
    pca = PCA(n_components=COMPONENTS).fit(train_x)
    return float(np.mean((pca.inverse_transform(pca.transform(test_x)) - test_x) ** 2))


def trained_mse(data: str, run_dir: str, overrides: dict) -> tuple[float, dict]:
    """`mpiexec -n 2 mpitrain train` of CONFIG with `overrides`, then `mpitrain eval`: (test MSE, the summary)."""
    summary = train(2, CONFIG, {"data.path": data, "run_dir": run_dir, "resume": "never", **overrides})
    mpitrain("eval", run_dir, "--split", "test")
    with open(os.path.join(run_dir, "eval-test.json")) as f:
        return json.load(f)["mse"], summary


def measure(work: str, epochs: int) -> dict:
    data = os.path.join(work, "data")
    mpitrain("etl", "--source", "digits:", "--out", data, "--shards", "2")
    started = time.perf_counter()
    scored, summary = trained_mse(data, os.path.join(work, "run"), {"train.epochs": epochs})
    seconds = time.perf_counter() - started
    linear, _ = trained_mse(data, os.path.join(work, "linear"), {"train.epochs": LINEAR_EPOCHS, "model.graph": LINEAR})
    train_x, test_x = pixels(data, "train"), pixels(data, "test")
    reference = pca_mse(train_x, test_x)
    mean = float(np.mean((test_x - train_x.mean(axis=0)) ** 2))
    return {"dataset": "digits", "config": "configs/digits_autoencoder.yaml", "ranks": 2, "epochs": epochs,
            "code_units": COMPONENTS, "train_rows": len(train_x), "test_rows": len(test_x),
            "mpitrain_mse": scored, "pca_mse": reference, "mean_predictor_mse": mean,
            "ratio_to_pca": scored / reference, "linear_epochs": LINEAR_EPOCHS, "linear_mse": linear,
            "linear_ratio_to_pca": linear / reference,
            "goal": f"test MSE <= {GOAL} x PCA's ({COMPONENTS} components); the linear one's within 2% of PCA's",
            "met": bool(scored <= GOAL * reference and abs(linear / reference - 1) <= GOAL - 1),
            "train_wall_s": seconds, "samples_per_s": summary["samples_per_s"]}


def markdown(result: dict) -> str:
    table = markdown_table(
        ["model", "code", "test MSE", "/ PCA's", "goal", "met"],
        [["autoencoder (mpitrain, 2 ranks, {} epochs)".format(result["epochs"]), "10, linear",
          f"{result['mpitrain_mse']:.5f}", f"{result['ratio_to_pca']:.3f}", f"<= {GOAL}",
          "yes" if result["mpitrain_mse"] <= GOAL * result["pca_mse"] else "**no**"],
         ["linear autoencoder (mpitrain, 2 ranks, {} epochs)".format(result["linear_epochs"]), "10, linear",
          f"{result['linear_mse']:.5f}", f"{result['linear_ratio_to_pca']:.3f}", "0.98 to 1.02",
          "yes" if abs(result["linear_ratio_to_pca"] - 1) <= GOAL - 1 else "**no**"],
         [f"PCA, {COMPONENTS} components (scikit-learn)", f"{COMPONENTS}", f"{result['pca_mse']:.5f}", "1.000", "", ""],
         ["mean of each pixel (train)", "none", f"{result['mean_predictor_mse']:.5f}",
          f"{result['mean_predictor_mse'] / result['pca_mse']:.3f}", "", ""]], "llrrll")
    return (table + f"\n\nscikit-learn's digits, pixels / 16; {result['train_rows']} train and {result['test_rows']} "
            "test rows (the ETL's seeded split); MSE over every pixel of every test row (`mse` of `mpitrain eval`'s "
            "eval-test.json); PCA fitted on the same train rows in the same run. The autoencoder is "
            "configs/digits_autoencoder.yaml (64 -> 128 ReLU -> 10 -> 128 ReLU -> 64); the linear one the same "
            "config with `model.graph` 64 -> 10 -> 64.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = measure(work, args.epochs)
    write_results(args.out, "autoencoder", result, markdown(result))


if __name__ == "__main__":
    main()
