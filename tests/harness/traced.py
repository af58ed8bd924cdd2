"""How many bytes a call allocates once it has run once, by tracemalloc (numpy's arrays included).

    assert allocated_bytes(lambda: layer.forward(x, True)) <= 4096

tracemalloc's peak is the whole process's, and another thread (pytest-xdist's messages, a watchdog's tick) may
allocate while a call runs; an array the call makes shows every time it runs. So the figure is the least peak over
`repeats` calls, each after the one before: the call's own allocation, without another thread's by chance.
"""
from __future__ import annotations

import tracemalloc


def allocated_bytes(call, repeats: int = 3) -> int:
    """The least traced peak above the start over `repeats` runs of `call()`, after one run not measured."""
    tracemalloc.start()
    try:
        call()
        peaks = []
        for _ in range(repeats):
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            call()
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        return min(peaks)
    finally:
        tracemalloc.stop()
