"""The residual net on Fashion-MNIST (issue 32's reference results): configs/fashion_resnet.yaml trained on 2 ranks
as the README's command starts it (`mpiexec -n 2 mpitrain train`, the user's environment), its test accuracy after the
config's epochs (goal >= 0.93), and its training speed beside PyTorch DDP on the same graph (goal >= 1.0x;
benchmarks/torch_graph.py: gloo, 1 thread per rank, the same rows, batches and SGD; both without the config's flips
and shifts), also as a fraction of this
machine's one-core sgemm rate (FLOPs per sample x samples/s / sgemm FLOP/s; `mpitrain.testing.flops`).

Speed: one epoch of the first `--speed-rows` rows per run, mpitrain and DDP taking turns, the median of `--repeat`
rounds; on a quiet machine. Accuracy: one run of the whole config (an hour on this 2-core machine). `--skip-speed` or
`--skip-accuracy` measures one part and keeps the other's last result in OUT/resnet.json.

    python benchmarks/resnet.py --data data/fashion --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import os
import time
from types import SimpleNamespace

import yaml

from mpitrain.testing.flops import image_graph_training_flops

from common import (
    HERE,
    in_turns,
    machine,
    markdown_table,
    median_run,
    run_ddp,
    sgemm_rate,
    torch_available,
    train,
    write_results,
)

CONFIG = os.path.join(os.path.dirname(HERE), "configs", "fashion_resnet.yaml")
ACCURACY, SPEED = 0.93, 1.0


def accuracy(data: str) -> dict:
    with open(CONFIG) as f:
        epochs = yaml.safe_load(f)["train"]["epochs"]
    started = time.perf_counter()
    summary = train(2, CONFIG, {"data.path": data, "resume": "never"})
    return {"measured": machine()["date"], "epochs": epochs, "test_accuracy": summary["test_accuracy"],
            "samples_per_s": summary["samples_per_s"],
            "train_minutes": (time.perf_counter() - started) / 60, "goal": ACCURACY,
            "met": summary["test_accuracy"] >= ACCURACY}


def speed(data: str, rows: int, repeat: int) -> dict:
    with open(CONFIG) as f:
        flops = image_graph_training_flops(yaml.safe_load(f)["model"]["graph"], (1, 28, 28))
    rate = sgemm_rate()
    runs = {"mpitrain": [], "pytorch-ddp": []}
    for _, engine in in_turns(tuple(runs), repeat):
        if engine == "mpitrain":
            summary = train(2, CONFIG, {"data.path": data, "resume": "never", "train.epochs": 1, "data.max_rows": rows,
                                        "data.augment": False})  # the PyTorch twin trains on the rows as stored
            runs[engine].append({"samples_per_s": summary["samples_per_s"]})
        else:
            runs[engine].append(run_ddp(SimpleNamespace(data=data, config=CONFIG), 2, 1, ["--max-rows", str(rows)]))
    baseline = median_run(runs["pytorch-ddp"])["samples_per_s"]
    table = []
    for engine, measured in runs.items():
        per_s = median_run(measured)["samples_per_s"]
        table.append({"engine": engine, "samples_per_s": per_s, "vs_ddp": per_s / baseline,
                      "gflop_per_s": flops * per_s / 1e9, "of_sgemm": flops * per_s / rate})
    return {"measured": machine()["date"], "rows": rows, "repeat": repeat, "flops_per_sample": flops, "sgemm_gflop_per_s": rate / 1e9,
            "goal": SPEED, "met": table[0]["vs_ddp"] >= SPEED, "engines": table}


def markdown(result: dict) -> str:
    parts = []
    if result.get("accuracy"):
        a = result["accuracy"]
        parts.append(markdown_table(["model", "ranks", "epochs", "test accuracy", "goal", "", "minutes"],
                                    [["residual net (`configs/fashion_resnet.yaml`)", "2", str(a["epochs"]),
                                      f"{a['test_accuracy']:.4f}", f">= {a['goal']}",
                                      "met" if a["met"] else "**not met**", f"{a['train_minutes']:.1f}"]],
                                    "lrrrrlr"))
        if a.get("measured"):  # each part keeps the date it was measured (the other may be re-measured alone)
            parts.append(f"Accuracy measured {a['measured']}.")
    if result.get("speed"):
        s = result["speed"]
        parts.append(markdown_table(
            ["engine", "samples/s", "vs DDP", "GFLOP/s", "of sgemm"],
            [[r["engine"], f"{r['samples_per_s']:.0f}", f"{r['vs_ddp']:.2f}x", f"{r['gflop_per_s']:.1f}",
              f"{r['of_sgemm']:.1%}"] for r in s["engines"]], "lrrrr"))
        parts.append(f"Speed: 2 ranks, 1 epoch of the first {s['rows']} training rows as stored (no `data.augment`: the "
                     f"PyTorch twin does not augment), the median of {s['repeat']} "
                     f"round(s) taking turns; goal mpitrain >= {s['goal']:g}x PyTorch DDP "
                     f"({'met' if s['met'] else '**not met**'}). FLOPs per sample "
                     f"{s['flops_per_sample'] / 1e6:.1f} M (3 x the forward's convolutions and dense products, the "
                     "convolutions counted as direct ones for both engines: mpitrain's 3x3 layers run Winograd's "
                     "F(2x2, 3x3), 4/9 of those multiplications, so its share can pass 100%); of "
                     f"sgemm: FLOPs per sample x samples/s / one core's sgemm rate ({s['sgemm_gflop_per_s']:.1f} "
                     "GFLOP/s, numpy, 1 thread), for 2 ranks on 2 cores."
                     + (f" Measured {s['measured']}." if s.get("measured") else ""))
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/fashion")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--speed-rows", type=int, default=6400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-accuracy", action="store_true")
    args = parser.parse_args(argv)
    previous = {}
    if os.path.exists(os.path.join(args.out, "resnet.json")):
        with open(os.path.join(args.out, "resnet.json")) as f:
            previous = json.load(f)
    result = {"config": "configs/fashion_resnet.yaml", "ranks": 2,
              "speed": previous.get("speed") if args.skip_speed or not torch_available() else
              speed(args.data, args.speed_rows, args.repeat),
              "accuracy": previous.get("accuracy") if args.skip_accuracy else accuracy(args.data)}
    write_results(args.out, "resnet", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
