"""Scaling over 1, 2 and 4 ranks per sync mode, and the communication cost model up to 1024 ranks.

Measured, on the Fashion-MNIST MLP: samples/s for `allreduce`, `averaging` (frequency 5) and
`sharing` on 1, 2 and 4 ranks; efficiency = samples/s at N / (N x samples/s at 1 rank) of the
same mode. Ranks beyond the machine's cores (4 on 2 cores) are oversubscribed: they share
cores, so efficiency there measures the machine, not mpitrain; the output says so.

Modelled, for N ranks on a network of `--bandwidth-gbps` (default 100 Gb/s, InfiniBand EDR)
with `--latency-us` per message, by the cost model of record (`mpitrain.parallel.costmodel`,
through `mpitrain.testing.scaling_model`) from the bytes each rank sent per step (measured,
largest N):
- Allreduce bytes (every step in `allreduce`, every 5 steps in `averaging`, epoch ends):
  bytes / (4 x params) full-buffer (float32) Allreduces per step, each as MPICH runs it
  (reduce-scatter + allgather: 2 (N-1)/N x bytes per rank in 2 log2 N messages).
- `sharing` step messages: the exchange `sync.exchange: auto` picks at N ranks (allgather,
  split or recursive) for every rank's message as large as measured (tau keeps each rank's
  message in the same sparsity band whatever N).
Communication seconds per step against the compute seconds per step measured on 1 rank (no
overlap assumed).

    python benchmarks/scaling.py --data data/fashion --out benchmarks/results [--set data.max_rows=6000]
    python benchmarks/scaling.py --model-only --out benchmarks/results   # the model again, from scaling.json's rows
"""
from __future__ import annotations

import json
import os
from statistics import mean

from mpitrain.base.errors import MpitrainError
from mpitrain.config.sections import load_config
from mpitrain.parallel.costmodel import Network
from mpitrain.testing.scaling_model import cost

from common import CORES, benchmark_parser, best_of, markdown_table, run_mpitrain, write_results

MODES = [("allreduce", {}), ("averaging", {"sync.frequency": 5}), ("sharing", {})]
MODEL_RANKS = [2 ** i for i in range(1, 11)]  # 2 .. 1024, for the plot


def main(argv=None) -> dict:
    parser = benchmark_parser(__doc__, epochs=1)
    parser.add_argument("--repeat", type=int, default=2, help="runs per row; the fastest counts")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="measured; must include 1")
    parser.add_argument("--extrapolate", type=int, nargs="+", default=[64, 256, 1024], help="modelled rank counts")
    parser.add_argument("--bandwidth-gbps", type=float, default=100.0, help="network bandwidth per rank, Gb/s")
    parser.add_argument("--latency-us", type=float, default=1.0, help="latency per message, microseconds")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="extra override for every run, e.g. data.max_rows=6000; repeatable")
    parser.add_argument("--model-only", action="store_true",
                        help="run nothing: redo the model, the table and the plot from OUT/scaling.json's rows (which "
                             "keep their date and machine)")
    args = parser.parse_args(argv)
    network = Network.of(args.latency_us, args.bandwidth_gbps)
    if args.model_only:
        with open(os.path.join(args.out, "scaling.json")) as f:
            measured = json.load(f)
        result = {**{key: value for key, value in measured.items() if key != "machine"},
                  "bandwidth_gbps": args.bandwidth_gbps, "latency_us": args.latency_us,
                  "model": [cost(r, n, network) for r in basis(measured["rows"]) for n in args.extrapolate]}
        write_results(args.out, "scaling", result, markdown(result), measured.get("machine"))
        plot(result, os.path.join(args.out, "scaling.png"))
        return result
    if 1 not in args.ranks:
        parser.error("--ranks must include 1: efficiency is relative to 1 rank")
    try:
        batch_size = load_config(args.config, args.set).train.batch_size
    except MpitrainError as e:
        parser.error(str(e))
    overrides = dict(item.split("=", 1) for item in args.set)

    rows = []
    for mode, extra in MODES:
        for ranks in sorted(args.ranks):
            s = best_of(args.repeat, lambda: run_mpitrain(args, ranks, mode, {**extra, **overrides}, args.epochs))
            rows.append({"mode": mode, "ranks": ranks, "samples_per_s": s["samples_per_s"],
                         "bytes_sent_per_step": s["bytes_sent_per_step"], "n_params": s["n_params"],
                         "step_bytes_sent_per_step": mean(w["bytes_sent_per_step"] for w in s["windows"]),
                         "test_accuracy": s["test_accuracy"], "oversubscribed": ranks > CORES})
    for r in rows:
        single = next(o for o in rows if o["mode"] == r["mode"] and o["ranks"] == 1)
        r["efficiency"] = r["samples_per_s"] / (r["ranks"] * single["samples_per_s"])
        r["compute_s_per_step"] = batch_size / single["samples_per_s"]
    result = {"epochs": args.epochs, "repeat": args.repeat, "config": args.config, "overrides": overrides,
              "cores": CORES, "bandwidth_gbps": args.bandwidth_gbps, "latency_us": args.latency_us, "rows": rows,
              "model": [cost(r, n, network) for r in basis(rows) for n in args.extrapolate]}
    write_results(args.out, "scaling", result, markdown(result))
    plot(result, os.path.join(args.out, "scaling.png"))
    return result


def basis(rows: list[dict]) -> list[dict]:
    """Per mode, the measurement the model starts from: the one with the most ranks."""
    return [max((r for r in rows if r["mode"] == mode), key=lambda r: r["ranks"]) for mode, _ in MODES]


def markdown(result: dict) -> str:
    measured = markdown_table(
        ["sync", "ranks", "samples/s", "efficiency", "bytes/step/rank", "test acc"],
        [[r["mode"], f"{r['ranks']}{' (oversubscribed)' if r['oversubscribed'] else ''}",
          f"{r['samples_per_s']:.0f}", f"{100 * r['efficiency']:.0f}%", f"{r['bytes_sent_per_step']:.0f}",
          f"{r['test_accuracy']:.4f}"] for r in result["rows"]], "lrrrrr")
    model = markdown_table(
        ["sync", "ranks", "exchange", "messages/step/rank", "wire MB/step/rank", "comm ms/step",
         "compute ms/step", "est. efficiency"],
        [[m["mode"], str(m["ranks"]), exchange_cell(m), f"{m['messages_per_step']:.0f}",
          f"{m['wire_bytes_per_step'] / 1e6:.3f}", f"{1e3 * m['comm_s_per_step']:.3f}",
          f"{1e3 * m['compute_s_per_step']:.2f}", f"{100 * m['efficiency']:.0f}%"] for m in result["model"]],
        "lrlrrrrr")
    oversubscribed = sorted({r["ranks"] for r in result["rows"] if r["oversubscribed"]})
    notes = [f"Each row: the fastest of {result['repeat']} runs of {result['epochs']} epoch(s) on {result['cores']} cores"
             + "".join(f", --set {key}={value}" for key, value in result["overrides"].items())
             + (f"; {', '.join(map(str, oversubscribed))} ranks are OVERSUBSCRIBED (more ranks than cores)"
                if oversubscribed else "") + "."]
    model_note = (f"Model: {result['bandwidth_gbps']:g} Gb/s, {result['latency_us']:g} us per message; the cost "
                  "model of record (mpitrain/parallel/costmodel.py): Allreduces as MPICH runs them, sharing's step "
                  "by the exchange auto picks at N ranks for messages as measured, epoch ends' Allreduces beside; "
                  "compute per step from 1 rank; no overlap of compute and communication.")
    return "\n".join([*notes, "", measured, "", model_note, "", model, ""])


def exchange_cell(m: dict) -> str:
    """What crosses the network per step: Allreduces of the whole buffer, and sharing's exchange."""
    allreduces = f"Allreduce x{m['allreduces_per_step']:.3g}"
    return allreduces if m["exchange"] == "allreduce" else f"{m['exchange']} + {allreduces}"


def plot(result: dict, path: str) -> None:
    """scaling.png: measured samples/s and efficiency, and modelled communication seconds per step."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(15, 4.5), layout="constrained")
    speed, efficiency, model = fig.subplots(1, 3)
    for i, (mode, _) in enumerate(MODES):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        ranks = [r["ranks"] for r in rows]
        speed.plot(ranks, [r["samples_per_s"] for r in rows], "o-", color=f"C{i}", label=mode)
        efficiency.plot(ranks, [r["efficiency"] for r in rows], "o-", color=f"C{i}", label=mode)
        basis_row = next(r for r in basis(result["rows"]) if r["mode"] == mode)
        network = Network.of(result["latency_us"], result["bandwidth_gbps"])
        seconds = [cost(basis_row, n, network)["comm_s_per_step"] for n in MODEL_RANKS]
        model.plot(MODEL_RANKS, seconds, "o-", color=f"C{i}", label=mode)
    model.axhline(result["rows"][0]["compute_s_per_step"], color="gray", ls=":", label="compute per step (1 rank)")
    model.set_xscale("log", base=2)
    model.set_yscale("log")
    model.set_xticks(MODEL_RANKS, [str(n) for n in MODEL_RANKS])
    measured = sorted({r["ranks"] for r in result["rows"]})
    for ax in (speed, efficiency):
        ax.set_xticks(measured)
        if measured[-1] > result["cores"]:
            ax.axvspan(result["cores"] + 0.5, measured[-1] + 0.5, color="gray", alpha=0.15,
                       label=f"oversubscribed: more ranks than the {result['cores']} cores")
    speed.set(title="measured throughput", xlabel="ranks", ylabel="samples/s (all ranks)")
    efficiency.set(title="measured efficiency", xlabel="ranks", ylabel="samples/s / (N x samples/s at 1 rank)")
    model.set(title=f"modelled communication, {result['bandwidth_gbps']:g} Gb/s, {result['latency_us']:g} us",
              xlabel="ranks", ylabel="seconds per step")
    for ax in (speed, efficiency, model):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
