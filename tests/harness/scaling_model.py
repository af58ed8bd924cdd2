"""benchmarks/scaling.py's ring-bound model of one step's communication on N ranks (its docstring
says how); its own test holds it to hand-worked cases. (The cost model of record is
mpitrain.parallel.costmodel; this one is the benchmark's estimate from measured bytes.)"""
from __future__ import annotations


def cost(row: dict, ranks: int, bandwidth_gbps: float, latency_us: float) -> dict:
    """The modelled communication of one step on `ranks` ranks (see the module docstring)."""
    gathered = min(row["step_bytes_sent_per_step"], row["bytes_sent_per_step"]) if row["mode"] == "sharing" else 0.0
    reduced = row["bytes_sent_per_step"] - gathered
    allreduces, allgathers = reduced / (4 * row["n_params"]), 2.0 if gathered else 0.0
    messages = (2 * allreduces + allgathers) * (ranks - 1)
    wire = 2 * (ranks - 1) / ranks * reduced + (ranks - 1) * gathered
    seconds = messages * latency_us * 1e-6 + wire * 8 / (bandwidth_gbps * 1e9)
    return {"mode": row["mode"], "ranks": ranks, "measured_at_ranks": row["ranks"],
            "bytes_sent_per_step": row["bytes_sent_per_step"], "collectives_per_step": allreduces + allgathers,
            "messages_per_step": messages, "wire_bytes_per_step": wire, "comm_s_per_step": seconds,
            "compute_s_per_step": row["compute_s_per_step"],
            "efficiency": row["compute_s_per_step"] / (row["compute_s_per_step"] + seconds)}

