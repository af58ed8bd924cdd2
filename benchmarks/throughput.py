"""Throughput of the Fashion-MNIST MLP: samples/s per sync mode on 1 and 2 ranks, beside PyTorch DDP.

Every run uses the same config (configs/fashion_mlp.yaml: 784-500-500-10, SGD momentum 0.9,
batch 64 per rank), the same HDF5 shards and 1 thread per rank. PyTorch DDP (gloo, CPU)
runs in the same invocation when torch is installed, so ratios compare like with like; the
engines take turns (`--repeat` rounds) and each row is the median, so the machine's drift
reaches every engine alike.

Targets, 2 ranks on 2 cores, 1 epoch: `allreduce` >= 1.0x DDP's samples/s; `averaging`
(frequency 5) >= 1.5x DDP with test accuracy within 0.5 points of DDP's. With
`--accuracy-epochs 10`: the MLP reaches >= 0.895 test accuracy.

    python benchmarks/throughput.py --data data/fashion --out benchmarks/results
"""
from __future__ import annotations

from common import benchmark_parser, markdown_table, run_ddp, run_mpitrain, torch_available, write_results

RUNS = [(1, "none", {}), (1, "allreduce", {}), (1, "averaging", {"sync.frequency": 5}),
        (2, "none", {}), (2, "allreduce", {}), (2, "averaging", {"sync.frequency": 5})]


def median_run(runs: list[dict]) -> dict:
    """The run with the median samples/s."""
    return sorted(runs, key=lambda r: r["samples_per_s"])[len(runs) // 2]


def main(argv=None) -> dict:
    parser = benchmark_parser(__doc__, epochs=1)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per row; the median counts")
    parser.add_argument("--accuracy-epochs", type=int, default=10, help="0 skips the accuracy run")
    args = parser.parse_args(argv)

    rows, with_ddp = [], torch_available()
    for ranks in (1, 2):
        # Interleaved repeats, median per row: the machine's speed drifts, and every engine sees the drift.
        measures = {label: [] for label in ["ddp", *[mode for n, mode, _ in RUNS if n == ranks]]}
        for _ in range(args.repeat):
            if with_ddp:
                measures["ddp"].append(run_ddp(args, ranks, args.epochs))
            for n, mode, extra in RUNS:
                if n == ranks:
                    measures[mode].append(run_mpitrain(args, n, mode, extra, args.epochs))
        ddp = median_run(measures["ddp"]) if with_ddp else None
        for n, mode, extra in RUNS:
            if n != ranks:
                continue
            s = median_run(measures[mode])
            rows.append({"engine": "mpitrain", "ranks": n, "mode": mode + (" (frequency 5)" if extra else ""),
                         "samples_per_s": s["samples_per_s"], "test_accuracy": s["test_accuracy"],
                         "bytes_sent_per_step": s["bytes_sent_per_step"],
                         "vs_ddp": s["samples_per_s"] / ddp["samples_per_s"] if ddp else None})
        if ddp:
            rows.append({"engine": "pytorch-ddp", "ranks": ranks, "mode": "DDP gloo",
                         "samples_per_s": ddp["samples_per_s"], "test_accuracy": ddp["test_accuracy"],
                         "bytes_sent_per_step": None, "vs_ddp": 1.0})
    result = {"epochs": args.epochs, "repeat": args.repeat, "config": args.config, "rows": rows}
    if args.accuracy_epochs:
        s = run_mpitrain(args, 2, "allreduce", {}, args.accuracy_epochs)
        result["accuracy_run"] = {"ranks": 2, "mode": "allreduce", "epochs": args.accuracy_epochs,
                                  "test_accuracy": s["test_accuracy"], "samples_per_s": s["samples_per_s"]}
    write_results(args.out, "throughput", result, markdown(result))
    return result


def markdown(result: dict) -> str:
    rows = [[r["engine"], str(r["ranks"]), r["mode"], f"{r['samples_per_s']:.0f}",
             f"{r['vs_ddp']:.2f}x" if r["vs_ddp"] else "-", f"{r['test_accuracy']:.4f}",
             f"{r['bytes_sent_per_step']:.0f}" if r["bytes_sent_per_step"] is not None else "-"]
            for r in result["rows"]]
    lines = [f"Fashion-MNIST MLP, {result['epochs']} epoch(s), batch 64 per rank, 1 thread per rank; each row the "
             f"median of {result['repeat']} runs, interleaved with the other engines", "",
             markdown_table(["engine", "ranks", "sync", "samples/s", "vs DDP", "test acc", "bytes/step/rank"],
                            rows, "lrlrrrr")]
    if "accuracy_run" in result:
        a = result["accuracy_run"]
        lines += ["", f"Accuracy run: {a['ranks']} ranks, {a['mode']}, {a['epochs']} epochs: "
                      f"test accuracy {a['test_accuracy']:.4f}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
