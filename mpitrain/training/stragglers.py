"""Stragglers: a rank consistently slower than the others, named with its host.

    stragglers = Stragglers(factor=1.5, hosts=["n1", "n1", "n2", "n2"])
    spread(values)                     # {min, median, max, slowest}: one figure over the ranks, in a window record
    named = stragglers.observe(busy)   # each rank's busy ms per step in a window -> the straggler named, or None

A rank's busy time is its step time less its time inside MPI: forward, backward, the update and the wait for its
batch; what it waits for in collectives is the others' busy time, so the rank that the others wait for has the
largest. A rank whose busy time is more than `factor` times the median rank's in `WINDOWS` windows in a row is named
once per streak: in the log, in the window's record (metrics.jsonl's `straggler`), and so in the report. One rank
alone, or two, have no median to be slower than (two: the median is their mean, so a straggler needs factor < 2).
"""
from __future__ import annotations

import numpy as np

WINDOWS = 3  # windows in a row a rank must be slow in to be named


def spread(values: list[float]) -> dict:
    """One figure over the ranks: its min, median and max, and the rank with the max (`slowest`)."""
    values = np.asarray(values, dtype=np.float64)
    return {"min": float(values.min()), "median": float(np.median(values)), "max": float(values.max()),
            "slowest": int(np.argmax(values))}


class Stragglers:
    """Counts each rank's windows in a row above `factor` x the median busy time (see the module docstring)."""

    def __init__(self, factor: float, hosts: list[str]):
        self.factor, self.hosts = factor, hosts
        self.streak = np.zeros(len(hosts), np.int64)
        self.named: list[dict] = []  # every straggler named so far

    def observe(self, busy_ms: list[float]) -> dict | None:
        """A window's busy ms per step of each rank -> {rank, host, busy_ms, median_ms, ratio} of a rank that has
        now been slow for WINDOWS windows in a row (the slowest such), else None."""
        busy = np.asarray(busy_ms, dtype=np.float64)
        median = float(np.median(busy))
        slow = busy > self.factor * median
        self.streak = np.where(slow, self.streak + 1, 0)
        due = np.flatnonzero(self.streak == WINDOWS)
        if not len(due) or median <= 0:
            return None
        rank = int(due[np.argmax(busy[due])])
        named = {"rank": rank, "host": self.hosts[rank], "busy_ms": round(float(busy[rank]), 3),
                 "median_ms": round(median, 3), "ratio": round(float(busy[rank]) / median, 3)}
        self.named.append(named)
        return named
