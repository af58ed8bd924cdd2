"""Throughput on Fashion-MNIST: samples/s per sync mode of the MLP (1 and 2 ranks) and LeNet (2 ranks), beside PyTorch DDP.

Every run of a model uses the same config (configs/fashion_mlp.yaml: 784-500-500-10;
configs/fashion_lenet.yaml: DL4J's LeNet; SGD momentum 0.9) at batch 64 per rank (LeNet's config
trains at 32 for accuracy; here it runs at DL4J's 64, DDP too) and the same HDF5 shards.
mpitrain starts exactly as the README's commands start it, with no thread variable: it sizes its
thread pools itself (mpitrain/base/threads.py). Beside the default overlapped `allreduce` row, one
row runs it with every pool pinned to 1 thread by hand (the "threads pinned" row, as these
benchmarks ran everything until 2026-11): a default row falling behind it is a regression of
the sizing. PyTorch DDP gets OMP_NUM_THREADS=1 per process, as torchrun gives it. PyTorch DDP (gloo, CPU) on the same model runs in the
same invocation when torch is installed, so ratios compare like with like, twice: eager, and through
`torch.compile` in its default mode (`torch_ddp.py --compile`: one more epoch, the first, compiles and is not
counted), the honest peer of PyTorch 2. Every mpitrain row gives both ratios. The engines take
turns (`--repeat` rounds) and each row is the median, so the machine's drift reaches every
engine alike.

`allreduce` runs twice: blocking (one Allreduce after backward) and overlapped (buckets posted
during backward, the default). Each mpitrain row also has a short traced run (`train.trace_allocations`)
giving the bytes a step allocates after warm-up: the column shows no step allocates an array.

Targets, 2 ranks on 2 cores, 1 epoch, default environment. MLP: 1 rank >= 1.8x PyTorch; `allreduce` >= 1.0x
DDP's samples/s, overlapped >= 2.0x, within 10% of the pinned row; `make demo`'s samples/s within 10% of the
overlapped row;
`averaging` (frequency 5) >= 1.5x DDP with test accuracy within 0.5 points of DDP's. With
`--accuracy-epochs 10`: the MLP reaches >= 0.895 test accuracy. LeNet: `allreduce` >= 1.1x
DDP (1.5x is the sequences issue's), `sharing` or `averaging` >= 1.0x.

`--backend cupy` measures one GPU instead: the MLP at batch 256 and LeNet at batch 64, 1 rank
with `backend: cupy`, beside PyTorch CUDA (no DDP) on the same model, rows and batch, taking
turns the same way; results in `throughput_gpu.json`. Each engine first trains one warm-up
epoch that is not counted (cupy compiles or loads its kernels at their first launch, PyTorch
sets up cuBLAS and its caching allocator), then `--epochs` counted ones. Targets: MLP >= 1.0x
PyTorch, LeNet >= 0.8x. Without a GPU it stops at once, saying so.

    python benchmarks/throughput.py --data data/fashion --out benchmarks/results
    python benchmarks/throughput.py --data data/fashion --out benchmarks/results --backend cupy
"""
from __future__ import annotations

import argparse
import sys

from mpitrain.parallel.backend import gpu_available

from common import (
    PINNED_ENV,
    benchmark_parser,
    markdown_table,
    median_run,
    run_ddp,
    run_mpitrain,
    torch_available,
    write_results,
)

PINNED_KEY = "threads pinned"  # not a config key: the row runs in PINNED_ENV
AVERAGING = ("averaging", {"sync.frequency": 5})
BLOCKING = ("allreduce", {"sync.overlap": False})
PINNED = ("allreduce", {PINNED_KEY: True})  # overlapped allreduce with every pool pinned to 1 thread by hand
MODELS = {  # model: (config, [(ranks, mode, config overrides)])
    "MLP": ("configs/fashion_mlp.yaml", [(1, "none", {}), (1, "allreduce", {}), (1, *AVERAGING),
                                         (2, "none", {}), (2, *BLOCKING), (2, "allreduce", {}), (2, *PINNED),
                                         (2, *AVERAGING)]),
    "LeNet": ("configs/fashion_lenet.yaml", [(2, *BLOCKING), (2, "allreduce", {}), (2, *PINNED), (2, *AVERAGING),
                                             (2, "sharing", {})]),
}
BATCH = 64  # per rank, every CPU row and its DDP twin
TRACED_ROWS = 4096  # rows of the short run that measures allocations per step
GPU_MODELS = {"MLP": ("configs/fashion_mlp.yaml", 256), "LeNet": ("configs/fashion_lenet.yaml", 64)}  # (config, batch)


def label(mode: str, extra: dict) -> str:
    """A row's sync column: the mode, and what its overrides change."""
    if "sync.frequency" in extra:
        return f"{mode} (frequency {extra['sync.frequency']})"
    if mode == "allreduce":
        pinned = ", threads pinned" if extra.get(PINNED_KEY) else ""
        return f"{mode} ({'overlapped' if extra.get('sync.overlap', True) else 'blocking'}{pinned})"
    return mode


def measure(args, ranks: int, mode: str, extra: dict, epochs: int) -> dict:
    """One run of a row: in this process's environment, or in PINNED_ENV for a pinned row."""
    overrides = {k: v for k, v in extra.items() if k != PINNED_KEY}
    return run_mpitrain(args, ranks, mode, overrides, epochs, env=PINNED_ENV if extra.get(PINNED_KEY) else None)


def main(argv=None) -> dict:
    parser = benchmark_parser(__doc__, epochs=1)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per row; the median counts")
    parser.add_argument("--accuracy-epochs", type=int, default=10, help="MLP accuracy run; 0 skips it")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy",
                        help="cupy: one GPU against PyTorch CUDA (throughput_gpu.json)")
    args = parser.parse_args(argv)
    if args.backend == "cupy":
        return gpu_main(args)

    rows, with_ddp = [], torch_available()
    for model in args.models:
        config, runs = MODELS[model]
        model_args = argparse.Namespace(**{**vars(args), "config": config})
        for ranks in sorted({n for n, _, _ in runs}):
            rows += model_rows(model, model_args, ranks, [run for run in runs if run[0] == ranks], with_ddp)
    result = {"epochs": args.epochs, "repeat": args.repeat, "rows": rows}
    if args.accuracy_epochs and "MLP" in args.models:
        s = run_mpitrain(argparse.Namespace(**{**vars(args), "config": MODELS["MLP"][0]}), 2, "allreduce", {},
                         args.accuracy_epochs)
        result["accuracy_run"] = {"ranks": 2, "mode": "allreduce", "epochs": args.accuracy_epochs,
                                  "test_accuracy": s["test_accuracy"], "samples_per_s": s["samples_per_s"]}
    write_results(args.out, "throughput", result, markdown(result))
    return result


def model_rows(model: str, args, ranks: int, runs: list, with_ddp: bool) -> list[dict]:
    """One row per run of `model` on `ranks` ranks, and DDP's; interleaved repeats, the median each.

    The machine's speed drifts; taking turns lets every engine see the drift alike.
    """
    measures = {label(mode, extra): [] for _, mode, extra in runs}
    ddp_runs, compiled_runs = [], []
    for _ in range(args.repeat):
        if with_ddp:
            ddp_runs.append(run_ddp(args, ranks, args.epochs, ["--batch-size", str(BATCH)]))
            compiled_runs.append(run_ddp(args, ranks, args.epochs + 1, ["--batch-size", str(BATCH), "--compile",
                                                                        "--warmup-epochs", "1"]))
        for n, mode, extra in runs:
            measures[label(mode, extra)].append(measure(args, n, mode, {"train.batch_size": BATCH, **extra},
                                                        args.epochs))
    ddp = median_run(ddp_runs) if with_ddp else None
    compiled = median_run(compiled_runs) if with_ddp else None
    rows = []
    for n, mode, extra in runs:
        s = median_run(measures[label(mode, extra)])
        rows.append({"model": model, "engine": "mpitrain", "ranks": n,
                     "mode": label(mode, extra), "samples_per_s": s["samples_per_s"],
                     "test_accuracy": s["test_accuracy"], "bytes_sent_per_step": s["bytes_sent_per_step"],
                     "allocated_bytes_per_step": allocated_per_step(args, n, mode, extra),
                     "vs_ddp": s["samples_per_s"] / ddp["samples_per_s"] if ddp else None,
                     "vs_ddp_compiled": s["samples_per_s"] / compiled["samples_per_s"] if ddp else None})
    if ddp:
        for mode, run in (("DDP gloo", ddp), ("DDP gloo, torch.compile", compiled)):
            rows.append({"model": model, "engine": "pytorch-ddp", "ranks": ranks, "mode": mode,
                         "samples_per_s": run["samples_per_s"], "test_accuracy": run["test_accuracy"],
                         "bytes_sent_per_step": None, "vs_ddp": run["samples_per_s"] / ddp["samples_per_s"],
                         "vs_ddp_compiled": run["samples_per_s"] / compiled["samples_per_s"]})
    return rows


def allocated_per_step(args, ranks: int, mode: str, extra: dict) -> int:
    """The most bytes any step after the first two allocated (tracemalloc: numpy's arrays and Python's objects), in a
    separate short run with `train.trace_allocations` (tracing slows Python, so never in a timed run)."""
    traced = measure(args, ranks, mode, {"train.batch_size": BATCH, **extra, "train.trace_allocations": True,
                                         "data.max_rows": TRACED_ROWS}, 1)
    return traced["allocated_bytes"]["step"]


def gpu_main(args) -> dict:
    """One GPU: mpitrain `backend: cupy` (1 rank) beside PyTorch CUDA, interleaved, the median of each."""
    if not gpu_available():
        sys.exit("throughput.py --backend cupy: no CUDA GPU here (cupy is missing or cupy.is_available() is "
                 "False); nothing was measured. Install mpitrain[gpu] on a GPU machine.")
    with_torch = torch_available() and _torch_cuda()
    rows = []
    for model in args.models:
        config, batch = GPU_MODELS[model]
        model_args = argparse.Namespace(**{**vars(args), "config": config})
        ours, theirs = [], []
        for _ in range(args.repeat):
            if with_torch:
                theirs.append(run_ddp(model_args, 1, args.epochs + 1, ["--device", "cuda", "--batch-size", str(batch),
                                                                      "--warmup-epochs", "1"]))
            ours.append(after_warmup(run_mpitrain(model_args, 1, "none", {"backend": "cupy", "train.batch_size": batch},
                                                  args.epochs + 1)))
        s, torch_run = median_run(ours), median_run(theirs) if theirs else None
        rows.append({"model": model, "engine": "mpitrain cupy", "batch": batch, "samples_per_s": s["samples_per_s"],
                     "test_accuracy": s["test_accuracy"], "transfers": s["transfers"],
                     "vs_torch": s["samples_per_s"] / torch_run["samples_per_s"] if torch_run else None})
        if torch_run:
            rows.append({"model": model, "engine": "pytorch cuda", "batch": batch, **torch_run, "vs_torch": 1.0})
    result = {"epochs": args.epochs, "repeat": args.repeat, "rows": rows}
    table = (f"Fashion-MNIST on one GPU, 1 rank, {args.epochs} epoch(s) counted after 1 warm-up epoch; each row the "
             f"median of {args.repeat} runs, interleaved with PyTorch's; targets: MLP >= 1.0x, LeNet >= 0.8x PyTorch\n\n"
             + markdown_table(["model", "engine", "batch", "samples/s", "vs PyTorch", "test acc"],
                              [[r["model"], r["engine"], str(r["batch"]), f"{r['samples_per_s']:.0f}",
                                f"{r['vs_torch']:.2f}x" if r["vs_torch"] else "-", f"{r['test_accuracy']:.4f}"]
                               for r in rows], "llrrrr") + "\n")
    write_results(args.out, "throughput_gpu", result, table)
    return result


def after_warmup(summary: dict) -> dict:
    """`summary` with samples/s over the epochs after the first (from its metrics windows)."""
    counted = [w for w in summary["windows"] if w["epoch"] > 0]
    seconds = sum(w["samples"] / w["samples_per_s"] for w in counted)
    return {**summary, "samples_per_s": sum(w["samples"] for w in counted) / seconds}


def _torch_cuda() -> bool:
    import torch
    if not torch.cuda.is_available():
        print("PyTorch has no CUDA here (a CPU build?): the PyTorch CUDA baseline is left out", file=sys.stderr)
    return torch.cuda.is_available()


def markdown(result: dict) -> str:
    rows = [[r["model"], r["engine"], str(r["ranks"]), r["mode"], f"{r['samples_per_s']:.0f}",
             f"{r['vs_ddp']:.2f}x" if r["vs_ddp"] else "-",
             f"{r['vs_ddp_compiled']:.2f}x" if r.get("vs_ddp_compiled") else "-", f"{r['test_accuracy']:.4f}",
             f"{r['bytes_sent_per_step']:.0f}" if r["bytes_sent_per_step"] is not None else "-",
             f"{r['allocated_bytes_per_step']:.0f}" if r.get("allocated_bytes_per_step") is not None else "-"]
            for r in result["rows"]]
    lines = [f"Fashion-MNIST, {result['epochs']} epoch(s), batch 64 per rank; each row the median of "
             f"{result['repeat']} runs, interleaved with the other engines. mpitrain runs in the default environment "
             "(no thread variable: it sizes its pools itself) except the rows marked 'threads pinned' "
             "(OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS=1, set by hand); PyTorch DDP with OMP_NUM_THREADS=1 per process, "
             "as torchrun starts it. The torch.compile rows train one more epoch, first, that compiles and is not "
             "counted: their test accuracy is after one more epoch than the others'.", "",
             markdown_table(["model", "engine", "ranks", "sync", "samples/s", "vs DDP", "vs DDP compiled", "test acc",
                             "bytes/step/rank", "allocated/step"], rows, "llrlrrrrrr"),
             "", "allocated/step: the most bytes a step after the first two allocated on any rank (tracemalloc, in a "
                 f"separate {TRACED_ROWS}-row run): Python objects only, no array (a step writes into the model's "
                 "workspace); PyTorch's allocator is not traced (-)."]
    if "accuracy_run" in result:
        a = result["accuracy_run"]
        lines += ["", f"Accuracy run: {a['ranks']} ranks, {a['mode']}, {a['epochs']} epochs: "
                      f"test accuracy {a['test_accuracy']:.4f}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
