"""benchmarks/scaling.py's rows through the cost model of record (mpitrain.parallel.costmodel): one step's
communication on N ranks from the bytes a rank sent per step at the measured rank count.

    network = Network.of(latency_us=1.0, gbps=100.0)
    cost(row, 1024, network)   # {"exchange", "messages_per_step", "wire_bytes_per_step", "comm_s_per_step", ...}

A row says its sync mode, the parameters (float32), the bytes a rank sent per step over the
whole run (`bytes_sent_per_step`, epoch ends included) and over the training steps alone
(`step_bytes_sent_per_step`, the metrics windows'), and the compute seconds per step.
- `allreduce` and `averaging`: bytes / (4 x params) Allreduces of the whole buffer per step
  (every step; every `frequency` steps and at epoch ends), each as MPICH runs it.
- `sharing`: each step, the exchange `sync.exchange: auto` would pick at N ranks for every
  rank's message as large as measured (the step's bytes less the 8-byte size; tau keeps the
  sparsity in its band at any N, and the measured rank counts run the allgather), and the
  epoch ends' Allreduces of the updater state (the rest of the bytes).
Messages per step are the model's latency terms: its seconds on a network of latency alone.
"""
from __future__ import annotations

from mpitrain.parallel.costmodel import (
    SIZE_BYTES,
    Network,
    allgather_exchange,
    allreduce_bytes,
    recursive_exchange,
    split_exchange,
)
from mpitrain.parallel.sync.exchange import choose_exchange

ITEMSIZE = 4  # the benchmark's models are float32
STEPS = Network(latency_s=1.0, byte_s=0.0)  # a network on which seconds count the messages


def cost(row: dict, ranks: int, network: Network) -> dict:
    """The modelled communication of one step on `ranks` ranks (see the module docstring)."""
    n = row["n_params"]
    dense = ITEMSIZE * n
    step_bytes = min(row["step_bytes_sent_per_step"], row["bytes_sent_per_step"]) if row["mode"] == "sharing" else 0.0
    allreduces = (row["bytes_sent_per_step"] - step_bytes) / dense

    def modelled(on: Network) -> tuple[float, float]:
        seconds, wire = allreduces * on.allreduce(dense, ranks), allreduces * allreduce_bytes(dense, ranks)
        if not step_bytes:
            return seconds, wire
        sizes = [step_bytes - SIZE_BYTES] * ranks
        exchange = {"allgather": lambda: allgather_exchange(on, sizes),
                    "split": lambda: split_exchange(on, sizes, n, ITEMSIZE),
                    "recursive": lambda: recursive_exchange(on, sizes, n)}[chosen]()
        return seconds + exchange[0], wire + exchange[1]

    chosen = choose_exchange("auto", network, [(step_bytes - SIZE_BYTES) / 4] * ranks, n, ITEMSIZE) \
        if step_bytes else "allreduce"
    seconds, wire = modelled(network)
    return {"mode": row["mode"], "ranks": ranks, "measured_at_ranks": row["ranks"],
            "bytes_sent_per_step": row["bytes_sent_per_step"], "exchange": chosen,
            "allreduces_per_step": allreduces, "messages_per_step": modelled(STEPS)[0], "wire_bytes_per_step": wire,
            "comm_s_per_step": seconds, "compute_s_per_step": row["compute_s_per_step"],
            "efficiency": row["compute_s_per_step"] / (row["compute_s_per_step"] + seconds)}
