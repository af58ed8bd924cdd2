"""Soak: start a run, kill a random rank at a random moment, resume; repeat. Not a test.

Each cycle launches `mpiexec -n RANKS mpitrain train` on a small synthetic dataset with a
checkpoint every few steps, SIGKILLs one rank's process after a random delay (or lets the
cycle finish when training ends first), and checks that the job ended without hanging.
The last cycle runs to the end. At the end: the run completed, and every checkpoint on
disk loads. Reports how many cycles survived (ended, then resumed) as JSON.

    python benchmarks/soak.py --cycles 20
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))

from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint  # noqa: E402
from mpitrain.testing.datasets import make_dataset  # noqa: E402
from mpitrain.testing.launch import MPIEXEC, MPITRAIN  # noqa: E402

from common import write_results  # noqa: E402


def rank_pids(config: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"bin/python .*mpitrain train {config}"], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1000, help="enough that only the last cycle finishes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    hung = 0
    sync_mode = rng.choice(["allreduce", "averaging", "sharing"])
    with tempfile.TemporaryDirectory() as tmp:
        make_dataset(os.path.join(tmp, "data"), n_train=2000, shape=(1, 8, 8))
        config = os.path.join(tmp, "soak.yaml")
        with open(config, "w") as f:
            yaml.safe_dump({"data": {"path": os.path.join(tmp, "data")},
                            "model": {"layers": [{"type": "dense", "units": 32, "activation": "relu"},
                                                 {"type": "dense", "units": 3}]},
                            "optimizer": {"type": "adam", "lr": 0.001},
                            "train": {"epochs": args.epochs, "batch_size": 16},
                            "sync": {"mode": sync_mode},
                            "checkpoint": {"unit": "step", "every": 10, "keep": 3},
                            "run_dir": os.path.join(tmp, "run")}, f)
        run_dir = os.path.join(tmp, "run")
        for cycle in range(args.cycles):
            job = subprocess.Popen([MPIEXEC, "-n", str(args.ranks), MPITRAIN, "train", config],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            last = cycle == args.cycles - 1
            if not last:
                time.sleep(rng.uniform(1.0, 4.0))
                pids = rank_pids(config)
                if pids:
                    os.kill(rng.choice(pids), signal.SIGKILL)
            try:
                job.wait(timeout=600 if last else 60)
            except subprocess.TimeoutExpired:
                hung += 1
                job.kill()
                job.wait()
            print(f"cycle {cycle + 1}: exit {job.returncode}, newest checkpoint "
                  f"{(list_checkpoints(run_dir) or ['none'])[-1]}", file=sys.stderr)
        completed = job.returncode == 0 and os.path.exists(os.path.join(run_dir, "summary.json"))
        loadable = all(load_checkpoint(p) for p in list_checkpoints(run_dir))
    result = {"cycles": args.cycles, "sync_mode": sync_mode, "survived": args.cycles - hung, "hung": hung, "completed": completed,
              "checkpoints_load": loadable}
    table = (f"{args.cycles} cycles of start, SIGKILL of a random rank after 1-4 s, resume ({args.ranks} ranks, "
             f"{result['sync_mode']}): {result['survived']} ended without a hang and resumed, {hung} hung; "
             f"run completed: {completed}; every checkpoint on disk loads: {loadable}\n")
    write_results(args.out, "soak", result, table)
    return result


if __name__ == "__main__":
    main()
