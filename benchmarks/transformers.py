"""Transformers through the whole pipeline (issue 48's references), as the README's commands run them.

- Fashion-MNIST row by row: the IDX images as Parquet records (`label`, and `rows`: 28 lists of 28 pixels / 255;
  `mpitrain.testing.sequences.write_image_rows_parquet`), `mpitrain etl --sequence rows`, `mpiexec -n 2 mpitrain
  train configs/fashion_transformer.yaml` (two pre-LN blocks of width 64, 4 heads, a feed-forward net of 128), and
  `mpitrain eval` on the test split. Goal: test accuracy >= 0.87.
- sktime's BasicMotions (UEA; 6 channels x 100 steps, 4 classes, 40 + 40 records): the `.ts` files inside the
  installed sktime package read by sktime's loader into Parquet (`write_uea_parquet`), `mpitrain etl --sequence
  channels --standardize`, `configs/basicmotions_transformer.yaml` on 2 ranks, `mpitrain eval`. Goal: test
  accuracy >= 0.95.
- FT-Transformer on scikit-learn's breast cancer table: `configs/breast_cancer_ft_transformer.yaml` on the three
  splits of the tables' reference (`mpitrain.testing.references`, `mpitrain etl --standardize`), beside
  scikit-learn's logistic regression on the same rows. Goal: the median test AUC within 0.01 of logistic
  regression's (a table this small leaves a transformer nothing to find beyond a linear model).

- Speed, 2 ranks on this machine's cores: Fashion's two blocks (d_model 64, 4 heads, ff 128, dropout 0.1, AdamW;
  the config's model with a 4-class head) on motif sequences of 32-64 steps of 2 numbers, batch 64 per rank, 1
  epoch beside PyTorch DDP running `nn.TransformerEncoderLayer(norm_first=True, activation="gelu")` with its key
  padding mask (benchmarks/torch_ddp.py, torch_sequences.py; the twin checked to compute mpitrain's function
  first), `--repeat` rounds taking turns, the median counts; FLOPs per sample and the share of one core's sgemm
  rate as benchmarks/sequences.py counts them. Goal: mpitrain >= 1.0x PyTorch DDP's samples/s.

- Bags: a generated click table (`mpitrain.testing.sequences.BagClicks`: 1,000 merchants, a bag of 0-20 recent
  merchants per row drawn Zipf-like, two numbers; clicks drawn from a known probability through the mean of the
  bag's merchants' effects, an empty bag's 0) as Parquet with a list column of merchant names ("m17"), `mpitrain etl
  --bag recent --features n0,n1 --target binary` (the names through the train split's vocabulary), a
  graph of an `embedding_bag` (mean, dim 16) beside the numbers and a hidden layer, 2 ranks, Adam; `mpitrain
  predict` on the test split against the true probabilities' AUC (the Bayes AUC, recomputed for each stored row).
  Goal: within 0.012 of it; the same graph without the bag column, measurably below.

    python benchmarks/transformers.py --out benchmarks/results     # about 20 minutes on 2 cores
    python benchmarks/transformers.py --parts speed --repeat 1     # the speed alone, one round (the other parts'
                                                                   # figures kept from the last run)
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import yaml
from sequences import config_path, fashion_data, met, motif_data, speed, trained_accuracy

from mpitrain.testing.datasets import write_config
from mpitrain.testing.references import read_split, run_reference
from mpitrain.testing.sequences import BagClicks, write_uea_parquet

from common import markdown_table, mpitrain, train, write_results

PARTS = ("fashion", "motions", "tables", "bags", "speed")
BAG_ROWS = (200_000, 20_000)  # train and test rows of the bag click table
BAG_GAP = 0.012  # the bag model's test AUC at most this far below the true probabilities'
BAG_HEAD = [{"name": "hidden", "type": "dense", "input": "joined", "units": 32, "activation": "relu"},
            {"name": "out", "type": "dense", "input": "hidden", "units": 1}]
BAG_GRAPHS = {"with the bag": [{"name": "bag", "type": "embedding_bag", "input": "recent", "dim": 16},
                               {"name": "joined", "type": "concat", "inputs": ["bag", "numeric"]}, *BAG_HEAD],
              "without it": [{"name": "joined", "type": "dense", "input": "numeric", "units": 8}, *BAG_HEAD]}
SPEED = 1.0  # mpitrain's samples/s over PyTorch DDP's
SPEED_ROWS = (8_000, 1_000)  # motif sequences of 32-64 steps: train and test rows
FASHION_ACCURACY = 0.87
MOTIONS_ACCURACY = 0.95
TABLE_AUC_GAP = 0.01  # FT-Transformer's median test AUC at most this far below logistic regression's


def earlier_parts(out: str, parts: list[str]) -> dict:
    """What OUT/transformers.json holds of the parts not run now ({} when every part runs, or none was written):
    a run of some `--parts` keeps the others' last figures, and its table names them."""
    path = os.path.join(out, "transformers.json")
    if set(parts) >= set(PARTS) or not os.path.exists(path):
        return {}
    with open(path) as f:
        last = json.load(f)
    configs = {"fashion": "fashion_transformer.yaml", "motions": "basicmotions_transformer.yaml"}
    kept = {"accuracy": [row for row in last.get("accuracy", []) if row["config"] not in
                         {configs[part] for part in parts if part in configs}]}
    kept.update({key: last[key] for part, key in (("tables", "tables"), ("bags", "bags"), ("speed", "speed"))
                 if part not in parts and key in last})
    return kept


def markdown(result: dict) -> str:
    rows = [[r["model"], f"`configs/{r['config']}`", r["data"], str(r["epochs"]), f"{r['test_accuracy']:.4f}",
             f"{r['goal']}", met(r["test_accuracy"] >= r["goal"]), f"{r['samples_per_s']:.0f}",
             f"{r['train_minutes']:.1f}"] for r in result["accuracy"]]
    parts = []
    if rows:
        parts.append(markdown_table(["model", "config", "data", "epochs", "test acc", "goal", "", "samples/s",
                                     "minutes"], rows, "lllrrrlrr") + (
            "\n\nFashion-MNIST: each image 28 tokens of 28 pixels / 255 through Parquet and `mpitrain etl "
            "--sequence rows`; 2 ranks; accuracy from `mpitrain eval` on the test split; minutes of `mpiexec -n 2 "
            "mpitrain train`, samples/s its summary's (training steps only). BasicMotions: the sktime package's .ts "
            "files, standardized per channel by the ETL.\n"))
    if result["tables"]:
        parts.append(table_markdown(result["tables"]))
    if result.get("bags"):
        parts.append(bag_markdown(result["bags"]))
    if result.get("speed"):
        parts.append(speed_markdown(result["speed"]))
    if result.get("earlier_run"):
        parts.append(f"Figures of {', '.join(result['earlier_run'])} are those of an earlier run (`--parts` ran "
                     "the others).\n")
    return "\n".join(parts)


def speed_markdown(s: dict) -> str:
    lines = [[r["engine"], f"{r['samples_per_s']:.0f}", f"{r['vs_ddp']:.2f}x" if r["vs_ddp"] else "-",
              f"{r['vs_ddp_compiled']:.2f}x" if r.get("vs_ddp_compiled") else "-",
              f"{r['flops_per_sample'] / 1e6:.1f} M", f"{r['gflop_per_s']:.2f}", f"{r['of_sgemm']:.1%}"]
             for r in s["rows"]]
    return markdown_table(["engine", "samples/s", "vs DDP", "vs DDP compiled", "FLOPs/sample", "GFLOP/s",
                           "of sgemm"], lines, "lrrrrrr") + (
        f"\n\nSpeed: 2 ranks, 1 epoch of {SPEED_ROWS[0]} motif sequences of 32-64 steps (mean "
        f"{s['mean_length']:.1f}), batch 64 per rank, the median of {s['repeat']} round(s) taking turns; goal mpitrain "
        f">= {SPEED:g}x PyTorch DDP (gloo, 1 thread per rank, `nn.TransformerEncoderLayer` with its key padding "
        "mask, the same rows, batches and AdamW), eager and through `torch.compile` (default mode; one more epoch, "
        "first, compiles and is not counted). FLOPs per sample: 3 x the forward's matrix products at the mean "
        f"length (`mpitrain.testing.flops`); of sgemm: FLOPs per sample x samples/s / one core's numpy sgemm rate, "
        f"{s['sgemm_gflop_per_s']:.1f} GFLOP/s, measured in the same run (200%: both cores at that rate).\n")


def table_markdown(rows: list[dict]) -> str:
    lines = [[r["model"], f"`configs/{r['config']}`", r["dataset"], f"{r['mpitrain']:.4f}", f"{r['reference']:.4f}",
              f"within {TABLE_AUC_GAP} of it", met(r["met"])] for r in rows]
    return "\n" + markdown_table(["model", "config", "table", "test AUC", "logistic regression", "goal", ""], lines,
                                 "lllrrll") + (
        "\n\nThe median of three splits (the ETL's seeds 0, 1 and 2) of each score, 2 ranks, AUC from `mpitrain "
        "eval`; scikit-learn's logistic regression fitted on each split's stored (standardized) rows.\n")


def motions_data(work: str) -> str:
    """BasicMotions' TRAIN and TEST .ts files as Parquet, through `mpitrain etl --sequence channels --standardize`."""
    parquet = {split: os.path.join(work, f"basicmotions-{split.lower()}.parquet") for split in ("TRAIN", "TEST")}
    for split, path in parquet.items():
        write_uea_parquet(path, "BasicMotions", split)
    data = os.path.join(work, "basicmotions")
    mpitrain("etl", "--source", f"parquet:{parquet['TRAIN']}", "--test", parquet["TEST"], "--label", "label",
             "--sequence", "channels", "--standardize", "--out", data, "--shards", "2")
    return data


def write_bag_parquet(path: str, numbers: np.ndarray, bags: list, clicks: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"n0": numbers[:, 0], "n1": numbers[:, 1],
                             "recent": pa.array([[f"m{i}" for i in bag] for bag in bags], pa.list_(pa.string())),
                             "click": pa.array(clicks, pa.int32())}), path)


def bag_rows(work: str) -> list[dict]:
    """The bag click table through the ETL, trained with and without its bag column on 2 ranks; each model's test
    AUC beside the true probabilities'."""
    import h5py
    from sklearn.metrics import roc_auc_score
    clicks, paths, truth = BagClicks(1000, (0, 20)), {}, {}
    for split, rows, seed in (("train", BAG_ROWS[0], 1), ("test", BAG_ROWS[1], 2)):
        numbers, bags, outcomes, probability = clicks.draw(rows, seed)
        paths[split] = os.path.join(work, f"bags-{split}.parquet")
        write_bag_parquet(paths[split], numbers, bags, outcomes)
        if split == "test":  # a stored row is found again by its two numbers (float32, stored as they are)
            truth = {row.tobytes(): p for row, p in zip(numbers, probability)}
    data = os.path.join(work, "bags")
    mpitrain("etl", "--source", f"parquet:{paths['train']}", "--test", paths["test"], "--label", "click", "--target",
             "binary", "--bag", "recent", "--features", "n0,n1", "--out", data, "--shards", "4")
    x, labels = read_split(data, "test")
    best = roc_auc_score(labels[:, 0], [truth[row.astype(np.float32).tobytes()] for row in x])
    results = []
    for name, graph in BAG_GRAPHS.items():
        config = write_config(os.path.join(work, f"bags-{len(results)}.yaml"), data,
                              model={"layers": [], "graph": graph, "loss": "binary_cross_entropy"},
                              optimizer={"type": "adam", "lr": 0.001}, train={"epochs": 3, "batch_size": 256})
        run = os.path.join(work, f"bags-run{len(results)}")
        summary = train(2, config, {"run_dir": run})
        mpitrain("predict", run, "--split", "test")
        with h5py.File(os.path.join(run, "predictions-test.h5"), "r") as f:
            auc = roc_auc_score(labels[:, 0], f["probabilities"][:, 0])
        results.append({"model": name, "train_rows": BAG_ROWS[0], "test_rows": len(labels), "auc": auc,
                        "true_auc": best, "gap": best - auc, "samples_per_s": summary["samples_per_s"]})
    results[0]["met"] = results[0]["gap"] <= BAG_GAP and results[1]["auc"] < results[0]["auc"] - 0.01
    return results


def bag_markdown(rows: list[dict]) -> str:
    lines = [[r["model"], f"{r['train_rows']:,}", f"{r['auc']:.4f}", f"{r['true_auc']:.4f}", f"{r['gap']:.4f}",
              met(r["met"]) if "met" in r else "-", f"{r['samples_per_s']:.0f}"] for r in rows]
    return "\n" + markdown_table(["bag click table", "train rows", "test AUC", "true probabilities' AUC", "gap",
                                  f"within {BAG_GAP}", "samples/s"], lines, "lrrrrlr") + (
        "\n\nA graph of an `embedding_bag` (mean, dim 16) of the `recent` ids beside the two numbers, a hidden layer "
        "of 32, a logistic output; without it: the numbers alone through the same head. 2 ranks, 3 epochs, Adam "
        "(lr 0.001), batch 256 per rank; AUC of `mpitrain predict` on the test split; the true probabilities' AUC "
        "is the best any model can reach on these rows. The goal also asks the model without the bag to be more "
        "than 0.01 below the one with it.\n")


def speed_config(work: str) -> str:
    """The Fashion transformer's config with a head of the motifs' 4 classes and no schedule (one epoch is shorter
    than its warm-up; PyTorch's twin runs none): the blocks the speed rows time."""
    with open(config_path("fashion_transformer.yaml")) as f:
        config = yaml.safe_load(f)
    config["model"]["layers"][-1]["units"] = 4
    del config["optimizer"]["schedule"]
    path = os.path.join(work, "motifs_transformer.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"a comma-separated subset of {PARTS}")
    parser.add_argument("--repeat", type=int, default=3, help="speed rounds")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    result = {"accuracy": [], "tables": []}
    earlier = earlier_parts(args.out, parts)
    with tempfile.TemporaryDirectory() as work:
        for part, config, data, goal, name in (
                ("fashion", "fashion_transformer.yaml", fashion_data, FASHION_ACCURACY, "Fashion-MNIST rows"),
                ("motions", "basicmotions_transformer.yaml", motions_data, MOTIONS_ACCURACY, "BasicMotions (sktime)")):
            if part in parts:
                row = trained_accuracy(config_path(config), data(work), os.path.join(work, config))
                result["accuracy"].append({"model": "2-block transformer", "config": config, "data": name,
                                           "goal": goal, **row})
        if "tables" in parts:
            config = "breast_cancer_ft_transformer.yaml"
            scores = run_reference("breast cancer", os.path.join(work, "ft"), lambda argv: mpitrain("etl", *argv),
                                   config=config_path(config))
            result["tables"].append({"model": "FT-Transformer", "config": config, **scores,
                                     "met": scores["mpitrain"] >= scores["reference"] - TABLE_AUC_GAP})
        if "bags" in parts:
            result["bags"] = bag_rows(work)
        if "speed" in parts:
            data = motif_data(work, *SPEED_ROWS, lengths=(32, 64))
            result["speed"] = speed(data, args.repeat, {"2-block transformer": speed_config(work)})
    if earlier:
        result.update({**earlier, "accuracy": [*earlier["accuracy"], *result["accuracy"]],
                       "earlier_run": [part for part in PARTS if part not in parts]})
    speed_rows = result.get("speed", {}).get("rows", [])
    result["met"] = all(r["test_accuracy"] >= r["goal"] for r in result["accuracy"]) and \
        all(r["met"] for r in result["tables"]) and all(r["met"] for r in result.get("bags", [])[:1]) and \
        all(r["vs_ddp"] >= SPEED for r in speed_rows if r["engine"] == "mpitrain")
    write_results(args.out, "transformers", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
