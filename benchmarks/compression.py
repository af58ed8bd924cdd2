"""The dense modes' codecs, `sync.mode: auto` and `sync.deterministic` on the simulated cluster (needs root).

For each link rate (`--links`, Gb/s) a cluster of 4 network namespaces (tests/harness/cluster.py: tbf-shaped links
into one bridge, MPICH over TCP, one rank per node, each pinned to a share of the cores) trains each model 5 epochs
per variant, started as the README starts mpitrain (`mpiexec ... mpitrain train CONFIG --set ...`): dense
`allreduce` blocking (the baseline) and overlapped, bf16, fp16 and powersgd (rank 1) on overlapped buckets,
`sharing`, `auto`, and `deterministic` (exact int64 sums of micro-batches of 8 rows); and their peer, PyTorch DDP
(gloo) on the same model, rows and batches (benchmarks/torch_ddp.py started by the same mpiexec, `--launcher mpi`),
without a hook and with its `fp16_compress_hook` (its bf16 hook needs CUDA and NCCL) and `powerSGD_hook` (rank 1, from step 2). Samples/s are those of
epochs 2-5 (the first is the warm-up: numba's kernels, TCP connections; `auto` runs dense in it and chooses at its
end), bytes per step per rank as mpitrain counts them and as the nodes' links counted them (the whole run's, start-up
and evaluation included, over its steps: DDP counts none itself), test accuracy after the 5 epochs, and `auto`'s
choice at each epoch's end (summary.json's `sync_auto`).

Targets (issue 52): at each link rate, `auto` within 10% of the samples/s of the best fixed setting whose test
accuracy is within 0.5 points of dense; the price of `deterministic` (samples/s and bytes against blocking dense)
measured, for docs/sync-modes.md#deterministic.

    sudo python benchmarks/compression.py --data data/fashion --out benchmarks/results
    sudo python benchmarks/compression.py --variants auto --update    # auto's rows again, the others kept
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

from mpitrain.rundir.directory import RunDir
from mpitrain.rundir.metrics_file import read_metrics
from mpitrain.testing.cluster import NODE_IF, SimulatedCluster, missing_capability

from common import BIN, HERE, markdown_table, write_results

MODELS = {"MLP": ("configs/fashion_mlp.yaml", 20000), "LeNet": ("configs/fashion_lenet.yaml", 8000)}  # max rows
DENSE = {"sync.mode": "allreduce", "sync.compression": "none"}
VARIANTS = {  # name: overrides
    "dense blocking": {**DENSE, "sync.overlap": False},
    "dense overlapped": DENSE,
    "bf16": {**DENSE, "sync.compression": "bf16"},
    "fp16": {**DENSE, "sync.compression": "fp16"},
    "powersgd": {**DENSE, "sync.compression": "powersgd"},
    "sharing": {"sync.mode": "sharing"},
    "auto": {"sync.mode": "auto"},
    "deterministic": {**DENSE, "sync.overlap": False, "sync.deterministic": True},
    "DDP": {"hook": "none"},  # PyTorch's rows: torch_ddp.py's --hook
    "DDP fp16": {"hook": "fp16"},  # bf16_compress_hook needs CUDA and NCCL: gloo refuses it
    "DDP powersgd": {"hook": "powersgd"},
}
PEERS = {"dense blocking": "DDP", "fp16": "DDP fp16", "powersgd": "DDP powersgd"}  # mpitrain's row: DDP's twin
FIXED = ("dense blocking", "dense overlapped", "bf16", "fp16", "powersgd", "sharing")  # what auto is held against
NODES, BATCH, EPOCHS = 4, 64, 5


def main(argv=None) -> dict:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/fashion")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--links", type=float, nargs="+", default=[1.0, 10.0], help="link rates, Gb/s")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--max-rows", type=int, default=0, help="rows per split instead of the models' (a quick try)")
    parser.add_argument("--update", action="store_true",
                        help="keep OUT/compression.json's rows but those of the variants run now (the table's "
                             "machine line is then this run's)")
    args = parser.parse_args(argv)
    reason = missing_capability()
    if reason:
        sys.exit(f"compression.py: {reason}")
    rows = []
    for gbps in args.links:
        with SimulatedCluster(nodes=NODES, link_gbps=gbps) as cluster:
            for model in args.models:
                for variant in args.variants:
                    rows.append(train_row(cluster, args.data, model, variant, args.max_rows))
                    print(json.dumps(rows[-1]), flush=True)
    if args.update:
        with open(os.path.join(args.out, "compression.json")) as f:
            kept = [r for r in json.load(f)["rows"] if r["variant"] not in args.variants]
        rows = sorted(kept + rows, key=lambda r: (r["link_gbps"], list(MODELS).index(r["model"]),
                                                  list(VARIANTS).index(r["variant"])))
    result = {"rows": rows}
    write_results(args.out, "compression", result, markdown(result))
    return result


def train_row(cluster, data: str, model: str, variant: str, max_rows: int = 0) -> dict:
    """Train `model` with `variant` on every node for EPOCHS epochs; its row."""
    if variant.startswith("DDP"):
        return ddp_row(cluster, data, model, variant, max_rows)
    config_path, model_rows = MODELS[model]
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = {"data.path": data, "data.max_rows": max_rows or model_rows, "run_dir": run_dir,
                     "resume": "never", "train.epochs": EPOCHS, "train.batch_size": BATCH, "train.log_every": 10,
                     "report": False, "checkpoint.every": 1000, **VARIANTS[variant]}
        before = cluster.bytes_on_links()
        result = cluster.mpiexec(cluster.size, os.path.join(BIN, "mpitrain"), "train", config_path,
                                 *[f"--set={k}={v}" for k, v in overrides.items()], timeout=1800)
        sent = wire_bytes(cluster, before)
        if result.returncode:
            sys.exit(f"{model} {variant} failed on {cluster.description}:\n{result.stderr[-3000:]}")
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        windows = [w for w in read_metrics(RunDir(run_dir).metrics)[0] if w["epoch"] >= 1]
    samples = sum(w["samples"] for w in windows)
    return {"model": model, "link_gbps": cluster.link_gbps, "variant": variant,
            "samples_per_s": samples / sum(w["samples"] / w["samples_per_s"] for w in windows),
            "bytes_per_step": float(np.average([w["bytes_sent_per_step"] for w in windows],
                                               weights=[w["samples"] for w in windows])),
            "wire_bytes_per_step": sent / (summary["steps_per_epoch"] * EPOCHS),
            "test_accuracy": summary["test_accuracy"], "replicas_identical": len(set(summary["replica_hashes"])) == 1,
            "auto_choices": [record["next"] for record in summary.get("sync_auto", [])]}


def ddp_row(cluster, data: str, model: str, variant: str, max_rows: int = 0) -> dict:
    """PyTorch DDP with `variant`'s hook on every node for EPOCHS epochs, the first not counted; its row."""
    config_path, model_rows = MODELS[model]
    before = cluster.bytes_on_links()
    result = cluster.mpiexec(cluster.size, sys.executable, os.path.join(HERE, "torch_ddp.py"), "--launcher", "mpi",
                             "--init", f"tcp://{cluster.hosts[0]}:29517", "--data", data, "--config", config_path,
                             "--epochs", EPOCHS, "--warmup-epochs", 1, "--batch-size", BATCH,
                             "--max-rows", max_rows or model_rows, "--hook", VARIANTS[variant]["hook"],
                             env={"GLOO_SOCKET_IFNAME": NODE_IF, "OMP_NUM_THREADS": "1"}, timeout=1800)
    sent = wire_bytes(cluster, before)
    if result.returncode:
        sys.exit(f"{model} {variant} failed on {cluster.description}:\n{result.stderr[-3000:]}")
    ddp = json.loads(result.stdout.strip().splitlines()[-1])
    return {"model": model, "link_gbps": cluster.link_gbps, "variant": variant, "samples_per_s": ddp["samples_per_s"],
            "bytes_per_step": None, "wire_bytes_per_step": sent / ddp["steps"], "test_accuracy": ddp["test_accuracy"],
            "replicas_identical": None, "auto_choices": []}


def wire_bytes(cluster, before: dict) -> float:
    """What the nodes' links sent since `before` (`bytes_on_links()`), per node."""
    after = cluster.bytes_on_links()
    return sum(after[node]["tx"] - before[node]["tx"] for node in cluster.nodes) / cluster.size


def markdown(result: dict) -> str:
    """The measured table and the targets' verdicts."""
    rows, table = result["rows"], []
    for r in rows:
        base = baseline(rows, r)
        wire = r.get("wire_bytes_per_step")
        table.append([r["model"], f"{r['link_gbps']:g}", r["variant"], f"{r['samples_per_s']:.0f}",
                      f"{r['samples_per_s'] / base['samples_per_s']:.2f}x",
                      "-" if r["bytes_per_step"] is None else f"{r['bytes_per_step'] / 1e6:.3f}",
                      "-" if wire is None else f"{wire / 1e6:.3f}",
                      "-" if wire is None or not base.get("wire_bytes_per_step")
                      else f"{wire / base['wire_bytes_per_step']:.2f}",
                      f"{r['test_accuracy']:.4f}", " > ".join(r["auto_choices"])])
    measured = markdown_table(["model", "link Gb/s", "sync", "samples/s", "vs blocking dense", "MB/step/rank",
                               "wire MB/step/rank", "wire vs dense", "test acc", "auto's choices (epoch ends)"],
                              table, "lrlrrrrrrl")
    return (f"{NODES} simulated nodes (network namespaces, tbf-shaped links), 1 rank per node, MPICH over TCP; batch "
            f"{BATCH} per rank; {EPOCHS} epochs, samples/s of epochs 2-{EPOCHS}; the codecs on overlapped buckets; "
            "DDP: PyTorch's DistributedDataParallel (gloo) on the same rows, with its hook. Wire bytes: what the links "
            "carried over the whole run (start-up and evaluation included), per step and rank."
            f"\n\n{measured}\n\n{verdicts(rows)}\n")


def baseline(rows: list[dict], row: dict) -> dict:
    """The blocking dense row of `row`'s model and link."""
    return next(r for r in rows if r["variant"] == "dense blocking" and r["model"] == row["model"]
                and r["link_gbps"] == row["link_gbps"])


def verdicts(rows: list[dict]) -> str:
    """`auto` against the best fixed setting within 0.5 points of dense; `deterministic`'s price."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for gbps in dict.fromkeys(r["link_gbps"] for r in rows):
            mine = {r["variant"]: r for r in rows if r["model"] == model and r["link_gbps"] == gbps}
            dense = mine["dense blocking"]
            if "auto" in mine:
                fair = [mine[v] for v in FIXED if v in mine
                        and mine[v]["test_accuracy"] >= dense["test_accuracy"] - 0.005]
                best = max(fair, key=lambda r: r["samples_per_s"])
                ratio = mine["auto"]["samples_per_s"] / best["samples_per_s"]
                points = 100 * (mine["auto"]["test_accuracy"] - dense["test_accuracy"])
                lines.append(f"- {model}, {gbps:g} Gb/s: auto {ratio:.2f}x the best fixed setting within 0.5 points of "
                             f"dense ({best['variant']}), test accuracy {points:+.2f} points against dense (target: "
                             f"at least 0.90x, within 0.5 points: "
                             f"{'met' if ratio >= 0.9 and abs(points) <= 0.5 else 'NOT met'})")
            peers = [f"{ours} {mine[ours]['samples_per_s'] / mine[theirs]['samples_per_s']:.2f}x {theirs} "
                     f"({100 * (mine[ours]['test_accuracy'] - mine[theirs]['test_accuracy']):+.2f} points)"
                     for ours, theirs in PEERS.items() if ours in mine and theirs in mine]
            if peers:
                lines.append(f"- {model}, {gbps:g} Gb/s, mpitrain beside PyTorch DDP's hooks: " + "; ".join(peers))
            if "deterministic" in mine:
                exact = mine["deterministic"]
                lines.append(f"- {model}, {gbps:g} Gb/s: deterministic {exact['samples_per_s'] / dense['samples_per_s']:.2f}x "
                             f"blocking dense's samples/s, {exact['bytes_per_step'] / dense['bytes_per_step']:.2f}x its "
                             f"bytes per step, test accuracy {100 * (exact['test_accuracy'] - dense['test_accuracy']):+.2f} "
                             "points")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
