"""Does a training step allocate? `train.trace_allocations` measures it in the real loop.

    trace = AllocationTrace(enabled=True)
    with trace.span("step"):          # around each training step (forward, backward, sync, update)
        ...
    trace.worst()                     # {"step": bytes, "evaluation": bytes}: the largest after warm-up

numpy reports every array buffer it allocates to `tracemalloc`; a span's figure is the peak
of traced memory above its start, so any array made (and freed) inside it counts, with the
small Python objects a step makes besides (tuples, views, floats; docs/benchmarks.md's
allocated/step column). tracemalloc's peak is the process's, not a thread's: a batch made in
the prefetch thread while the step runs would count at random (reading the shards makes h5py
objects), so traced training makes each batch between the steps instead (run.py). The
first `warm_up` spans of a kind make the workspace's arrays and are not counted. Arrays
that numba kernels, BLAS or cupy allocate are not traced; mpitrain's kernels allocate
nothing. Tracing slows Python, so it is off by default and for diagnosis and the tests.
"""
from __future__ import annotations

import tracemalloc
from collections import Counter
from contextlib import contextmanager

WARM_UP = {"step": 2, "evaluation": 1}  # spans of each kind that fill the workspace first


class AllocationTrace:
    """The largest traced allocation peak per span kind after its warm-up spans; a no-op when not `enabled`.
    Not a collective: each rank measures its own."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.spans, self.peaks = Counter(), {}
        if enabled and not tracemalloc.is_tracing():
            tracemalloc.start()

    @contextmanager
    def span(self, kind: str):
        if not self.enabled:
            yield
            return
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield
        peak = tracemalloc.get_traced_memory()[1] - start
        self.spans[kind] += 1
        if self.spans[kind] > WARM_UP.get(kind, 0):
            self.peaks[kind] = max(self.peaks.get(kind, 0), peak)

    def worst(self) -> dict:
        """{kind: the largest peak in bytes over the measured spans}; kinds with no span past warm-up are absent."""
        return dict(self.peaks)
