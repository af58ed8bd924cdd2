"""Sequence models through the whole pipeline (issue 32's reference results), and their speed beside PyTorch DDP.

Every step runs as the README's commands do, in the user's environment (the configs' headers show the commands):

- Motifs: ragged synthetic sequences with a known rule (`mpitrain.testing.sequences.motif_sequences`: 10-200 steps
  of 2 numbers of noise, one of 4 motifs of 4 steps at a random place, the class is which motif; 20,000 train and
  4,000 test rows by default) written as Parquet, `mpitrain etl --sequence readings`, then `mpiexec -n 2 mpitrain
  train` of configs/motifs_lstm.yaml and configs/motifs_conv1d.yaml, and `mpitrain eval` (test accuracy). Padding
  invariance: `mpiexec -n 2 mpitrain predict RUN --batch-size 1` (each sequence alone, unpadded but for the
  rounding to 8 steps) against `--batch-size 256` (other companions, other padded lengths), the largest
  difference of any probability.
- Fashion-MNIST row by row: the IDX images as Parquet records (`label`, and `rows`: 28 lists of 28 pixels / 255;
  `mpitrain.testing.sequences.write_image_rows_parquet`), `mpitrain etl --sequence rows`, `mpiexec -n 2 mpitrain
  train configs/fashion_gru.yaml`, `mpitrain eval`.
- Speed, 2 ranks on this machine's cores: the motif LSTM and Conv1D models, 1 epoch of mpitrain's training steps
  beside PyTorch DDP (benchmarks/torch_ddp.py: gloo, 1 thread per rank, the same rows, batches, optimizer and
  clipping through `mpitrain.data.reader`; its LSTM packs the padded batch, benchmarks/torch_sequences.py says
  why), `--repeat` rounds taking turns, the median counts. Each engine's samples/s is also given as a fraction of
  this machine's single-core sgemm rate (numpy, one thread, measured in the same run): FLOPs per sample x samples/s
  / sgemm FLOP/s, the FLOPs counted from the layers' shapes and the train split's mean sequence length
  (`mpitrain.testing.flops` writes the formulas down).

Goals: LSTM and Conv1D test accuracy >= 0.95, their predictions within 1e-6 whatever the padding; the GRU's test
accuracy >= 0.888; mpitrain >= 1.0x PyTorch DDP's samples/s on both motif models.

    python benchmarks/sequences.py --out benchmarks/results          # about 15 minutes on 2 cores (9 with --repeat 1)
    python benchmarks/sequences.py --repeat 1 --skip-fashion         # the motifs and one speed round
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from types import SimpleNamespace

import h5py
import numpy as np
import yaml

from mpitrain.data.shards import read_manifest
from mpitrain.testing.flops import training_flops
from mpitrain.testing.launch import FASHION
from mpitrain.testing.sequences import motif_sequences, write_image_rows_parquet, write_parquet

from common import (
    HERE,
    in_turns,
    markdown_table,
    median_run,
    mpitrain,
    run_ddp,
    sgemm_rate,
    torch_available,
    train,
    write_results,
)

CONFIGS = os.path.join(os.path.dirname(HERE), "configs")
MOTIF_MODELS = {"LSTM": "motifs_lstm.yaml", "Conv1D": "motifs_conv1d.yaml"}
MOTIF_ACCURACY, PADDING, FASHION_ACCURACY, SPEED = 0.95, 1e-6, 0.888, 1.0
PREDICT_BATCHES = (1, 256)


def config_path(name: str) -> str:
    return os.path.join(CONFIGS, name)


def trained_accuracy(config: str, data: str, run_dir: str) -> dict:
    """`mpiexec -n 2 mpitrain train CONFIG` on `data`, then `mpitrain eval`: test accuracy, epochs and minutes."""
    started = time.perf_counter()
    summary = train(2, config, {"data.path": data, "run_dir": run_dir, "resume": "never"})
    minutes = (time.perf_counter() - started) / 60
    mpitrain("eval", run_dir, "--split", "test")
    with open(os.path.join(run_dir, "eval-test.json")) as f:
        accuracy = json.load(f)["accuracy"]
    return {"test_accuracy": accuracy, "epochs": summary["epochs"], "train_minutes": minutes,
            "samples_per_s": summary["samples_per_s"]}


def padding_difference(run_dir: str) -> float:
    """The largest difference of a test probability between `mpitrain predict` at PREDICT_BATCHES rows per batch."""
    probabilities = []
    for batch in PREDICT_BATCHES:
        out = os.path.join(run_dir, f"predictions-{batch}.h5")
        mpitrain("predict", run_dir, "--split", "test", "--batch-size", str(batch), "--out", out, ranks=2)
        with h5py.File(out) as f:
            probabilities.append(f["probabilities"][...].astype(np.float64))
    return float(np.abs(probabilities[0] - probabilities[1]).max())


def motif_data(work: str, train_rows: int, test_rows: int, lengths=(10, 200)) -> str:
    """The motif sequences of `lengths` steps as Parquet, through `mpitrain etl --sequence readings`: the dataset's
    folder."""
    parquet, name = {}, f"motifs-{lengths[0]}-{lengths[1]}"
    for split, rows, seed in (("train", train_rows, 0), ("test", test_rows, 1)):
        parquet[split] = os.path.join(work, f"{name}-{split}.parquet")
        write_parquet(parquet[split], *motif_sequences(rows, seed, lengths=lengths))
    data = os.path.join(work, name)
    mpitrain("etl", "--source", f"parquet:{parquet['train']}", "--test", parquet["test"], "--label", "label",
             "--sequence", "readings", "--out", data, "--shards", "2")
    return data


def fashion_data(work: str) -> str:
    """Fashion-MNIST's images as sequences of their rows in Parquet, through `mpitrain etl --sequence rows`."""
    parquet = {split: os.path.join(work, f"fashion-{split}.parquet") for split in ("train", "test")}
    for split, path in parquet.items():
        write_image_rows_parquet(path, FASHION, split)
    data = os.path.join(work, "fashion_rows")
    mpitrain("etl", "--source", f"parquet:{parquet['train']}", "--test", parquet["test"], "--label", "label",
             "--sequence", "rows", "--out", data, "--shards", "2")
    return data


def speed(data: str, repeat: int, models: dict[str, str] | None = None) -> dict:
    """Samples/s of mpitrain and PyTorch DDP, 1 epoch on 2 ranks, per model ({name: config file}; by default the
    motif models) on `data` (the median of `repeat` rounds), with FLOPs per sample and the fraction of one core's
    sgemm rate."""
    from torch_sequences import check_twins
    models = models or {model: config_path(name) for model, name in MOTIF_MODELS.items()}
    manifest = read_manifest(data)
    column = manifest.sequences[0]
    layers = {}
    for model, path in models.items():
        with open(path) as f:
            layers[model] = yaml.safe_load(f)["model"]["layers"]
    twins = check_twins(list(layers.values()), column["features"])  # the twins compute mpitrain's, else SystemExit
    mean_length = column["steps"]["train"] / manifest.rows("train")
    rate = sgemm_rate()
    engines = ("mpitrain", "pytorch-ddp", "pytorch-ddp compiled")
    runs = {(model, engine): [] for model in models for engine in engines}
    for _, (model, engine) in in_turns(tuple(runs), repeat):
        config = models[model]
        if engine == "mpitrain":  # in a fresh run directory each time
            summary = train(2, config, {"data.path": data, "resume": "never", "train.epochs": 1})
            runs[model, engine].append({"samples_per_s": summary["samples_per_s"]})
        elif engine == "pytorch-ddp":
            runs[model, engine].append(run_ddp(SimpleNamespace(data=data, config=config), 2, 1))
        else:  # torch.compile, default mode: a first epoch compiles and is not counted
            runs[model, engine].append(run_ddp(SimpleNamespace(data=data, config=config), 2, 2,
                                               ["--compile", "--warmup-epochs", "1"]))
    rows = []
    for model in models:
        flops = training_flops(layers[model], column["features"], mean_length)
        baseline, compiled = (median_run(runs[model, engine])["samples_per_s"] if runs[model, engine] else None
                              for engine in engines[1:])
        for engine in engines:
            if runs[model, engine]:
                per_s = median_run(runs[model, engine])["samples_per_s"]
                rows.append({"model": model, "engine": engine, "samples_per_s": per_s,
                             "vs_ddp": per_s / baseline if baseline else None,
                             "vs_ddp_compiled": per_s / compiled if compiled else None, "flops_per_sample": flops,
                             "gflop_per_s": flops * per_s / 1e9, "of_sgemm": flops * per_s / rate})
    return {"mean_length": mean_length, "sgemm_gflop_per_s": rate / 1e9, "repeat": repeat, "rows": rows,
            "twins_max_difference": twins}


def met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def markdown(result: dict) -> str:
    accuracy = []
    for row in result["accuracy"]:
        padding = row.get("padding_max_difference")
        accuracy.append([row["model"], f"`configs/{row['config']}`", row["data"], str(row["epochs"]),
                         f"{row['test_accuracy']:.4f}", f"{row['goal']}", met(row["test_accuracy"] >= row["goal"]),
                         "-" if padding is None else f"{padding:.1e}", "-" if padding is None else met(padding <= PADDING),
                         f"{row['train_minutes']:.1f}"])
    parts = [markdown_table(["model", "config", "data", "epochs", "test acc", "goal", "", "padding max diff",
                             f"<= {PADDING:g}", "minutes"], accuracy, "lllrrrlrlr")]
    if result.get("speed"):
        s = result["speed"]
        parts.append(markdown_table(
            ["model", "engine", "samples/s", "vs DDP", "vs DDP compiled", "FLOPs/sample", "GFLOP/s", "of sgemm"],
            [[r["model"], r["engine"], f"{r['samples_per_s']:.0f}", f"{r['vs_ddp']:.2f}x" if r["vs_ddp"] else "-",
              f"{r['vs_ddp_compiled']:.2f}x" if r.get("vs_ddp_compiled") else "-",
              f"{r['flops_per_sample'] / 1e6:.2f} M", f"{r['gflop_per_s']:.2f}", f"{r['of_sgemm']:.1%}"]
             for r in s["rows"]], "llrrrrrr"))
        parts.append(f"Speed: 2 ranks, 1 epoch of {result['motif_train_rows']} motif rows, the median of "
                     f"{s['repeat']} round(s) taking turns; goal mpitrain >= {SPEED:g}x PyTorch DDP (gloo, 1 thread "
                     "per rank, the same rows, batches, Adam and clipping; its LSTM over `pack_padded_sequence`), eager and "
                     "through `torch.compile` (default mode; one more epoch, first, compiles and is not counted). "
                     "FLOPs per sample: 3 x the forward's matrix products at the train split's mean length "
                     f"({s['mean_length']:.1f} steps; `mpitrain.testing.flops`); of sgemm: FLOPs per sample x "
                     f"samples/s / one core's numpy sgemm rate, {s['sgemm_gflop_per_s']:.1f} GFLOP/s, measured in "
                     "the same run (2 ranks on 2 cores: 200% would be both cores at that rate). The padding a batch "
                     "computes is not counted as work: mpitrain's LSTM runs every step of the batch's padded length, "
                     "PyTorch's packed one only the valid steps.")
    parts.append(f"Motifs: {result['motif_train_rows']} train and {result['motif_test_rows']} test sequences of "
                 "10-200 steps of 2 numbers, 4 classes (`mpitrain.testing.sequences.motif_sequences`), through "
                 "Parquet and `mpitrain etl --sequence readings`; padding: the largest difference of a test "
                 f"probability between `mpitrain predict --batch-size {PREDICT_BATCHES[0]}` and "
                 f"`--batch-size {PREDICT_BATCHES[1]}`. Fashion-MNIST: each image 28 steps of 28 pixels / 255 "
                 "through Parquet and `mpitrain etl --sequence rows` (all of one length: no padding to compare). "
                 "Accuracy from `mpitrain eval` on the test split; minutes of `mpiexec -n 2 mpitrain train`.")
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-rows", type=int, default=20_000, help="motif training sequences")
    parser.add_argument("--test-rows", type=int, default=4_000, help="motif test sequences")
    parser.add_argument("--repeat", type=int, default=3, help="speed rounds (0: no speed rows)")
    parser.add_argument("--skip-fashion", action="store_true", help="leave the GRU on Fashion-MNIST out")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    result = {"motif_train_rows": args.train_rows, "motif_test_rows": args.test_rows, "accuracy": []}
    with tempfile.TemporaryDirectory() as work:
        data = motif_data(work, args.train_rows, args.test_rows)
        for model, name in MOTIF_MODELS.items():
            run_dir = os.path.join(work, name.removesuffix(".yaml"))
            row = trained_accuracy(config_path(name), data, run_dir)
            result["accuracy"].append({"model": model, "config": name, "data": "motifs", "goal": MOTIF_ACCURACY,
                                       **row, "padding_max_difference": padding_difference(run_dir)})
        if not args.skip_fashion:
            row = trained_accuracy(config_path("fashion_gru.yaml"), fashion_data(work), os.path.join(work, "gru"))
            result["accuracy"].append({"model": "GRU", "config": "fashion_gru.yaml", "data": "Fashion-MNIST rows",
                                       "goal": FASHION_ACCURACY, **row})
        if args.repeat and torch_available():
            result["speed"] = speed(data, args.repeat)
    speed_rows = result.get("speed", {}).get("rows", [])
    result["met"] = bool(all(r["test_accuracy"] >= r["goal"] for r in result["accuracy"])
                         and all(r.get("padding_max_difference", 0) <= PADDING for r in result["accuracy"])
                         and all(r["vs_ddp"] >= SPEED for r in speed_rows if r["engine"] == "mpitrain"))
    write_results(args.out, "sequences", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
