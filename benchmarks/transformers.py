"""Transformers through the whole pipeline (issue 48's references), as the README's commands run them.

- Fashion-MNIST row by row: the IDX images as Parquet records (`label`, and `rows`: 28 lists of 28 pixels / 255;
  `mpitrain.testing.sequences.write_image_rows_parquet`), `mpitrain etl --sequence rows`, `mpiexec -n 2 mpitrain
  train configs/fashion_transformer.yaml` (two pre-LN blocks of width 64, 4 heads, a feed-forward net of 128), and
  `mpitrain eval` on the test split.

Goal: test accuracy >= 0.87. Still to come here (issue 48): sktime's BasicMotions, the bag column's click table,
and the speed beside PyTorch DDP running `nn.TransformerEncoderLayer`.

    python benchmarks/transformers.py --out benchmarks/results     # about 15 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import os
import tempfile

from sequences import config_path, fashion_data, met, trained_accuracy

from common import markdown_table, write_results

FASHION_ACCURACY = 0.87


def markdown(result: dict) -> str:
    rows = [[r["model"], f"`configs/{r['config']}`", r["data"], str(r["epochs"]), f"{r['test_accuracy']:.4f}",
             f"{r['goal']}", met(r["test_accuracy"] >= r["goal"]), f"{r['samples_per_s']:.0f}",
             f"{r['train_minutes']:.1f}"] for r in result["accuracy"]]
    return markdown_table(["model", "config", "data", "epochs", "test acc", "goal", "", "samples/s", "minutes"], rows,
                          "lllrrrlrr") + (
        "\n\nFashion-MNIST: each image 28 tokens of 28 pixels / 255 through Parquet and `mpitrain etl --sequence "
        "rows`; 2 ranks; accuracy from `mpitrain eval` on the test split; minutes of `mpiexec -n 2 mpitrain "
        "train`, samples/s its summary's (training steps only).\n")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    result = {"accuracy": []}
    with tempfile.TemporaryDirectory() as work:
        row = trained_accuracy(config_path("fashion_transformer.yaml"), fashion_data(work),
                               os.path.join(work, "transformer"))
        result["accuracy"].append({"model": "2-block transformer", "config": "fashion_transformer.yaml",
                                   "data": "Fashion-MNIST rows", "goal": FASHION_ACCURACY, **row})
    result["met"] = all(r["test_accuracy"] >= r["goal"] for r in result["accuracy"])
    write_results(args.out, "transformers", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
