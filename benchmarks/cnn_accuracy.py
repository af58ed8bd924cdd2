"""Test accuracy of the conv nets on Fashion-MNIST after 10 epochs on 4 ranks with `sharing`.

Targets: LeNet (configs/fashion_lenet.yaml) >= 0.915 (the Fashion-MNIST benchmark table
lists 0.916 for 2 conv + pooling), the batch-norm CNN (configs/fashion_cnn_bn.yaml) >= 0.925.

    python benchmarks/cnn_accuracy.py --data data/fashion --out benchmarks/results
"""
from __future__ import annotations

import argparse

from mpitrain.config.sections import load_config

from common import benchmark_parser, markdown_table, run_mpitrain, write_results

MODELS = [("LeNet", "configs/fashion_lenet.yaml", 0.915), ("batch-norm CNN", "configs/fashion_cnn_bn.yaml", 0.925)]


def main(argv=None) -> dict:
    parser = benchmark_parser(__doc__, epochs=10)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mode", default="sharing")
    args = parser.parse_args(argv)
    rows = []
    for name, config, target in MODELS:
        s = run_mpitrain(argparse.Namespace(**{**vars(args), "config": config}), args.ranks, args.mode, {},
                         args.epochs)
        rows.append({"model": name, "config": config, "batch_size": load_config(config).train.batch_size,
                     "target": target, "test_accuracy": s["test_accuracy"],
                     "samples_per_s": s["samples_per_s"], "bytes_sent_per_step": s["bytes_sent_per_step"],
                     "n_params": s["n_params"], "wall_s": s["wall_s"]})
    result = {"epochs": args.epochs, "ranks": args.ranks, "mode": args.mode, "rows": rows}
    write_results(args.out, "cnn_accuracy", result, markdown(result))
    return result


def markdown(result: dict) -> str:
    rows = [[r["model"], f"`{r['config']}`", str(r["n_params"]), str(r["batch_size"]), f"{r['test_accuracy']:.4f}",
             f"{r['target']:.3f}",
             "met" if r["test_accuracy"] >= r["target"] else "NOT met", f"{r['bytes_sent_per_step']:.0f}",
             f"{r['wall_s'] / 60:.1f}"] for r in result["rows"]]
    return (f"{result['ranks']} ranks, `{result['mode']}`, {result['epochs']} epochs\n\n"
            + markdown_table(["model", "config", "parameters", "batch/rank", "test acc", "target", "",
                              "bytes/step/rank", "minutes"], rows, "llrrrrlrr") + "\n")


if __name__ == "__main__":
    main()
