"""What the Fashion-MNIST benchmarks share: an mpitrain run, a PyTorch DDP run, writing results."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
# 1 thread per rank for every engine, so ranks, not threads, share the cores
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "NUMBA_NUM_THREADS": "1"}


def run_mpitrain(args, ranks: int, mode: str, extra: dict, epochs: int) -> dict:
    """One `mpiexec -n RANKS mpitrain train` run of `args.config` on `args.data`; returns its summary.json."""
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
    """PyTorch DDP on the same config and data (benchmarks/torch_ddp.py); returns samples/s and accuracy."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "torch_ddp.py"), "--data", args.data, "--config",
                          args.config, "--ranks", str(ranks), "--epochs", str(epochs)],
                         check=True, env=ENV, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_results(out_dir: str, name: str, result: dict, table: str) -> None:
    """OUT/NAME.json and OUT/NAME.md, and both printed."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(table)
    print(json.dumps(result, indent=2))
    print(table)
