"""Embedding tables exchanged by their touched rows (issue 28 item 4), beside the dense exchange and PyTorch DDP.

The table: `mpitrain.testing.datasets.make_click_dataset`'s click-through rows (3 numeric columns,
categorical columns of 1,000 and 1,000,000 Zipf-like ids, a yes/no target), and docs/tables.md's
graph model on it: an embedding of dim 16 per column (tables of 1,001,000 rows x 16: 64 MB of
float32), flatten, concat with the numbers, dense 64 ReLU, dense 1, binary cross-entropy. Plain
SGD (no momentum): the one updater under which both engines keep every exchange sparse
(PyTorch's SGD takes sparse gradients only without momentum, and mpitrain's `averaging` sends
rows only under an updater without state; with momentum or Adam every row moves at every step).

Each run trains `--steps` steps of `--batch` rows per rank (data.max_rows = steps x batch x
ranks: one epoch, the same steps on every rank count); the first `--warmup` steps (one metrics
window) are not counted. Every row's runs take turns (`--repeat` rounds), and the median counts.

- mpitrain, started as the README starts it (`mpiexec -n N mpitrain train CONFIG --set ...`, the
  user's environment): `allreduce` (gradients every step) and `averaging` (parameters every step,
  frequency 1), each with `sync.embeddings: auto` (the touched rows, when fewer bytes than the
  table) and `dense` (the tables whole). Samples/s and bytes sent per step and rank of the windows
  after the warm-up, as the communicator counted them (measured): the mean over the ranks, the
  least and the most one rank sent.
- PyTorch DDP (benchmarks/torch_embeddings.py, gloo, 1 thread per rank): the same model, rows,
  batches, initial distributions and SGD with `nn.Embedding(sparse=True)` and `sparse=False`.
  Samples/s measured; bytes computed (gloo counts nothing): dense, every gradient; sparse, the
  dense layers' gradients plus each table's distinct ids of the batch x (8 + 4 x 16) bytes.

Targets: at 10^6 rows the sparse exchange sends < 1/10 of the dense exchange's bytes per step;
mpitrain's sparse rows at least as fast as its dense ones; mpitrain's sparse `allreduce` >= 1.0x
DDP's sparse samples/s. On a 2-core machine 4 ranks are oversubscribed (the table says so).

    python benchmarks/embeddings.py --out benchmarks/results [--ranks 2,4] [--repeat 3]
    python benchmarks/embeddings.py --quick     # a 10,000-id table, a few steps, 2 ranks: checks the script
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from mpitrain.testing.datasets import make_click_dataset

from common import (
    CORES,
    HERE,
    TORCHRUN_ENV,
    in_turns,
    markdown_table,
    median_run,
    torch_available,
    train,
    write_results,
)

IDS = (1000, 1_000_000)
DIM, HIDDEN, NUMERIC = 16, 64, 3
LR = 0.2
TEST_ROWS = 20_000
GRAPH = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": DIM},
         {"name": "flat", "type": "flatten", "input": "emb"},
         {"name": "joined", "type": "concat", "inputs": ["flat", "numeric"]},
         {"name": "hidden", "type": "dense", "input": "joined", "units": HIDDEN, "activation": "relu"},
         {"name": "out", "type": "dense", "input": "hidden", "units": 1}]
MODES = {"allreduce": {}, "averaging": {"sync.frequency": 1}}
TABLES = {"sparse": "auto", "dense": "dense"}  # the table's name for a run: sync.embeddings
QUICK = {"ids": 10_000, "steps": 30, "warmup": 10, "batch": 64, "repeat": 1, "ranks": "2"}


def write_config(work: str, data: str, ranks: int, args) -> str:
    """The run config of `ranks` ranks (both engines read it): the graph, plain SGD, and data.max_rows giving
    `args.steps` steps of `args.batch` rows per rank."""
    path = os.path.join(work, f"clicks-{ranks}.yaml")
    with open(path, "w") as f:
        json.dump({"data": {"path": data, "max_rows": args.steps * args.batch * ranks},
                   "model": {"graph": GRAPH, "loss": "binary_cross_entropy"},
                   "optimizer": {"type": "sgd", "lr": LR, "momentum": 0.0},
                   "train": {"epochs": 1, "batch_size": args.batch, "seed": 0, "log_every": args.warmup},
                   "report": False}, f)
    return path


def after_warmup(windows: list[dict]) -> dict:
    """Samples/s and bytes per step of the metrics windows after the first (the warm-up): the ranks' mean bytes,
    and the least and most one rank sent per step in any of those windows."""
    counted = windows[1:]
    seconds = sum(w["samples"] / w["samples_per_s"] for w in counted)
    return {"samples_per_s": sum(w["samples"] for w in counted) / seconds,
            "bytes_sent_per_step": sum(w["bytes_sent_per_step"] for w in counted) / len(counted),
            "bytes_sent_per_step_min": min(w["bytes_sent_per_step_min"] for w in counted),
            "bytes_sent_per_step_max": max(w["bytes_sent_per_step_max"] for w in counted)}


def mpitrain_run(config: str, ranks: int, mode: str, tables: str, args) -> dict:
    summary = train(ranks, config, {"sync.mode": mode, "sync.embeddings": TABLES[tables], **MODES[mode],
                                    "train.log_every": args.warmup})
    if len(summary["windows"]) < 2:
        raise SystemExit(f"{config}: {len(summary['windows'])} metrics window(s); expected --steps > --warmup")
    return {**after_warmup(summary["windows"]), "bytes": "measured", "test_loss": summary["test_loss"],
            "test_auc": summary["evaluation"].get("auc"), "n_params": summary["n_params"],
            "peak_rss_mb": summary["peak_rss_mb"], "wall_s": summary["wall_s"],
            "run_bytes_sent_per_step": {key: summary[key] for key in (
                "bytes_sent_per_step", "bytes_sent_per_step_min", "bytes_sent_per_step_max")}}


DDP_ATTEMPTS = 3  # gloo's sparse allreduce now and then aborts a rank (SIGABRT) on 4 oversubscribed ranks


def ddp_run(config: str, ranks: int, tables: str, args) -> dict:
    """One PyTorch run; a run whose ranks die is run again, up to DDP_ATTEMPTS times, and the row counts the failed
    attempts (`ddp_failed_attempts`)."""
    command = [sys.executable, os.path.join(HERE, "torch_embeddings.py"), "--config", config, "--ranks", str(ranks),
               "--warmup-steps", str(args.warmup), *(["--sparse"] if tables == "sparse" else [])]
    for attempt in range(DDP_ATTEMPTS):
        done = subprocess.run(command, env=TORCHRUN_ENV, capture_output=True, text=True)
        if not done.returncode:
            return {**json.loads(done.stdout.strip().splitlines()[-1]), "bytes": "computed",
                    "ddp_failed_attempts": attempt}
        print(f"{' '.join(command)} failed (attempt {attempt + 1}): {done.stderr.strip().splitlines()[-1]}",
              file=sys.stderr)
    raise SystemExit(f"{' '.join(command)} failed {DDP_ATTEMPTS} times:\n{done.stderr[-3000:]}")


def measure(args, data: str, work: str, with_ddp: bool) -> list[dict]:
    """Every row on each rank count, the runs of a rank count taking turns; the median run of each row."""
    rows = []
    for ranks in args.ranks:
        config = write_config(work, data, ranks, args)
        runs = [("mpitrain", mode, tables) for mode in args.modes for tables in TABLES]
        runs += [("pytorch-ddp", "DDP gloo", tables) for tables in TABLES] if with_ddp else []
        done = {run: [] for run in runs}
        for turn, run in in_turns(tuple(runs), args.repeat):
            engine, mode, tables = run
            print(f"round {turn + 1}/{args.repeat}, {ranks} ranks: {engine} {mode} {tables}", file=sys.stderr)
            done[run].append(mpitrain_run(config, ranks, mode, tables, args) if engine == "mpitrain" else
                             ddp_run(config, ranks, tables, args))
        for (engine, mode, tables), results in done.items():
            sync = f"{mode} (frequency 1)" if mode == "averaging" else mode
            rows.append({"engine": engine, "ranks": ranks, "sync": sync, "tables": tables,
                         "oversubscribed": ranks > CORES, **median_run(results)})
    for row in rows:  # sparse over dense of the same engine, sync and ranks
        dense = next(r for r in rows if (r["engine"], r["sync"], r["ranks"], r["tables"]) ==
                     (row["engine"], row["sync"], row["ranks"], "dense"))
        row["samples_vs_dense"] = row["samples_per_s"] / dense["samples_per_s"]
        row["bytes_vs_dense"] = row["bytes_sent_per_step"] / dense["bytes_sent_per_step"]
        ddp = [r for r in rows if r["engine"] == "pytorch-ddp" and (r["ranks"], r["tables"]) ==
               (row["ranks"], row["tables"])]
        row["samples_vs_ddp"] = row["samples_per_s"] / ddp[0]["samples_per_s"] if ddp else None
    return rows


def markdown(result: dict) -> str:
    s = result["setup"]
    rows = result["rows"]
    oversubscribed = sorted({r["ranks"] for r in rows if r["oversubscribed"]})
    lines = [(f"Quick check ({s['table_rows']:,}-row tables), not the benchmark's table. " if s["quick"] else "")
             + f"Click table, categorical columns of {' and '.join(f'{n:,}' for n in s['ids'])} ids embedded in "
             f"{DIM} dimensions (tables of {s['table_rows']:,} rows x {DIM}, {s['table_mb']:.0f} MB of float32), "
             f"{NUMERIC} numeric columns; emb -> flatten -> concat -> dense {HIDDEN} ReLU -> dense 1, binary "
             f"cross-entropy; plain SGD, lr {LR}, no momentum (both engines' sparse paths need an updater without "
             f"state). {s['batch']} rows per rank per step, {s['steps']} steps, the first {s['warmup']} not counted; "
             f"each row the median of {s['repeat']} run(s), taken in turns."
             + (f" {' and '.join(map(str, oversubscribed))} ranks on {CORES} cores are oversubscribed: their "
                "samples/s show the cores shared, not the method's scaling." if oversubscribed else ""), "",
             markdown_table(["engine", "ranks", "sync", "tables", "samples/s", "vs dense", "bytes/step/rank",
                             "least rank", "most rank", "vs dense bytes", "bytes", "test loss"],
                            [[r["engine"], str(r["ranks"]), r["sync"], r["tables"], f"{r['samples_per_s']:,.0f}",
                              f"{r['samples_vs_dense']:.2f}x", f"{r['bytes_sent_per_step']:,.0f}",
                              f"{r['bytes_sent_per_step_min']:,.0f}", f"{r['bytes_sent_per_step_max']:,.0f}",
                              f"{100 * r['bytes_vs_dense']:.3g}%", r["bytes"], f"{r['test_loss']:.4f}"]
                             for r in rows], "lrllrrrrrrlr"), "",
             "bytes/step/rank: what a rank hands to its collectives per step (an Allreduce's buffer, its own "
             "Allgatherv message), the mean over the ranks; least and most: one rank's, in any counted window. "
             "mpitrain's are measured by its communicator; DDP's computed (gloo counts nothing): dense, every "
             "gradient; sparse, the dense layers' gradients plus each table's distinct ids of the rank's batch x "
             f"(8 + 4 x {DIM}) bytes (gloo's coalesced int64 indices and float32 values). mpitrain's sparse "
             "`averaging` sends the rows any rank changed since the last averaging, and their union's ids."]
    pairs = [(r, t) for r in rows if r["engine"] == "mpitrain" and r["sync"] == "allreduce" and r["samples_vs_ddp"]
             for t in rows if t["engine"] == "pytorch-ddp" and (t["ranks"], t["tables"]) == (r["ranks"], r["tables"])]
    if pairs:
        lines += ["", markdown_table(["ranks", "tables", "mpitrain allreduce samples/s", "DDP samples/s",
                                      "mpitrain / DDP"],
                                     [[str(r["ranks"]), r["tables"], f"{r['samples_per_s']:,.0f}",
                                       f"{t['samples_per_s']:,.0f}", f"{r['samples_vs_ddp']:.2f}x"]
                                      for r, t in pairs], "llrrr")]
    return "\n".join(lines + ["", targets(result)]) + "\n"


def targets(result: dict) -> str:
    """The targets of the module docstring, each met or not, from the rows."""
    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"
    rows, size = result["rows"], result["setup"]["table_rows"]
    sparse = [r for r in rows if r["engine"] == "mpitrain" and r["tables"] == "sparse"]
    lines = [f"sparse sends < 1/10 of dense bytes per step at {size:,} rows: "
             f"{met(all(r['bytes_vs_dense'] < 0.1 for r in sparse))} ("
             + ", ".join(f"{r['sync']} {r['ranks']} ranks {100 * r['bytes_vs_dense']:.3g}%" for r in sparse) + ")",
             f"mpitrain sparse >= dense samples/s: {met(all(r['samples_vs_dense'] >= 1.0 for r in sparse))} ("
             + ", ".join(f"{r['sync']} {r['ranks']} ranks {r['samples_vs_dense']:.2f}x" for r in sparse) + ")"]
    versus = [r for r in sparse if r["sync"] == "allreduce" and r["samples_vs_ddp"]]
    if versus:
        lines.append(f"mpitrain sparse allreduce >= 1.0x DDP sparse samples/s: "
                     f"{met(all(r['samples_vs_ddp'] >= 1.0 for r in versus))} ("
                     + ", ".join(f"{r['ranks']} ranks {r['samples_vs_ddp']:.2f}x" for r in versus) + ")")
    return "Targets: " + "; ".join(lines) + "."


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--ranks", default="2,4", help="rank counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every run; the median counts")
    parser.add_argument("--modes", default=",".join(MODES), help=f"some of {','.join(MODES)}")
    parser.add_argument("--ids", type=int, default=IDS[1], help="ids of the large categorical column")
    parser.add_argument("--steps", type=int, default=250, help="steps per run, the warm-up's included")
    parser.add_argument("--warmup", type=int, default=50, help="first steps not counted (one metrics window)")
    parser.add_argument("--batch", type=int, default=256, help="rows per rank per step")
    parser.add_argument("--quick", action="store_true",
                        help=f"check the script in seconds: {QUICK} (those not given), results in embeddings-quick.*")
    args = parser.parse_args(argv)
    if args.quick:
        given = {a.split("=")[0].lstrip("-") for a in (argv if argv is not None else sys.argv[1:])}
        for key, value in QUICK.items():
            if key not in given:
                setattr(args, key, value)
    args.ranks = [int(n) for n in str(args.ranks).split(",")]
    args.modes = args.modes.split(",")
    if set(args.modes) - set(MODES):
        parser.error(f"--modes: {args.modes}; expected some of {list(MODES)}")
    if args.steps < 2 * args.warmup:
        parser.error(f"--steps {args.steps} leaves fewer counted steps than the {args.warmup} of the warm-up")
    ids = (IDS[0], args.ids)
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "clicks")
        make_click_dataset(data, n_train=args.steps * args.batch * max(args.ranks), n_test=TEST_ROWS, ids=ids,
                           numeric=NUMERIC, shards=4)
        rows = measure(args, data, work, torch_available())
    setup = {"ids": list(ids), "dim": DIM, "table_rows": sum(ids), "table_mb": sum(ids) * DIM * 4 / 2**20,
             "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "repeat": args.repeat, "lr": LR,
             "optimizer": "sgd, no momentum", "quick": args.quick}
    result = {"setup": setup, "rows": rows}
    write_results(args.out, "embeddings-quick" if args.quick else "embeddings", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
