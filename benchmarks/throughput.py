"""Throughput of the Fashion-MNIST MLP: samples/s per sync mode on 1 and 2 ranks, beside PyTorch DDP.

Every run uses the same config (configs/fashion_mlp.yaml: 784-500-500-10, SGD momentum 0.9,
batch 64 per rank), the same HDF5 shards and 1 thread per rank. PyTorch DDP (gloo, CPU)
runs in the same invocation when torch is installed, so ratios compare like with like.

Targets, 2 ranks on 2 cores, 1 epoch: `allreduce` >= 1.0x DDP's samples/s; `averaging`
(frequency 5) >= 1.5x DDP with test accuracy within 0.5 points of DDP's. With
`--accuracy-epochs 10`: the MLP reaches >= 0.895 test accuracy.

    python benchmarks/throughput.py --data data/fashion --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
RUNS = [(1, "none", {}), (1, "allreduce", {}), (1, "averaging", {"sync.frequency": 5}),
        (2, "none", {}), (2, "allreduce", {}), (2, "averaging", {"sync.frequency": 5})]


def run_mpitrain(args, ranks: int, mode: str, extra: dict, epochs: int) -> dict:
    """One `mpiexec -n RANKS mpitrain train` run; returns its summary.json."""
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = {"data.path": args.data, "run_dir": run_dir, "resume": "never", "train.epochs": epochs,
                     "sync.mode": mode, "train.log_every": 1000, **extra}
        command = [os.path.join(BIN, "mpiexec"), "-n", str(ranks), os.path.join(BIN, "mpitrain"), "train",
                   args.config, *[f"--set={k}={v}" for k, v in overrides.items()]]
        subprocess.run(command, check=True, env=ENV, capture_output=True, text=True)
        with open(os.path.join(run_dir, "summary.json")) as f:
            return json.load(f)


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("PyTorch is not installed (pip install torch==2.13.0): the DDP baseline is left out", file=sys.stderr)
        return False
    return True


def run_ddp(args, ranks: int, epochs: int) -> dict:
    out = subprocess.run([sys.executable, os.path.join(HERE, "torch_ddp.py"), "--data", args.data, "--config",
                          args.config, "--ranks", str(ranks), "--epochs", str(epochs)],
                         check=True, env=ENV, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def best_of(repeat: int, measure) -> dict:
    return max((measure() for _ in range(repeat)), key=lambda r: r["samples_per_s"])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/fashion")
    parser.add_argument("--config", default="configs/fashion_mlp.yaml")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2, help="runs per row; the fastest counts")
    parser.add_argument("--accuracy-epochs", type=int, default=10, help="0 skips the accuracy run")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)

    rows, with_ddp = [], torch_available()
    for ranks in (1, 2):
        ddp = best_of(args.repeat, lambda: run_ddp(args, ranks, args.epochs)) if with_ddp else None
        for n, mode, extra in RUNS:
            if n != ranks:
                continue
            s = best_of(args.repeat, lambda: run_mpitrain(args, n, mode, extra, args.epochs))
            rows.append({"engine": "mpitrain", "ranks": n, "mode": mode + (" (frequency 5)" if extra else ""),
                         "samples_per_s": s["samples_per_s"], "test_accuracy": s["test_accuracy"],
                         "bytes_sent_per_step": s["bytes_sent_per_step"],
                         "vs_ddp": s["samples_per_s"] / ddp["samples_per_s"] if ddp else None})
        if ddp:
            rows.append({"engine": "pytorch-ddp", "ranks": ranks, "mode": "DDP gloo",
                         "samples_per_s": ddp["samples_per_s"], "test_accuracy": ddp["test_accuracy"],
                         "bytes_sent_per_step": None, "vs_ddp": 1.0})
    result = {"epochs": args.epochs, "config": args.config, "rows": rows}
    if args.accuracy_epochs:
        s = run_mpitrain(args, 2, "allreduce", {}, args.accuracy_epochs)
        result["accuracy_run"] = {"ranks": 2, "mode": "allreduce", "epochs": args.accuracy_epochs,
                                  "test_accuracy": s["test_accuracy"], "samples_per_s": s["samples_per_s"]}
    table = markdown(result)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "throughput.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "throughput.md"), "w") as f:
        f.write(table)
    print(json.dumps(result, indent=2))
    print(table)
    return result


def markdown(result: dict) -> str:
    lines = [f"Fashion-MNIST MLP, {result['epochs']} epoch(s), batch 64 per rank, 1 thread per rank", "",
             "| engine | ranks | sync | samples/s | vs DDP | test acc | bytes/step/rank |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        ratio = f"{r['vs_ddp']:.2f}x" if r["vs_ddp"] else "-"
        sent = f"{r['bytes_sent_per_step']:.0f}" if r["bytes_sent_per_step"] is not None else "-"
        lines.append(f"| {r['engine']} | {r['ranks']} | {r['mode']} | {r['samples_per_s']:.0f} | {ratio} | "
                     f"{r['test_accuracy']:.4f} | {sent} |")
    if "accuracy_run" in result:
        a = result["accuracy_run"]
        lines += ["", f"Accuracy run: {a['ranks']} ranks, {a['mode']}, {a['epochs']} epochs: "
                      f"test accuracy {a['test_accuracy']:.4f}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
