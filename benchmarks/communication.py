"""Bytes sent per rank per step, and test accuracy, for each sync mode on the Fashion-MNIST MLP.

Runs `allreduce`, `averaging` (frequency 5) and `sharing` for `--epochs` (default 5) on 2
and 4 ranks, and for the samples/s comparison 1-epoch runs of `sharing` and PyTorch DDP on 2
ranks, taking turns (`--repeat` rounds, the median of each), in the same invocation.

Targets: `sharing` sends at most 1% of the bytes of `allreduce`, with test accuracy within
0.5 points of it; samples/s with `sharing` at least 1.5x PyTorch DDP's on 2 ranks.

    python benchmarks/communication.py --data data/fashion --out benchmarks/results
"""
from __future__ import annotations

import argparse

from throughput import model_rows

from common import benchmark_parser, markdown_table, run_mpitrain, torch_available, write_results

MODES = [("allreduce", {}), ("averaging", {"sync.frequency": 5}), ("sharing", {})]


def main(argv=None) -> dict:
    parser = benchmark_parser(__doc__, epochs=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=5, help="interleaved 1-epoch runs of sharing and DDP")
    args = parser.parse_args(argv)

    rows = []
    for ranks in args.ranks:
        baseline = None
        for mode, extra in MODES:
            s = run_mpitrain(args, ranks, mode, extra, args.epochs)
            baseline = baseline or s
            rows.append({"ranks": ranks, "mode": mode, "bytes_sent_per_step": s["bytes_sent_per_step"],
                         "bytes_vs_allreduce": s["bytes_sent_per_step"] / baseline["bytes_sent_per_step"],
                         "test_accuracy": s["test_accuracy"],
                         "accuracy_vs_allreduce": s["test_accuracy"] - baseline["test_accuracy"],
                         "samples_per_s": s["samples_per_s"]})
    result = {"epochs": args.epochs, "rows": rows}
    if torch_available() and 2 in args.ranks:
        one_epoch = argparse.Namespace(**{**vars(args), "epochs": 1})
        sharing, ddp = model_rows("MLP", one_epoch, 2, [(2, "sharing", {})], with_ddp=True)
        result["sharing_vs_ddp_2_ranks"] = {"ddp_samples_per_s": ddp["samples_per_s"],
                                            "sharing_samples_per_s": sharing["samples_per_s"],
                                            "ratio": sharing["vs_ddp"], "repeat": args.repeat}
    write_results(args.out, "communication", result, markdown(result))
    return result


def markdown(result: dict) -> str:
    rows = [[str(r["ranks"]), r["mode"], f"{r['bytes_sent_per_step']:.0f}", f"{100 * r['bytes_vs_allreduce']:.2f}%",
             f"{r['test_accuracy']:.4f}", f"{100 * r['accuracy_vs_allreduce']:+.2f} pt", f"{r['samples_per_s']:.0f}"]
            for r in result["rows"]]
    lines = [f"Fashion-MNIST MLP, {result['epochs']} epochs, batch 64 per rank", "",
             markdown_table(["ranks", "sync", "bytes/step/rank", "vs allreduce", "test acc", "acc - allreduce",
                             "samples/s"], rows, "rlrrrrr")]
    if "sharing_vs_ddp_2_ranks" in result:
        c = result["sharing_vs_ddp_2_ranks"]
        lines += ["", f"2 ranks, 1 epoch, median of {c.get('repeat', 1)} interleaved runs: sharing "
                      f"{c['sharing_samples_per_s']:.0f} samples/s, PyTorch DDP {c['ddp_samples_per_s']:.0f} "
                      f"samples/s: {c['ratio']:.2f}x"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
