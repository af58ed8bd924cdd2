"""Tables through the whole pipeline (issue 28's reference results): shipped data sets beside scikit-learn, and a
click-through table of millions of rows beside its true probabilities.

Every step runs as the README's commands do (`mpitrain etl`, `mpiexec -n N mpitrain train`, `mpitrain eval`,
`mpitrain predict`), in the user's environment.

- references: scikit-learn's breast cancer (binary), wine (class) and diabetes (regression) sets and
  `make_multilabel_classification(n_samples=2000, n_classes=5, random_state=0)`, each written as a CSV, made into a
  dataset by the ETL, trained on 2 ranks and evaluated; scikit-learn's model is fitted on the same split's rows
  (`mpitrain.testing.references`; the small tables on three splits, the median counts). Targets: breast cancer
  AUC >= 0.99, wine accuracy >= 0.97, diabetes R² within 0.03 of least squares, multilabel macro AUC within 0.01
  of one-vs-rest logistic regression.
- clicks: `mpitrain.testing.datasets.Clicks` with categorical columns of 10^2, 10^3, 10^4 and 10^5 values
  (Zipf-distributed) and 3 numeric columns, `--rows` training rows (default 2 * 10^6) and a tenth as many test
  rows, written as a CSV with the values as text ("v123"), made into a dataset by the ETL (`--categorical`,
  vocabularies, `--standardize`), trained on 1 and 2 ranks with a wide-and-deep graph (docs/tables.md) for 2
  epochs. Each stored test row's true probability is recomputed from the row (ids back to values through the
  manifest's vocabularies, numbers back through its mean and std); rows holding a value never seen in training
  (the out-of-vocabulary id, so not recoverable) are left out of both AUCs, and counted. Target: the model's AUC
  within 0.01 of the true probabilities' AUC, on 1 and 2 ranks.

    python benchmarks/tables.py --out benchmarks/results [--parts references,clicks] [--rows 2000000]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np

from mpitrain.testing.datasets import Clicks, write_config
from mpitrain.testing.references import REFERENCES, read_split, run_reference

from common import markdown_table, mpitrain, train, write_results

PARTS = ("references", "clicks")
IDS = (100, 1000, 10_000, 100_000)
NUMERIC = 3
WIDE_AND_DEEP = [
    {"name": "wide", "type": "embedding", "input": "categorical", "dim": 1},
    {"name": "wflat", "type": "flatten", "input": "wide"},
    {"name": "emb", "type": "embedding", "input": "categorical", "dim": 8},
    {"name": "flat", "type": "flatten", "input": "emb"},
    {"name": "drop", "type": "dropout", "input": "flat", "rate": 0.3},
    {"name": "joined", "type": "concat", "inputs": ["drop", "numeric"]},
    {"name": "hidden", "type": "dense", "input": "joined", "units": 32, "activation": "relu"},
    {"name": "all", "type": "concat", "inputs": ["wflat", "hidden", "numeric"]},
    {"name": "out", "type": "dense", "input": "all", "units": 1}]


def references(work: str) -> list[dict]:
    rows = []
    for name in REFERENCES:
        folder = os.path.join(work, name.replace(" ", "_"))
        os.makedirs(folder)
        result = run_reference(name, folder, lambda argv: mpitrain("etl", *argv))
        rows.append({"part": "references", **result})
    return rows


def write_clicks_csv(path: str, clicks: Clicks, n: int, seed: int) -> None:
    """`n` rows of `clicks` as a CSV: numbers n0.., values c0.. as text "vCODE", the 0/1 label `click`."""
    numbers, codes, outcomes, _ = clicks.draw(n, seed)
    with open(path, "w") as f:
        f.write(",".join([f"n{j}" for j in range(NUMERIC)] + [f"c{j}" for j in range(len(IDS))] + ["click"]) + "\n")
        for start in range(0, n, 100_000):
            stop = min(n, start + 100_000)
            columns = [np.char.mod("%.9g", numbers[start:stop, j]) for j in range(NUMERIC)] + \
                [np.char.add("v", codes[start:stop, j].astype(str)) for j in range(len(IDS))] + \
                [outcomes[start:stop, 0].astype(int).astype(str)]
            f.write("\n".join(",".join(fields) for fields in zip(*columns)) + "\n")


def true_probabilities(clicks: Clicks, data: str) -> tuple[np.ndarray, np.ndarray]:
    """The test split's rows' true probabilities from the stored rows, and which rows hold only known values."""
    from mpitrain.data.shards import read_manifest
    columns = read_manifest(data).columns
    numeric, categorical = columns["numeric"], columns["categorical"]
    assert [c["name"] for c in numeric] == [f"n{j}" for j in range(NUMERIC)], numeric
    assert [c["name"] for c in categorical] == [f"c{j}" for j in range(len(IDS))], categorical
    x, _ = read_split(data, "test")
    numbers = np.column_stack([x[:, j] * c.get("std", 1.0) + c.get("mean", 0.0) for j, c in enumerate(numeric)])
    ids = x[:, NUMERIC:].astype(np.int64)
    known = ids >= 2  # 0: missing (none here), 1: a value never seen in training
    codes = np.zeros_like(ids)
    for j, column in enumerate(categorical):
        vocabulary = np.array([int(value[1:]) for value in column["vocabulary"]])  # "v123" -> 123
        codes[known[:, j], j] = vocabulary[ids[known[:, j], j] - 2]
    return clicks.probability(numbers, codes), known.all(axis=1)


def click_rows(work: str, n: int) -> list[dict]:
    from sklearn.metrics import roc_auc_score
    clicks = Clicks(IDS, NUMERIC)
    csv, test_csv, data = (os.path.join(work, name) for name in ("clicks.csv", "clicks-test.csv", "clicks"))
    write_clicks_csv(csv, clicks, n, seed=1)
    write_clicks_csv(test_csv, clicks, n // 10, seed=2)
    mpitrain("etl", "--source", f"csv:{csv}", "--test", test_csv, "--out", data, "--shards", "8",
             "--label", "click", "--target", "binary", "--categorical", ",".join(f"c{j}" for j in range(len(IDS))),
             "--standardize")
    truth, known = true_probabilities(clicks, data)
    _, labels = read_split(data, "test")
    best = roc_auc_score(labels[known, 0], truth[known])
    config = write_config(os.path.join(work, "clicks.yaml"), data,
                          model={"layers": [], "graph": WIDE_AND_DEEP, "loss": "binary_cross_entropy"},
                          optimizer={"type": "adam", "lr": 0.002}, train={"epochs": 2, "batch_size": 512})
    rows = []
    for ranks in (1, 2):
        run = os.path.join(work, f"run{ranks}")
        summary = train(ranks, config, {"run_dir": run, "train.global_batch_size": 1024})
        mpitrain("predict", run, "--split", "test")
        import h5py
        with h5py.File(os.path.join(run, "predictions-test.h5"), "r") as f:
            predicted = f["probabilities"][:, 0]
        auc = roc_auc_score(labels[known, 0], predicted[known])
        rows.append({"part": "clicks", "ranks": ranks, "train_rows": n, "test_rows": len(labels),
                     "test_rows_scored": int(known.sum()), "auc": auc, "true_auc": best, "gap": best - auc,
                     "auc_all_test_rows": summary["evaluation"]["auc"], "samples_per_s": summary["samples_per_s"],
                     "bytes_sent_per_step": summary["bytes_sent_per_step"], "met": best - auc <= 0.01})
    return rows


def markdown(rows: list[dict]) -> str:
    parts = []
    refs = [r for r in rows if r["part"] == "references"]
    if refs:
        parts.append(markdown_table(
            ["data set", "target", "metric", "mpitrain", "scikit-learn, same split", "goal", "met", "splits"],
            [[r["dataset"], r["target"], r["metric"], f"{r['mpitrain']:.4f}", f"{r['reference']:.4f}", r["goal"],
              "met" if r["met"] else "NOT met", ", ".join(f"{s['mpitrain']:.3f}/{s['reference']:.3f}"
                                                          for s in r["splits"])] for r in refs], "llllrlll"))
    clicks = [r for r in rows if r["part"] == "clicks"]
    if clicks:
        parts.append(markdown_table(
            ["ranks", "train rows", "test rows scored", "model AUC", "true probabilities' AUC", "gap", "within 0.01",
             "samples/s"],
            [[str(r["ranks"]), f"{r['train_rows']:,}", f"{r['test_rows_scored']:,} of {r['test_rows']:,}",
              f"{r['auc']:.4f}", f"{r['true_auc']:.4f}", f"{r['gap']:.4f}", "met" if r["met"] else "NOT met",
              f"{r['samples_per_s']:,.0f}"] for r in clicks], "rrrrrrlr"))
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    parser.add_argument("--rows", type=int, default=2_000_000, help="clicks: training rows (at least 10^6 for the "
                                                                     "issue's figure)")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        parser.error(f"--parts: {parts}; expected some of {PARTS}")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        if "references" in parts:
            rows += references(work)
        if "clicks" in parts:
            rows += click_rows(work, args.rows)
    result = {"setup": {"ids": list(IDS), "numeric": NUMERIC, "rows": args.rows, "graph": WIDE_AND_DEEP},
              "rows": rows}
    write_results(args.out, "tables", result, markdown(rows))
    print(json.dumps(rows, indent=1, default=str)[:3000])
    return result


if __name__ == "__main__":
    main()
