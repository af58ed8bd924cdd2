"""Training on a simulated multi-node cluster, beside the communication cost model (needs root).

For each link rate (`--links`, Gb/s) and node count (`--nodes`), a cluster of network
namespaces (tests/harness/cluster.py: tbf-shaped links into one bridge, MPICH over TCP, one rank per
node) is built; benchmarks/network_probe.py measures its Allreduce over sizes and
`mpitrain.parallel.costmodel.Network.fit` fits latency and time per byte to it. Then each model trains
2 epochs per sync variant (blocking and overlapped `allreduce`, `averaging` every 5 steps,
`sharing` with the allgather, the split and the recursive exchange): samples/s and communication time per
step are those of the second epoch (the first is the warm-up: numba's kernels, TCP
connections), test accuracy is after both. Each row puts the measured communication time
per step (per step, the least any rank spent from the start of its collectives to their
end, so waiting for slower ranks is left out) beside the model's prediction for that
variant, and bytes per step per rank as mpitrain counts them (what the rank contributes)
and as the nodes' links counted them (everything on the wire, TCP included) during the training
steps alone: read every 10 ms, between the second epoch's first and last metrics window, so
start-up, epoch ends, evaluation and the summary are left out (the whole run's figure is kept
in the JSON as `run_wire_bytes_per_step`).

The model is then extrapolated to 64, 256 and 1024 ranks on stated networks
(`--model-gbps`, `--model-latency-us`, in pairs; default 100 Gb/s and 1 us, InfiniBand EDR, and
10 Gb/s and 5 us, Ethernet): time and wire bytes per step per rank for dense `allreduce` with and
without overlap (overlap at best hides all but the last bucket), and `sharing` with each
exchange and with `auto` (each rank's message as large as measured).

Targets at 1 Gb/s on the MLP: overlapped `allreduce` >= 1.25x blocking's samples/s;
`sharing` >= 2.0x blocking within 0.5 points of its test accuracy; the model within 25% of
the measured communication time in every row; at 64, 256 and 1024 ranks, on every stated
network, `sharing` with `exchange: auto` at or under blocking dense `allreduce` in time and
in bytes per step per rank.

    sudo python benchmarks/cluster.py --data data/fashion --out benchmarks/results
    python benchmarks/cluster.py --model-only --data data/fashion --out benchmarks/results   # the extrapolation again
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

from mpitrain.config.sections import load_config  # noqa: E402
from mpitrain.data.shards import read_manifest  # noqa: E402
from mpitrain.nn.model import build_model  # noqa: E402
from mpitrain.parallel.costmodel import Network, allgather_exchange, allreduce_bytes, recursive_exchange, split_exchange  # noqa: E402
from mpitrain.parallel.sync.buckets import gradient_buckets  # noqa: E402
from mpitrain.parallel.sync.exchange import choose_exchange  # noqa: E402
from mpitrain.rundir.directory import RunDir  # noqa: E402
from mpitrain.rundir.metrics_file import read_metrics  # noqa: E402
from mpitrain.testing.cluster import SimulatedCluster, missing_capability  # noqa: E402

from common import BIN, HERE, markdown_table, write_results

MODELS = {"MLP": ("configs/fashion_mlp.yaml", 30000), "LeNet": ("configs/fashion_lenet.yaml", 16000)}  # max rows
VARIANTS = {  # name: (sync.mode, overrides)
    "allreduce blocking": ("allreduce", {"sync.overlap": False}),
    "allreduce overlapped": ("allreduce", {"sync.overlap": True}),
    "averaging (5)": ("averaging", {"sync.frequency": 5}),
    "sharing allgather": ("sharing", {"sync.exchange": "allgather"}),
    "sharing split": ("sharing", {"sync.exchange": "split"}),
    "sharing recursive": ("sharing", {"sync.exchange": "recursive"}),
}
BATCH = 64
MODEL_RANKS = (64, 256, 1024)


def main(argv=None) -> dict:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/fashion")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--links", type=float, nargs="+", default=[1.0, 10.0], help="link rates, Gb/s")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 2], help="node counts (1 rank per node)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--two-node-variants", nargs="+", default=["allreduce blocking", "allreduce overlapped",
                                                                   "sharing allgather"],
                        help="the variants run on clusters of fewer than 4 nodes (the MLP only)")
    parser.add_argument("--buckets", type=float, nargs="*", default=[0.0, 0.25, 4.0],
                        help="bucket caps (MB) for extra overlapped rows beside the default's, on the largest cluster "
                             "at the slowest link")
    parser.add_argument("--max-rows", type=int, default=0, help="rows per split instead of the models' (a quick try)")
    parser.add_argument("--model-only", action="store_true",
                        help="train nothing: redo the extrapolation and the table from OUT/cluster.json's rows "
                             "(the measured rows keep their date and machine)")
    parser.add_argument("--model-gbps", type=float, nargs="+", default=[100.0, 10.0],
                        help="the extrapolation's link rates, Gb/s, one per network")
    parser.add_argument("--model-latency-us", type=float, nargs="+", default=[1.0, 5.0],
                        help="the extrapolation's latencies per message, us, one per network")
    args = parser.parse_args(argv)
    if len(args.model_gbps) != len(args.model_latency_us):
        parser.error("--model-gbps and --model-latency-us need as many values: one network each")
    stated = [Network.of(latency, gbps) for gbps, latency in zip(args.model_gbps, args.model_latency_us)]
    if args.model_only:
        with open(os.path.join(args.out, "cluster.json")) as f:
            measured = json.load(f)
        result = {key: measured[key] for key in ("rows", "networks")}
        result.update(model_networks=[network.to_dict() for network in stated],
                      extrapolation=extrapolate(result["rows"], stated, args.data))
        write_results(args.out, "cluster", result, markdown(result), measured.get("machine"))
        return result
    reason = missing_capability()
    if reason:
        sys.exit(f"cluster.py: {reason}")

    rows, networks = [], []
    for gbps in args.links:
        for nodes in args.nodes:
            with SimulatedCluster(nodes=nodes, link_gbps=gbps) as cluster:
                network, probe = measure_network(cluster)
                networks.append({"nodes": nodes, "link_gbps": gbps, "fit": network.to_dict(),
                                 "pingpong": Network.from_pingpong(probe["pingpong"]).to_dict(), "probe": probe})
                sweep = nodes == max(args.nodes) and gbps == min(args.links)
                for model in args.models if nodes >= 4 else ["MLP"]:
                    variants = list(VARIANTS) if nodes >= 4 else args.two_node_variants
                    variants += [f"allreduce overlapped {cap:g} MB" for cap in args.buckets] if sweep else []
                    for variant in variants:
                        row = train_row(cluster, args.data, model, variant, network, args.max_rows)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    result = {"rows": rows, "networks": networks, "model_networks": [network.to_dict() for network in stated],
              "extrapolation": extrapolate(rows, stated, args.data)}
    write_results(args.out, "cluster", result, markdown(result))
    return result


def variant_settings(variant: str) -> tuple[str, dict]:
    """(sync.mode, overrides) of a variant: one of VARIANTS, or "allreduce overlapped CAP MB"."""
    if variant in VARIANTS:
        return VARIANTS[variant]
    return "allreduce", {"sync.overlap": True, "sync.bucket_mb": float(variant.split()[2])}


def measure_network(cluster) -> tuple[Network, dict]:
    """Run the probe on every node; the network fitted to its Allreduces, and the probe's figures.

    The probe's nodes are not pinned to a core each: it measures the links, and two probe ranks on one core,
    each busy-waiting in MPI in turn, would measure the core's sharing instead (docs/cluster.md). Training runs
    pinned, as nodes with cores of their own."""
    probe = cluster.mpiexec(cluster.size, sys.executable, os.path.join(HERE, "network_probe.py"), timeout=600,
                            env=cluster.environment(pinned=False))
    if probe.returncode:
        sys.exit(f"network_probe.py failed: {probe.stderr[-2000:]}")
    figures = json.loads(probe.stdout.strip().splitlines()[-1])
    return Network.fit(figures["allreduce"], cluster.size), figures


def train_row(cluster, data: str, model: str, variant: str, network: Network, max_rows: int = 0) -> dict:
    """Train `model` with `variant` on every node (2 epochs; `max_rows` rows per split, 0: the model's); its row."""
    config_path, model_rows = MODELS[model]
    max_rows = max_rows or model_rows
    mode, extra = variant_settings(variant)
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = {"data.path": data, "data.max_rows": max_rows, "run_dir": run_dir, "resume": "never",
                     "train.epochs": 2, "train.batch_size": BATCH, "train.log_every": 10, "sync.mode": mode,
                     "report": False, "checkpoint.every": 100, **extra}
        with cluster.link_samples() as links:
            before = cluster.bytes_on_links()
            result = cluster.mpiexec(cluster.size, os.path.join(BIN, "mpitrain"), "train", config_path,
                                     *[f"--set={k}={v}" for k, v in overrides.items()], timeout=900)
            after = cluster.bytes_on_links()
        if result.returncode:
            sys.exit(f"{model} {variant} failed on {cluster.description}:\n{result.stderr[-3000:]}")
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        windows = [w for w in read_metrics(RunDir(run_dir).metrics)[0] if w["epoch"] == 1]
        config = load_config(config_path, [f"{k}={v}" for k, v in overrides.items()])
    steps = sum(w["samples"] for w in windows) / (BATCH * cluster.size)
    seconds = sum(w["samples"] / w["samples_per_s"] for w in windows)
    measured = sum(w["comm_ms_per_step"] * w["samples"] for w in windows) / sum(w["samples"] for w in windows)
    sent = np.average([w["bytes_sent_per_step"] for w in windows], weights=[w["samples"] for w in windows])
    message = message_bytes(windows, summary["n_params"]) if mode == "sharing" else None
    tx = sum(after[node]["tx"] - before[node]["tx"] for node in cluster.nodes) / cluster.size
    all_steps = summary["steps_per_epoch"] * 2
    return {"model": model, "nodes": cluster.size, "link_gbps": cluster.link_gbps, "variant": variant,
            "sync": mode, "overlap": mode == "allreduce" and extra.get("sync.overlap", True),
            "exchange": extra.get("sync.exchange"), "samples_per_s": sum(w["samples"] for w in windows) / seconds,
            "comm_ms_measured": measured, "mpi_ms_measured": float(np.mean([w["mpi_ms_per_step"] for w in windows])),
            "comm_ms_model": 1e3 * modelled_seconds(network, config, summary, variant, sent, message, cluster.size),
            "bytes_per_step": sent, "message_bytes": message,
            "wire_bytes_per_step": links.per_training_step(windows),  # 1 rank per node
            "run_wire_bytes_per_step": tx / all_steps, "steps": steps,
            "test_accuracy": summary["test_accuracy"], "n_params": summary["n_params"],
            "exchanges": sorted({w.get("exchange") for w in windows if w.get("exchange")})}


def message_bytes(windows: list[dict], n: int) -> float:
    """A rank's mean threshold message in `sharing` windows, in bytes: the 16-byte header and a body of 4 bytes per
    element sent, or the bitmap's n/16 words once that is smaller (the `auto` encoding)."""
    counts = [w["sparsity"] * n for w in windows]  # sparsity: the share of all ranks' elements sent
    return float(np.mean([16 + 4 * min(c, -(-n // 16)) for c in counts]))


def modelled_seconds(network: Network, config, summary: dict, variant: str, sent: float, message: float | None,
                     ranks: int) -> float:
    """The cost model's communication seconds per step for the run of `summary` (`sent`: bytes sent per step;
    `message`: sharing's message bytes)."""
    dense = 4 * summary["n_params"]
    if variant == "allreduce blocking":
        return network.allreduce(dense, ranks)
    if variant.startswith("allreduce overlapped"):
        return sum(network.allreduce(4 * (end - begin), ranks) for begin, end in buckets(config))
    if variant.startswith("averaging"):  # Allreduces of the whole buffer every `frequency` steps
        allreduces = round(sent * config.sync.frequency / dense)
        return allreduces * network.allreduce(dense, ranks) / config.sync.frequency
    sizes = [message] * ranks
    if variant == "sharing allgather":
        return allgather_exchange(network, sizes)[0]
    if variant == "sharing recursive":
        return recursive_exchange(network, sizes, summary["n_params"])[0]
    return split_exchange(network, sizes, summary["n_params"], 4)[0]


def buckets(config) -> list[tuple[int, int]]:
    """The overlapped run's gradient buckets (the model built from its config)."""
    manifest = read_manifest(config.data.path)
    model = build_model(config.model, manifest.feature_shape, manifest.num_classes, np)
    return gradient_buckets(model.layout, config.sync.bucket_mb * 1e6, 4)


def extrapolate(rows: list[dict], networks: list[Network], data: str) -> list[dict]:
    """Per model and network, time and wire bytes per step per rank at MODEL_RANKS, from the measured message sizes
    of the 4-node, slowest-link runs."""
    out = []
    for model in sorted({r["model"] for r in rows}):
        basis = [r for r in rows if r["model"] == model and r["nodes"] == max(x["nodes"] for x in rows)]
        slow = min(r["link_gbps"] for r in basis)
        sharing = next(r for r in basis if r["variant"] == "sharing allgather" and r["link_gbps"] == slow)
        config = load_config(MODELS[model][0], [f"data.path={data}"])
        tail = buckets(config)[-1]
        n, message = sharing["n_params"], sharing["message_bytes"]
        dense = 4 * n
        for network in networks:
            for ranks in MODEL_RANKS:
                sizes = [message] * ranks
                exchanges = {"allgather": allgather_exchange(network, sizes),
                             "split": split_exchange(network, sizes, n, 4),
                             "recursive": recursive_exchange(network, sizes, n)}
                chosen = choose_exchange("auto", network, [message // 4] * ranks, n, 4)  # sizes in int32s
                cells = [("allreduce", "blocking", network.allreduce(dense, ranks), allreduce_bytes(dense, ranks)),
                         ("allreduce", "overlapped (all but the last bucket hidden)",
                          network.allreduce(4 * (tail[1] - tail[0]), ranks), allreduce_bytes(dense, ranks))]
                cells += [("sharing", name, *cost) for name, cost in exchanges.items()]
                cells.append(("sharing", f"auto (chooses {chosen})", *exchanges[chosen]))
                out += [{"model": model, "ranks": ranks, "network": network.to_dict(), "sync": sync, "variant": variant,
                         "ms": 1e3 * seconds, "wire_bytes": wire} for sync, variant, seconds, wire in cells]
    return out


def markdown(result: dict) -> str:
    """The measured table, the targets' verdicts, and the extrapolation."""
    rows = result["rows"]
    measured = markdown_table(
        ["model", "nodes", "link Gb/s", "sync", "samples/s", "comm ms measured", "comm ms model", "model error",
         "ms inside MPI", "bytes/step/rank", "wire bytes/step/rank", "test acc"],
        [[r["model"], str(r["nodes"]), f"{r['link_gbps']:g}", r["variant"], f"{r['samples_per_s']:.0f}",
          f"{r['comm_ms_measured']:.2f}", f"{r['comm_ms_model']:.2f}",
          f"{100 * (r['comm_ms_model'] / r['comm_ms_measured'] - 1):+.0f}%", f"{r['mpi_ms_measured']:.2f}",
          f"{r['bytes_per_step']:.0f}",
          f"{r['wire_bytes_per_step']:.0f}", f"{r['test_accuracy']:.4f}"] for r in rows], "lrrlrrrrrrrr")
    networks = "; ".join(f"{n['nodes']} nodes at {n['link_gbps']:g} Gb/s: fitted {n['fit']['latency_us']:.0f} us, "
                         f"{n['fit']['gbps']:.2f} Gb/s (ping-pong {n['pingpong']['gbps']:.2f} Gb/s)"
                         for n in result["networks"])
    extrapolated = []
    for network in result["model_networks"]:
        cells = [r for r in result["extrapolation"] if r["network"] == network]
        extrapolated += [f"Modelled at {network['gbps']:g} Gb/s and {network['latency_us']:g} us per message:", "",
                         markdown_table(["model", "ranks", "sync", "exchange / overlap", "comm ms/step",
                                         "wire MB/step/rank"],
                                        [[r["model"], str(r["ranks"]), r["sync"], r["variant"], f"{r['ms']:.2f}",
                                          f"{r['wire_bytes'] / 1e6:.2f}"] for r in cells], "lrllrr"), ""]
    return (f"Simulated nodes (network namespaces, tbf-shaped links, no added delay), 1 rank per node, MPICH over "
            f"TCP; batch {BATCH} per rank; the second of 2 epochs measured. Wire bytes: what the links carried per "
            + ("training step and rank (TCP included), between the second epoch's first and last metrics window: "
               "start-up, epoch ends and evaluation left out" if all("run_wire_bytes_per_step" in r for r in rows)
               else "step and rank over the whole run (TCP, start-up, epoch ends and evaluation included)")
            + ".\n\n"
            f"Networks as fitted (Allreduce over sizes): {networks}.\n\n{measured}\n\n{verdicts(rows)}\n\n"
            + "\n".join(extrapolated) + f"\n{auto_verdicts(result['extrapolation'])}\n")


def verdicts(rows: list[dict]) -> str:
    """The targets, met or not, from the rows."""
    lines = []
    for gbps in sorted({r["link_gbps"] for r in rows}):
        mlp = {r["variant"]: r for r in rows if r["model"] == "MLP" and r["nodes"] == 4 and r["link_gbps"] == gbps}
        if gbps != 1.0 or "allreduce blocking" not in mlp:
            continue
        blocking = mlp["allreduce blocking"]
        for variant, target in (("allreduce overlapped", 1.25), ("sharing allgather", 2.0), ("sharing split", 2.0),
                                ("sharing recursive", 2.0)):
            if variant in mlp:
                r = mlp[variant]
                ratio, points = r["samples_per_s"] / blocking["samples_per_s"], 100 * (r["test_accuracy"] -
                                                                                     blocking["test_accuracy"])
                lines.append(f"- MLP, 4 nodes, 1 Gb/s: {variant} {ratio:.2f}x blocking allreduce "
                             f"(target {target}x), test accuracy {points:+.2f} points")
    worst = max(rows, key=lambda r: abs(r["comm_ms_model"] / r["comm_ms_measured"] - 1))
    lines.append(f"- the model's largest error: {100 * (worst['comm_ms_model'] / worst['comm_ms_measured'] - 1):+.0f}% "
                 f"({worst['model']}, {worst['nodes']} nodes, {worst['link_gbps']:g} Gb/s, {worst['variant']}; "
                 "target within 25%)")
    return "\n".join(lines)


def auto_verdicts(extrapolation: list[dict]) -> str:
    """Per model and network: whether `sharing` with `auto` is at or under blocking `allreduce` in time and bytes at
    every extrapolated rank count."""
    lines = []
    for model in sorted({r["model"] for r in extrapolation}):
        for network in {json.dumps(r["network"], sort_keys=True): r["network"] for r in extrapolation}.values():
            cells = [r for r in extrapolation if r["model"] == model and r["network"] == network]
            ratios = []
            for ranks in sorted({r["ranks"] for r in cells}):
                dense = next(r for r in cells if r["ranks"] == ranks and r["variant"] == "blocking")
                auto = next(r for r in cells if r["ranks"] == ranks and r["variant"].startswith("auto"))
                ratios.append((ranks, auto["ms"] / dense["ms"], auto["wire_bytes"] / dense["wire_bytes"]))
            met = all(time <= 1 and nbytes <= 1 for _, time, nbytes in ratios)
            lines.append(f"- {model}, {network['gbps']:g} Gb/s, {network['latency_us']:g} us: sharing auto / blocking "
                         "allreduce, time and bytes: " + ", ".join(f"{ranks} ranks {time:.2f}x, {nbytes:.2f}x"
                                                                   for ranks, time, nbytes in ratios)
                         + f" (target at or under 1.00x: {'met' if met else 'NOT met'})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
