"""Embedding tables sharded by rows (issue 49): memory per rank, speed beside the replicated table, the cost model at
scale, and accuracy. Every run is `mpiexec -n N mpitrain train CONFIG --set ...`, as the README starts one.

- **Memory**: one table of 2^24 rows x 32 (2 GiB of float32 values; 8 GiB with gradients and Adam's two moments)
  on a click table (`mpitrain.testing.datasets.make_click_dataset`: Zipf-like ids, a true effect per id), sharded
  over 1, 2, 4 and 8 ranks (8 on 2 cores is oversubscribed), Adam, `--memory-steps` steps of 256 rows per rank:
  each run's peak RSS of its largest rank (summary.json's `peak_rss_mb`), beside the replicated table on 1 rank.
  Then 4 ranks inside one memory cgroup (made here, as root: cgroup v1 or v2) of 4 x 4 GiB: the sharded run trains
  there; the replicated one is refused before it allocates, in one line (the model's memory check reads the
  cgroup's limit, `mpitrain.nn.model.rank_memory_bytes`).
- **Speed**: a 10^6-row table beside a 1,000-row one, dim 16 (benchmarks/embeddings.py's model), plain SGD, on 2
  and 4 ranks (4 oversubscribed): sharded beside replicated with the sparse exchange (`sync.embeddings: auto`).
  Samples/s and bytes sent per step and rank after the first metrics window, measured by the communicator (which
  counts an Alltoallv's parts sent to other ranks, and a rank's own Allgatherv message once). Each row the median
  of `--repeat` runs, in turns.
- **Cost model** (`mpitrain.parallel.costmodel`): one step of a 10^8 x 32 table at 64, 256 and 1024 ranks on
  1 us / 100 Gb/s links, 512 distinct ids per rank's batch: sharded (three Alltoallv), replicated with the sparse
  exchange (an Allgatherv), replicated dense (an Allreduce of the table), and each one's memory per rank.
- **Accuracy**: the click table with a user column of 10^6 ids (and one of 100), sharded beside replicated on 2
  ranks, plain SGD: the test AUC of both (the same model: equal to the last digit) against the Bayes AUC of the
  true probabilities.

    python benchmarks/sharded_tables.py --out benchmarks/results [--repeat 3]
    python benchmarks/sharded_tables.py --quick      # small tables, a few steps: checks the script
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from sklearn.metrics import roc_auc_score

from mpitrain.parallel.costmodel import Network, replicated_table_step, sharded_table_step
from mpitrain.testing.datasets import make_click_dataset

from common import BIN, CORES, USER_ENV, in_turns, markdown_table, median_run, train, write_results

DIM_MEMORY, DIM = 32, 16
CGROUP_RANK_BYTES = 4 * 2**30
NETWORK = {"latency_us": 1.0, "gbps": 100.0}
SCALE = {"rows": 10**8, "dim": 32, "distinct": 512, "ranks": (64, 256, 1024)}
FULL = {"memory_ids": 2**24, "memory_ranks": (1, 2, 4, 8), "memory_steps": 20, "speed_ids": (1000, 10**6),
        "speed_steps": 300, "speed_ranks": (2, 4), "accuracy_ids": (100, 10**6), "accuracy_rows": 500_000}
QUICK = {"memory_ids": 2**16, "memory_ranks": (1, 2), "memory_steps": 4, "speed_ids": (100, 10**4),
         "speed_steps": 40, "speed_ranks": (2,), "accuracy_ids": (100, 10**4), "accuracy_rows": 20_000}


def graph(shard: str, dim: int) -> list:
    return [{"name": "emb", "type": "embedding", "input": "categorical", "dim": dim, "shard": shard},
            {"name": "flat", "type": "flatten", "input": "emb"},
            {"name": "joined", "type": "concat", "inputs": ["flat", "numeric"]},
            {"name": "hidden", "type": "dense", "input": "joined", "units": 32, "activation": "relu"},
            {"name": "out", "type": "dense", "input": "hidden", "units": 1}]


def write_config(path: str, data: str, optimizer: dict, batch: int = 256) -> str:
    with open(path, "w") as f:
        json.dump({"data": {"path": data}, "model": {"graph": graph("none", DIM), "loss": "binary_cross_entropy"},
                   "optimizer": optimizer, "train": {"epochs": 1, "batch_size": batch, "seed": 0},
                   "report": False}, f)
    return path


def run(ranks: int, config: str, shard: str, dim: int, overrides: dict) -> dict:
    return train(ranks, config, {"model.graph": graph(shard, dim), **overrides})


def memory(work: str, sizes: dict) -> dict:
    """Peak RSS per rank of the sharded table over each rank count and the replicated one on 1 rank; then the cgroup
    runs."""
    data = os.path.join(work, "memory")
    make_click_dataset(data, n_train=40_000, n_test=2_000, ids=(sizes["memory_ids"],))
    config = write_config(os.path.join(work, "memory.yaml"), data, {"type": "adam", "lr": 0.001})
    rows = []
    for shard, ranks in [("rows", r) for r in sizes["memory_ranks"]] + [("none", 1)]:
        print(f"memory: {shard} on {ranks} ranks", file=sys.stderr)
        summary, failure = attempt(ranks, config, shard, {"data.max_rows": sizes["memory_steps"] * 256 * ranks})
        rows.append({"shard": shard, "ranks": ranks, "oversubscribed": ranks > CORES, "failure": failure,
                     "peak_rss_mb": summary["peak_rss_mb"] if summary else None})
    return {"rows": rows, "cgroup": in_cgroup(work, config, sizes)}


def attempt(ranks: int, config: str, shard: str, overrides: dict, prefix: list[str] = ()) -> tuple[dict | None, str]:
    """A memory run: (its summary, "") or, where it failed, (None, why: its one line, or the kernel's kill)."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [*prefix, os.path.join(BIN, "mpiexec"), "-n", str(ranks), os.path.join(BIN, "mpitrain"), "train",
                   config, f"--set=run_dir={scratch}", "--set=train.log_every=1000",
                   f"--set=model.graph={json.dumps(graph(shard, DIM_MEMORY))}",
                   *[f"--set={key}={value}" for key, value in overrides.items()]]
        done = subprocess.run(command, env=USER_ENV, capture_output=True, text=True)
        if not done.returncode:
            with open(os.path.join(scratch, "summary.json")) as f:
                return json.load(f), ""
    if "signal 9" in done.stdout + done.stderr:  # MPICH: "Killed (signal 9)"
        trained = "epoch 1/1 done" in done.stderr  # after its evaluation: in the checkpoint write
        return None, "killed by the kernel (out of memory)" + (" after training, writing its checkpoint" if trained
                                                                else "")
    errors = [line.split("] ", 1)[-1] for line in done.stderr.splitlines() if "error" in line.lower()]
    return None, (errors or done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def in_cgroup(work: str, config: str, sizes: dict) -> dict:
    """4 ranks in a memory cgroup of 4 x CGROUP_RANK_BYTES: the sharded run, and the replicated one's refusal."""
    folder = make_cgroup(4 * CGROUP_RANK_BYTES)
    if folder is None:
        return {"measured": False, "why": "no writable memory cgroup here (cgroup v1 or v2, as root)"}
    enter = ["sh", "-c", f'echo $$ > {folder}/cgroup.procs && exec "$@"', "in-cgroup"]
    steps = {"data.max_rows": sizes["memory_steps"] * 256 * 4}
    try:
        sharded, sharded_failure = attempt(4, config, "rows", steps, enter)
        _, replicated_failure = attempt(4, config, "none", steps, enter)
    finally:
        os.rmdir(folder)
    return {"measured": True, "limit_bytes": 4 * CGROUP_RANK_BYTES, "sharded_failure": sharded_failure,
            "sharded_peak_rss_mb": sharded["peak_rss_mb"] if sharded else None, "replicated_failure": replicated_failure}


def make_cgroup(limit: int) -> str | None:
    """A fresh memory cgroup limited to `limit` bytes (v2 where mounted so, else v1's memory hierarchy), or None."""
    for root, name in (("/sys/fs/cgroup", "memory.max"), ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")):
        folder = os.path.join(root, f"mpitrain-bench-{os.getpid()}")
        if not os.path.exists(os.path.join(root, "cgroup.procs")):  # not a cgroup hierarchy (v1's tmpfs root)
            continue
        try:
            os.mkdir(folder)
        except OSError:
            continue
        try:
            with open(os.path.join(folder, name), "w") as f:
                f.write(str(limit))
            return folder
        except OSError:
            os.rmdir(folder)
    return None


def speed(work: str, sizes: dict, repeat: int) -> list[dict]:
    data = os.path.join(work, "speed")
    make_click_dataset(data, n_train=200_000, n_test=2_000, ids=sizes["speed_ids"])
    config = write_config(os.path.join(work, "speed.yaml"), data, {"type": "sgd", "lr": 0.2, "momentum": 0.0})
    rows = []
    for ranks in sizes["speed_ranks"]:
        done = {shard: [] for shard in ("rows", "none")}
        for turn, shard in in_turns(("rows", "none"), repeat):
            print(f"speed: round {turn + 1}/{repeat}, {ranks} ranks, shard {shard}", file=sys.stderr)
            summary = run(ranks, config, shard, DIM, {"data.max_rows": sizes["speed_steps"] * 256 * ranks,
                                                      "train.log_every": sizes["speed_steps"] // 6})
            counted = summary["windows"][1:]
            seconds = sum(w["samples"] / w["samples_per_s"] for w in counted)
            done[shard].append({"samples_per_s": sum(w["samples"] for w in counted) / seconds,
                                "bytes_sent_per_step": sum(w["bytes_sent_per_step"] for w in counted) / len(counted),
                                "test_auc": summary["evaluation"].get("auc")})
        for shard, runs in done.items():
            rows.append({"ranks": ranks, "shard": shard, "oversubscribed": ranks > CORES, **median_run(runs)})
    for row in rows:
        other = next(r for r in rows if r["ranks"] == row["ranks"] and r["shard"] == "none")
        row["samples_vs_replicated"] = row["samples_per_s"] / other["samples_per_s"]
    return rows


def scale() -> list[dict]:
    network, rows = Network.of(**NETWORK), []
    table_bytes = SCALE["rows"] * SCALE["dim"] * 4
    for ranks in SCALE["ranks"]:
        sharded = sharded_table_step(network, SCALE["distinct"], SCALE["dim"], ranks)
        replicated = replicated_table_step(network, SCALE["distinct"], SCALE["dim"], ranks)
        rows.append({"ranks": ranks, "sharded_ms": 1e3 * sharded[0], "sharded_bytes": sharded[1],
                     "replicated_sparse_ms": 1e3 * replicated[0], "replicated_sparse_bytes": replicated[1],
                     "replicated_dense_ms": 1e3 * network.allreduce(table_bytes, ranks),
                     "sharded_gb_per_rank": 4 * -(-SCALE["rows"] // ranks) * SCALE["dim"] * 4 / 1e9,
                     "replicated_gb_per_rank": 4 * table_bytes / 1e9})
    return rows


def accuracy(work: str, sizes: dict) -> dict:
    data = os.path.join(work, "accuracy")
    rows = sizes["accuracy_rows"]
    truth = make_click_dataset(data, n_train=rows, n_test=rows // 10, ids=sizes["accuracy_ids"])
    config = write_config(os.path.join(work, "accuracy.yaml"), data, {"type": "sgd", "lr": 0.2, "momentum": 0.0})
    result = {"bayes_auc": roc_auc_score(truth["clicks"], truth["probability"])}
    for shard in ("rows", "none"):
        print(f"accuracy: shard {shard}", file=sys.stderr)
        summary = run(2, config, shard, DIM, {"train.epochs": 2})
        result[shard] = summary["evaluation"]["auc"]
    return result


def markdown(result: dict) -> str:
    s, m = result["setup"], result["memory"]
    lines = [("Quick check (small tables, a few steps), not the benchmark. " if s["quick"] else "")
             + f"**Memory**: one table of {s['memory_ids']:,} rows x {DIM_MEMORY} (float32), Adam, "
             f"{s['memory_steps']} steps of 256 rows per rank; the peak RSS of the largest rank.", "",
             markdown_table(["table", "ranks", "peak RSS per rank (MB)", "vs 1 rank"],
                            [[r["shard"] if r["shard"] == "rows" else "replicated", str(r["ranks"])
                              + (" (oversubscribed)" if r["oversubscribed"] else ""),
                              f"{r['peak_rss_mb']:,.0f}" if r["peak_rss_mb"] else r["failure"],
                              f"{r['peak_rss_mb'] / m['rows'][0]['peak_rss_mb']:.2f}x" if r["peak_rss_mb"] else "-"]
                             for r in m["rows"]], "llrr")]
    cgroup = m["cgroup"]
    if cgroup["measured"]:
        trained = f"trained, peak RSS {cgroup['sharded_peak_rss_mb']:,.0f} MB per rank" \
            if cgroup["sharded_peak_rss_mb"] else f"failed: {cgroup['sharded_failure']}"
        lines += ["", f"4 ranks in one memory cgroup of {cgroup['limit_bytes'] / 2**30:.0f} GiB "
                  f"({CGROUP_RANK_BYTES / 2**30:.0f} GiB per rank): sharded, {trained}; replicated, "
                  + (f"refused: `{cgroup['replicated_failure']}`" if cgroup["replicated_failure"] else "trained") + "."]
    else:
        lines += ["", f"The cgroup runs were not measured: {cgroup['why']}."]
    lines += ["", f"**Speed**: tables of {' and '.join(f'{n:,}' for n in s['speed_ids'])} rows x {DIM}, plain SGD, "
              f"{s['speed_steps']} steps of 256 rows per rank, the first metrics window not counted; each row the "
              f"median of {s['repeat']} run(s), taken in turns. bytes/step/rank as the communicator counts them: the "
              "parts an Alltoallv sends to other ranks (sharded), a rank's own Allgatherv message once (replicated; "
              "on the wire it goes to each of the other ranks, the cost model's bytes below).", "",
              markdown_table(["ranks", "table", "samples/s", "vs replicated", "bytes/step/rank", "test AUC"],
                             [[str(r["ranks"]) + (" (oversubscribed)" if r["oversubscribed"] else ""),
                               "sharded" if r["shard"] == "rows" else "replicated, sparse exchange",
                               f"{r['samples_per_s']:,.0f}", f"{r['samples_vs_replicated']:.2f}x",
                               f"{r['bytes_sent_per_step']:,.0f}", f"{r['test_auc']:.4f}"]
                              for r in result["speed"]], "llrrrr"),
              "", f"**Cost model**: one step of a {SCALE['rows']:,} x {SCALE['dim']} table, {SCALE['distinct']} "
              f"distinct ids per rank's batch, {NETWORK['latency_us']:g} us / {NETWORK['gbps']:g} Gb/s links; memory "
              "per rank: values, gradients and Adam's two moments.", "",
              markdown_table(["ranks", "sharded ms", "sharded bytes/rank", "replicated sparse ms",
                              "replicated sparse bytes/rank", "replicated dense ms", "sharded GB/rank",
                              "replicated GB/rank"],
                             [[str(r["ranks"]), f"{r['sharded_ms']:.2f}", f"{r['sharded_bytes']:,.0f}",
                               f"{r['replicated_sparse_ms']:.2f}", f"{r['replicated_sparse_bytes']:,.0f}",
                               f"{r['replicated_dense_ms']:,.0f}", f"{r['sharded_gb_per_rank']:.2f}",
                               f"{r['replicated_gb_per_rank']:.1f}"] for r in result["scale"]], "lrrrrrrr"),
              "", f"**Accuracy**: click table, categorical columns of {' and '.join(f'{n:,}' for n in s['accuracy_ids'])}"
              f" ids, {s['accuracy_rows']:,} training rows, 2 epochs on 2 ranks, plain SGD: test AUC sharded "
              f"{result['accuracy']['rows']:.6f}, replicated {result['accuracy']['none']:.6f}, Bayes (the true "
              f"probabilities) {result['accuracy']['bayes_auc']:.6f}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="memory,speed,scale,accuracy")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory() as work:
        result = {"setup": {**sizes, "repeat": 1 if args.quick else args.repeat, "quick": args.quick},
                  "memory": memory(work, sizes) if "memory" in parts else {"rows": [], "cgroup": {"measured": False,
                                                                                                "why": "not run"}},
                  "speed": speed(work, sizes, 1 if args.quick else args.repeat) if "speed" in parts else [],
                  "scale": scale(), "accuracy": accuracy(work, sizes) if "accuracy" in parts else
                  {"rows": float("nan"), "none": float("nan"), "bayes_auc": float("nan")}}
    write_results(args.out if not args.quick else os.path.join(tempfile.gettempdir(), "sharded-quick"),
                  "sharded_tables", result, markdown(result))


if __name__ == "__main__":
    main()
