"""The GPU check (issue 50): one command on a GPU machine verifies, measures and reports, within a short lease.

Steps, each a subprocess with its own timeout, so one failure is recorded and the next step still runs; a step that
would start past `--budget` seconds is recorded as left out, so the table is always printed:

1. the machine: GPU, driver and the versions of the Python packages that matter;
2. every GPU test: tests/system/test_gpu.py, test_gpu_graphs.py and the cupy cases of tests/unit/parallel/test_backend.py;
3. 2 ranks sharing the GPU (`mpiexec -n 2`, collectives staged through host memory with pip's MPICH), one epoch
   each of the MLP, LeNet, the batch-norm CNN, an LSTM, an embedding-table graph and a transformer;
4. throughput on 1 rank: the MLP at batch 256, LeNet at batch 64 and the LSTM beside PyTorch CUDA eager on the same
   rows and batch, taking turns, one warm-up epoch not counted; the embedding graph on its own (PyTorch's twin in
   benchmarks/torch_ddp.py has no binary loss); each engine's host CPU time per step (its training thread's: on a
   GPU, mostly the time spent launching kernels).

The GPU machine has no Spark and reaches no package registry: `make gpu-pack` puts what it lacks into .gpu/ here
(wheels: pip's MPICH, numpy < 2.5 for numba-cuda, hdf5plugin's lz4 and zstd filters, nvmath-python and cuda-core
where missing; Fashion-MNIST's IDX files, the training images cut to fit the lease's 64 MiB), benchmarks/gpu_check.sh
installs them there, and the datasets are written with the real shard writer (mpitrain.testing), not the ETL.
mpitrain itself starts as the README starts it.

    python benchmarks/gpu_check.py --dry-run      # on a CPU: every step on numpy and PyTorch's CPU, a few rows
    bash benchmarks/gpu_check.sh                  # on a GPU machine (make gpu-check)

Without a GPU and without --dry-run it stops at once, saying so. Results: OUT/gpu_check.json, OUT/gpu_check.md and
one log per step in OUT/logs (gpu_check.sh packs them into OUT/logs.tgz: a lease brings back 8 files at most); the
table is printed last.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time

from embeddings import GRAPH

from mpitrain.data.shards import read_manifest
from mpitrain.parallel.backend import gpu_available
from mpitrain.testing.datasets import make_click_dataset, make_fashion_dataset
from mpitrain.testing.sequences import make_fashion_rows_dataset, make_sequence_dataset

from common import BIN, HERE, markdown_table, write_results
from common import machine as common_machine

REPO = os.path.dirname(HERE)
TARGETS = {"MLP": 1.2, "LeNet": 1.0}  # samples/s beside PyTorch CUDA eager's (issue 50)
GPU_TESTS = ["tests/system/test_gpu.py", "tests/system/test_gpu_graphs.py", "tests/unit/parallel/test_backend.py"]
PACKAGES = ["numpy", "cupy-cuda13x", "cupy-cuda12x", "numba", "numba-cuda", "torch", "mpi4py", "mpich", "h5py",
            "hdf5plugin", "onnxruntime", "nvmath-python", "cuda-core", "cuda-bindings"]
CLICK_IDS = (1000, 100_000)
# model: (config, dataset, overrides of the two-rank run); every run trains 1 epoch
TWO_RANK_MODELS = {
    "MLP": ("configs/fashion_mlp.yaml", "fashion", {}),
    "LeNet": ("configs/fashion_lenet.yaml", "fashion", {}),
    "batch-norm CNN": ("configs/fashion_cnn_bn.yaml", "fashion", {}),
    "LSTM": ("configs/motifs_lstm.yaml", "motifs", {}),
    "embedding graph": ("clicks", "clicks", {}),
    "transformer": ("configs/fashion_transformer.yaml", "fashion_rows", {"optimizer.schedule.warmup": 4}),
}
# model: (config, dataset, batch, beside PyTorch CUDA)
ONE_RANK_MODELS = {
    "MLP": ("configs/fashion_mlp.yaml", "fashion", 256, True),
    "LeNet": ("configs/fashion_lenet.yaml", "fashion", 64, True),
    "LSTM": ("configs/motifs_lstm.yaml", "motifs", 64, True),
    "embedding graph": ("clicks", "clicks", 256, False),
}


class Steps:
    """The check's steps in turn: each one's outcome, log and figures, and the time left."""

    def __init__(self, logs: str, budget: float):
        self.logs, self.deadline = logs, time.monotonic() + budget
        os.makedirs(logs, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, command: list[str], timeout: float) -> tuple[bool, str, str]:
        """Run `command`, its output to LOGS/<name>.log; (passed, the line saying what went wrong, the output)."""
        timeout = min(timeout, self.left())
        if timeout < 10:
            return False, "left out: the check's time budget was spent", ""
        log, started = os.path.join(self.logs, f"{slug(name)}.log"), time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
            output, passed = done.stdout + done.stderr, done.returncode == 0
            reason = "" if passed else last_error(output, done.returncode)
        except subprocess.TimeoutExpired as stopped:  # its output so far comes as bytes, text=True or not
            output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part
                             for part in (stopped.stdout or "", stopped.stderr or ""))
            passed, reason = False, f"timed out after {timeout:.0f} s"
        with open(log, "w") as f:
            f.write(" ".join(command) + "\n\n" + output)
        print(f"{name}: {'passed' if passed else reason} ({time.monotonic() - started:.0f} s)", flush=True)
        return passed, reason, output


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def last_error(output: str, status: int) -> str:
    """The line that says what went wrong: pytest's summary, else the last line naming an error, else the last."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if " failed" in line or " passed" in line and "=" in line:
            return line.strip("= ")
    for line in reversed(lines):
        if "Error" in line or "error:" in line:
            return line[:300]
    return (lines[-1][:300] if lines else "") + f" (exit {status})"


def machine(backend: str) -> dict:
    """Where and with what the check ran: common.machine()'s fields (the README's tables print them), the versions of
    the packages that matter on a GPU, and the GPU and driver as nvidia-smi names them."""
    found = common_machine()
    for package in PACKAGES:
        try:
            found["versions"][package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        found["gpu"] = smi.stdout.strip().replace(", ", ", driver ") or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired):
        found["gpu"] = "no GPU"
    return {**found, "backend": backend}


def write_datasets(work: str, fashion: str, limit: int | None) -> dict[str, str]:
    """The check's datasets, with the real shard writer: Fashion-MNIST as images and as sequences of rows, the LSTM's
    motifs, and the click table of the embedding graph; {name: folder}."""
    paths = {name: os.path.join(work, name) for name in ("fashion", "fashion_rows", "motifs", "clicks")}
    make_fashion_dataset(paths["fashion"], fashion, limit)
    make_fashion_rows_dataset(paths["fashion_rows"], fashion, limit)
    rows = limit or 20_000
    make_sequence_dataset(paths["motifs"], n_train=rows // 2, n_test=rows // 10)
    make_click_dataset(paths["clicks"], n_train=rows, n_test=rows // 4, ids=CLICK_IDS)
    return paths


def click_config(work: str) -> str:
    """The embedding graph's config (benchmarks/embeddings.py's graph: a 16-wide embedding per id column, the
    numeric columns, a hidden layer; a click probability), with an ordinary learning rate."""
    path = os.path.join(work, "clicks.yaml")
    with open(path, "w") as f:
        json.dump({"data": {"path": "unset"}, "model": {"graph": GRAPH, "loss": "binary_cross_entropy"},
                   "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9}, "train": {"epochs": 1, "batch_size": 64},
                   "report": False}, f)
    return path


def train_command(ranks: int, config: str, settings: dict) -> list[str]:
    """`mpiexec -n RANKS mpitrain train CONFIG --set ...`, as the README starts it."""
    return [os.path.join(BIN, "mpiexec"), "-n", str(ranks), os.path.join(BIN, "mpitrain"), "train", config,
            *[f"--set={k}={v}" for k, v in settings.items()]]


def read_summary(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        summary["windows"] = [r for r in map(json.loads, f) if r["kind"] == "window"]
    return summary


def mpitrain_run(steps: Steps, name: str, ranks: int, config: str, settings: dict, timeout: float) -> dict:
    """One training run in a fresh run directory: its outcome and figures (samples/s and host CPU per step after the
    first epoch when it trained more than one, test accuracy, staged bytes per step)."""
    with tempfile.TemporaryDirectory() as run_dir:
        settings = {"run_dir": run_dir, "resume": "never", "report": False, **settings}
        passed, reason, _ = steps.run(name, train_command(ranks, config, settings), timeout)
        row = {"step": name, "passed": passed, "reason": reason}
        if not passed:
            return row
        summary = read_summary(run_dir)
    counted = [w for w in summary["windows"] if w["epoch"] > 0] or summary["windows"]
    seconds = sum(w["samples"] / w["samples_per_s"] for w in counted)
    samples = sum(w["samples"] for w in counted)
    return {**row, "samples_per_s": samples / seconds if seconds else summary["samples_per_s"],
            "test_accuracy": summary.get("test_accuracy"), "staged_bytes_per_step": summary.get("staged_bytes_per_step"),
            "host_cpu_ms_per_step": sum(w["host_cpu_ms_per_step"] * w["samples"] for w in counted) / samples,
            "transfers": summary.get("transfers"), "cuda_graphs": summary.get("cuda_graphs")}


def torch_run(steps: Steps, name: str, config: str, data: str, batch: int, device: str, timeout: float) -> dict:
    """PyTorch eager on the same config, rows and batch (benchmarks/torch_ddp.py, 1 process), one warm-up epoch."""
    command = [sys.executable, os.path.join(HERE, "torch_ddp.py"), "--data", data, "--config", config, "--ranks", "1",
               "--epochs", "2", "--device", device, "--batch-size", str(batch), "--warmup-epochs", "1"]
    passed, reason, output = steps.run(name, command, timeout)
    row = {"step": name, "passed": passed, "reason": reason}
    if passed:
        result = json.loads(output.strip().splitlines()[-1])
        row.update(samples_per_s=result["samples_per_s"], test_accuracy=result["test_accuracy"],
                   host_cpu_ms_per_step=result["host_cpu_ms_per_step"])
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fashion", default=os.environ.get("FASHION", "/usr/share/datasets/fashion-mnist"),
                        help="Fashion-MNIST's IDX folder (on the GPU machine: .gpu/fashion, from make gpu-pack)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/gpu-check")
    parser.add_argument("--budget", type=float, default=420, help="seconds; steps that would start later are left out")
    parser.add_argument("--repeat", type=int, default=2, help="turns of each throughput row; the median counts")
    parser.add_argument("--models", nargs="+", choices=list(TWO_RANK_MODELS), default=list(TWO_RANK_MODELS),
                        help="the models of the training steps (default: all)")
    parser.add_argument("--dry-run", action="store_true",
                        help="on a CPU: every step on numpy and PyTorch's CPU with a few rows, to check the script")
    parser.add_argument("--rows", type=int, default=2000, help="with --dry-run: the rows of each split")
    args = parser.parse_args(argv)
    if not args.dry_run and not gpu_available():
        print("gpu_check: no GPU here (cupy is missing or cupy.is_available() is False); nothing was run. "
              "On a CPU, `python benchmarks/gpu_check.py --dry-run` checks the script.", file=sys.stderr)
        return 2
    backend, device = ("numpy", "cpu") if args.dry_run else ("cupy", "cuda")
    limit, two_rank_rows = (args.rows, args.rows // 2) if args.dry_run else (None, 8192)
    steps = Steps(os.path.join(args.out, "logs"), args.budget)
    result = {"machine": machine(backend), "dry_run": args.dry_run, "steps": []}
    print(json.dumps(result["machine"]), flush=True)

    passed, reason, _ = steps.run("gpu tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                "-rfE", f"--junitxml={steps.logs}/gpu-tests.xml", "--tb=short", *GPU_TESTS], 300)
    result["steps"].append({"step": "gpu tests", "passed": passed, "reason": reason})

    with tempfile.TemporaryDirectory() as work:
        data = write_datasets(work, args.fashion, limit)
        result["rows"] = {name: read_manifest(path).rows("train") for name, path in data.items()}
        configs = {"clicks": click_config(work)}
        for model, (config, dataset, extra) in ((m, TWO_RANK_MODELS[m]) for m in args.models):
            row = mpitrain_run(steps, f"2 ranks {model}", 2, configs.get(config, config),
                               {"backend": backend, "data.path": data[dataset], "train.epochs": 1,
                                "data.max_rows": two_rank_rows, **extra}, 150)
            result["steps"].append(row)
        for turn in range(args.repeat):
            for model, (config, dataset, batch, beside_torch) in ((m, ONE_RANK_MODELS[m]) for m in args.models
                                                                 if m in ONE_RANK_MODELS):
                settings = {"backend": backend, "data.path": data[dataset], "train.epochs": 2,
                            "train.batch_size": batch, "train.log_every": 100, "data.max_rows": limit or 30_000}
                rows = [mpitrain_run(steps, f"1 rank {model} mpitrain {turn}", 1, configs.get(config, config),
                                     settings, 120)]
                if beside_torch:
                    rows.append(torch_run(steps, f"1 rank {model} pytorch {turn}", config, data[dataset], batch,
                                          device, 120))
                result["steps"] += [{**row, "model": model, "batch": batch, "turn": turn} for row in rows]
    result["throughput"] = throughput_rows(result["steps"])
    write_results(args.out, "gpu_check", result, report(result), measured_on=result["machine"])
    return 0 if all(step["passed"] for step in result["steps"]) else 1


def throughput_rows(steps: list[dict]) -> list[dict]:
    """One row per model and engine of the 1-rank runs: the median of its turns, and the ratio to PyTorch's."""
    groups = {}
    for step in (s for s in steps if "turn" in s and s["passed"]):
        groups.setdefault((step["model"], "pytorch" if "pytorch" in step["step"] else "mpitrain"), []).append(step)
    rows = []
    for (model, engine), runs in groups.items():
        middle = sorted(runs, key=lambda r: r["samples_per_s"])[len(runs) // 2]
        rows.append({"model": model, "engine": engine, "batch": middle["batch"], "runs": len(runs),
                     "samples_per_s": middle["samples_per_s"], "test_accuracy": middle.get("test_accuracy"),
                     "host_cpu_ms_per_step": middle.get("host_cpu_ms_per_step"),
                     "cuda_graphs": middle.get("cuda_graphs")})
    for row in rows:
        torch = next((r for r in rows if r["model"] == row["model"] and r["engine"] == "pytorch"), None)
        row["vs_torch"] = row["samples_per_s"] / torch["samples_per_s"] if torch else None
    return rows


def report(result: dict) -> str:
    """The check as Markdown: the throughput rows first (the README's headline copies that table), then every step's
    outcome."""
    gpu = result["machine"]["gpu"]
    head = (f"Fashion-MNIST ({result['rows']['fashion']} training images), LSTM motifs and a click table on {gpu}"
            f"{' (a dry run: numpy and PyTorch on the CPU)' if result['dry_run'] else ''}: 1 rank, 2 epochs of which "
            f"the first is not counted, each row the median of its turns beside PyTorch CUDA eager's; targets: MLP "
            f">= {TARGETS['MLP']}x, LeNet >= {TARGETS['LeNet']}x PyTorch. Host CPU: the training thread's CPU time per "
            f"step. CUDA graphs: the batch shapes whose steps mpitrain replayed as a graph (train.cuda_graph: auto).")
    speed = markdown_table(
        ["model", "engine", "batch", "samples/s", "vs PyTorch", "host CPU ms/step", "CUDA graphs", "test acc"],
        [[r["model"], r["engine"], str(r["batch"]), f"{r['samples_per_s']:.0f}", fmt(r["vs_torch"], "{:.2f}x"),
          fmt(r["host_cpu_ms_per_step"], "{:.2f}"), fmt(r["cuda_graphs"], "{}"), fmt(r["test_accuracy"], "{:.4f}")]
         for r in result["throughput"]], "llrrrrrr")
    outcomes = markdown_table(
        ["step", "outcome", "samples/s", "test acc", "staged bytes/step"],
        [[s["step"], "passed" if s["passed"] else f"FAILED: {s['reason']}", fmt(s.get("samples_per_s"), "{:.0f}"),
          fmt(s.get("test_accuracy"), "{:.4f}"), fmt(s.get("staged_bytes_per_step"), "{:.0f}")]
         for s in result["steps"] if "turn" not in s or not s["passed"]], "llrrr")
    return (f"{head}\n\n{speed}\n\nThe GPU tests, then 2 ranks sharing the GPU (collectives staged through host "
            f"memory), 1 epoch of up to 8,192 rows each; a 1-rank run that failed:\n\n{outcomes}\n")


def fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


if __name__ == "__main__":
    sys.exit(main())
