"""Training inside Spark beside plain mpiexec: time per training step and start-up overhead (issue 31).

The same config trains `--epochs` epochs on `--ranks` ranks twice per round: `mpiexec -n N mpitrain train`
and `mpitrain spark-train --ranks N` (Spark local[N]: one barrier stage hosts the same MPI job), the two
taking turns (`--repeat` rounds, each starting with the other engine) so the machine's drift reaches both
alike; each row is the median round. One uncounted run of each engine comes first: the first run on a
machine pays for numba's kernel cache and the page cache (seen: a cold mpiexec run at 0.4x a warm one). Time per step is the training steps' alone (summary.json's
samples/s over the rows of a global batch). Start-up overhead is the command's wall time less the run's own
(`wall_s`: from the ranks' start to the summary), so it holds mpiexec's start for the one, and Spark's
driver, executors, barrier stage and Hydra's manual launch for the other.

Target: Spark's time per step within noise of mpiexec's, at most 2% slower; the overhead is reported, in
seconds, not judged.

    python benchmarks/spark_train.py --data data/fashion --out benchmarks/results
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

from mpitrain.config.sections import load_config  # noqa: E402

from common import BIN, USER_ENV, benchmark_parser, in_turns, markdown_table, write_results

ENGINES = ("mpiexec", "spark-train")


def run(engine: str, args) -> dict:
    """One run of `engine` in a fresh run directory: its summary.json with the command's wall time."""
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [f"--set={k}={v}" for k, v in {"data.path": args.data, "run_dir": run_dir, "resume": "never",
                                                   "train.epochs": args.epochs, "train.log_every": 1000,
                                                   "report": False}.items()]
        mpitrain = os.path.join(BIN, "mpitrain")
        command = ([os.path.join(BIN, "mpiexec"), "-n", str(args.ranks), mpitrain, "train", args.config, *overrides]
                   if engine == "mpiexec" else
                   [mpitrain, "spark-train", args.config, "--ranks", str(args.ranks), *overrides])
        started = time.monotonic()
        done = subprocess.run(command, env={**USER_ENV, "PYSPARK_PYTHON": os.path.join(BIN, "python")},
                              capture_output=True, text=True)
        wall = time.monotonic() - started
        if done.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        with open(os.path.join(run_dir, "summary.json")) as f:
            return {**json.load(f), "command_s": wall}


def main(argv=None) -> dict:
    parser = benchmark_parser(__doc__, epochs=2)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of both engines; the median counts")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the uncounted first run of each engine")
    args = parser.parse_args(argv)
    rows_per_step = load_config(args.config).train.global_batch(args.ranks)
    if args.warmup:
        for engine in ENGINES:
            run(engine, args)
    runs = {engine: [] for engine in ENGINES}
    for _, engine in in_turns(ENGINES, args.repeat):
        runs[engine].append(run(engine, args))
    result = {"ranks": args.ranks, "epochs": args.epochs, "config": args.config, "rows_per_step": rows_per_step,
              "engines": {}}
    for engine, done in runs.items():
        median = sorted(done, key=lambda r: r["samples_per_s"])[len(done) // 2]
        result["engines"][engine] = {
            "samples_per_s": median["samples_per_s"], "step_ms": 1000 * rows_per_step / median["samples_per_s"],
            "command_s": median["command_s"], "run_s": median["wall_s"],
            "startup_overhead_s": median["command_s"] - median["wall_s"], "test_accuracy": median["test_accuracy"],
            "samples_per_s_runs": [r["samples_per_s"] for r in done]}
    base = result["engines"]["mpiexec"]
    spark = result["engines"]["spark-train"]
    result["spark_step_time_ratio"] = spark["step_ms"] / base["step_ms"]
    result["spark_extra_startup_s"] = spark["startup_overhead_s"] - base["startup_overhead_s"]
    table = (f"{args.ranks} ranks, {args.epochs} epochs of {args.config}, median of {args.repeat} rounds\n\n"
             + markdown_table(["engine", "samples/s", "ms per step", "vs mpiexec", "command s", "start-up s",
                               "test acc"],
                              [[engine, f"{e['samples_per_s']:.0f}", f"{e['step_ms']:.2f}",
                                f"{e['step_ms'] / base['step_ms']:.3f}x", f"{e['command_s']:.1f}",
                                f"{e['startup_overhead_s']:.1f}", f"{e['test_accuracy']:.4f}"]
                               for engine, e in result["engines"].items()], "lrrrrrr"))
    write_results(args.out, "spark_train", result, table)
    return result


if __name__ == "__main__":
    main()
