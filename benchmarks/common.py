"""What the Fashion-MNIST benchmarks share: an mpitrain run, a PyTorch DDP run, writing results."""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from mpitrain.base.threads import users_environment
from mpitrain.rundir.directory import RunDir
from mpitrain.rundir.metrics_file import read_metrics

HERE = os.path.dirname(os.path.abspath(__file__))
CORES = len(os.sched_getaffinity(0))
BIN = os.path.dirname(sys.executable)
# mpitrain runs in the benchmark's own environment, as a user's shell starts it (it sizes its thread
# pools itself: mpitrain/base/threads.py). PyTorch's peer gets what its launcher gives: torchrun sets
# OMP_NUM_THREADS=1 in each process it starts when the user has not.
# (The environment as the user set it: this process imported mpitrain, which sized its own pools.)
USER_ENV = users_environment(os.environ)
TORCHRUN_ENV = {**USER_ENV, "OMP_NUM_THREADS": USER_ENV.get("OMP_NUM_THREADS", "1")}
# What a user who pins every pool by hand sets: the "pinned" rows beside the default ones.
PINNED_ENV = {**USER_ENV, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1"}


def benchmark_parser(doc: str, epochs: int) -> argparse.ArgumentParser:
    """The arguments every Fashion-MNIST benchmark takes: --data, --config, --epochs, --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--data", default="data/fashion")
    parser.add_argument("--config", default="configs/fashion_mlp.yaml")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--out", default="benchmarks/results")
    return parser


def run_mpitrain(args, ranks: int, mode: str, extra: dict, epochs: int, env: dict | None = None) -> dict:
    """One `mpiexec -n RANKS mpitrain train` run of `args.config` on `args.data`, in this process's environment
    (or `env`).

    Returns its summary.json, with its metrics.jsonl window records under "windows" (and its DBN
    pretraining records under "pretrain").
    """
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = {"data.path": args.data, "run_dir": run_dir, "resume": "never", "train.epochs": epochs,
                     "sync.mode": mode, "train.log_every": 1000, "report": False, **extra}
        command = [os.path.join(BIN, "mpiexec"), "-n", str(ranks), os.path.join(BIN, "mpitrain"), "train",
                   args.config, *[f"--set={k}={v}" for k, v in overrides.items()]]
        subprocess.run(command, check=True, env=env or USER_ENV, capture_output=True, text=True)
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        summary["windows"] = read_metrics(RunDir(run_dir).metrics)[0]
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            summary["pretrain"] = [r for r in map(json.loads, f) if r["kind"] == "pretrain"]
        return summary


def train(ranks: int, config: str, overrides: dict, env: dict | None = None, prefix: list[str] = ()) -> dict:
    """`mpiexec -n RANKS mpitrain train CONFIG --set ...` in a fresh run directory, as the README starts it (in the
    user's environment, or `env`; after the command `prefix`); its summary.json, with its metrics.jsonl window records
    under "windows". A `run_dir` among the overrides keeps the run."""
    with tempfile.TemporaryDirectory() as scratch:
        settings = {"run_dir": scratch, "report": False, "train.log_every": 1000, **overrides}
        run_dir = settings["run_dir"]
        command = [*prefix, os.path.join(BIN, "mpiexec"), "-n", str(ranks), os.path.join(BIN, "mpitrain"), "train",
                   config, *[f"--set={k}={json.dumps(v) if isinstance(v, (dict, list)) else v}"
                             for k, v in settings.items()]]
        done = subprocess.run(command, env=env or USER_ENV, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            summary["windows"] = [r for r in map(json.loads, f) if r["kind"] == "window"]
        return summary


def mpitrain(*args: str, ranks: int = 0) -> str:
    """`mpitrain ARGS...` (under `mpiexec -n RANKS` when `ranks`) as a user runs it; its output, or the benchmark
    ends with its error."""
    launcher = [os.path.join(BIN, "mpiexec"), "-n", str(ranks)] if ranks else []
    done = subprocess.run([*launcher, os.path.join(BIN, "mpitrain"), *args], env=USER_ENV, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"mpitrain {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def median_run(runs: list[dict]) -> dict:
    """The run with the median samples/s (the upper one of an even count)."""
    return sorted(runs, key=lambda r: r["samples_per_s"])[len(runs) // 2]


def in_turns(names: tuple, rounds: int):
    """(round, name) for `rounds` rounds of every name, each round starting one name later, so no name always
    runs first (after a Spark job or on a cold cache) or last."""
    for turn in range(rounds):
        for k in range(len(names)):
            yield turn, names[(turn + k) % len(names)]


def best_of(repeat: int, measure) -> dict:
    """The fastest (highest samples/s) of `repeat` runs of `measure()`."""
    return max((measure() for _ in range(repeat)), key=lambda r: r["samples_per_s"])


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("PyTorch is not installed (pip install -e '.[bench]'): the DDP baseline is left out", file=sys.stderr)
        return False
    return True


def run_ddp(args, ranks: int, epochs: int, extra: list[str] = ()) -> dict:
    """PyTorch DDP on the same config and data (benchmarks/torch_ddp.py, `extra` arguments passed on), one
    thread per process as torchrun starts it; returns samples/s and accuracy."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "torch_ddp.py"), "--data", args.data, "--config",
                          args.config, "--ranks", str(ranks), "--epochs", str(epochs), *extra],
                         check=True, env=TORCHRUN_ENV, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def sgemm_rate() -> float:
    """This machine's float32 GEMM FLOP/s on one core (numpy, every thread pool pinned to 1)."""
    done = subprocess.run([sys.executable, "-c", "from mpitrain.testing.flops import sgemm_rate; print(sgemm_rate())"],
                          env=PINNED_ENV, capture_output=True, text=True, check=True)
    return float(done.stdout)


def machine() -> dict:
    """Where and with what a result was measured (for the README table): `uname -m`, cores, UTC date, versions."""
    versions = {"python": platform.python_version()}
    for package in ("numpy", "mpi4py", "torch"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {"arch": platform.machine(), "cores": CORES, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "versions": versions}


def markdown_table(headers: list[str], rows: list[list[str]], align: str) -> str:
    """A markdown table; `align` has one letter per column: l (text) or r (numbers)."""
    rule = ["---:" if a == "r" else "---" for a in align]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [headers, rule, *rows])


def write_results(out_dir: str, name: str, result: dict, table: str, measured_on: dict | None = None) -> None:
    """OUT/NAME.json (with the machine: this one, or `measured_on`, the one that measured the result's figures)
    and OUT/NAME.md, and both printed."""
    os.makedirs(out_dir, exist_ok=True)
    result = {**result, "machine": measured_on or machine()}
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(table)
    print(json.dumps(result, indent=2))
    print(table)
