"""`ReplayGraphs`: `mpitrain.training.step_graph.CupyGraphs`' stand-in on the CPU, for the graphed step's logic.

A CUDA capture records launches without running them, and a replay runs them on the same arrays: what it writes
lands in the arrays the capture allocated, and a Python value computed at capture time is baked in. The stand-in
keeps what can be kept of that on numpy: `capture` runs the step once (Python must run to record), then puts back
the `kept` arrays the step wrote that outlive it (the running statistics) and fills the step's outputs and the
`poisoned` arrays (the gradients) with NaN, as a capture leaves them unwritten; a replay runs the step again and
copies its outputs into the captured ones. So a graphed step that forgot to copy a batch into the static inputs, to
launch after capturing, or to read the replay's outputs trains differently from the uncaptured step, and the tests
see it. It is not a GPU test: the GPU check replays real graphs (tests/system/test_gpu_graphs.py).
"""
from __future__ import annotations

import contextlib

import numpy as np


class ReplayGraphs:
    """Graphs on the CPU: `captures` and `launches` count them; `failure`, when set, is raised by the next
    capture."""

    def __init__(self, kept=(), poisoned=()):
        self.kept, self.poisoned = kept, poisoned
        self.captures = self.launches = 0
        self.failure: Exception | None = None

    def on_stream(self):
        return contextlib.nullcontext()

    def gemm(self):
        return contextlib.nullcontext()

    def capture(self, run):
        if self.failure is not None:
            raise self.failure
        saved = [array.copy() for array in self.kept]
        outputs = run()
        for array, before in zip(self.kept, saved):
            array[...] = before
        for array in (*self.poisoned, *outputs):
            _poison(array)
        self.captures += 1
        return _Replay(self, run, outputs), outputs


class _Replay:
    def __init__(self, graphs: ReplayGraphs, run, outputs):
        self.graphs, self.run, self.outputs = graphs, run, outputs

    def launch(self) -> None:
        self.graphs.launches += 1
        for captured, written in zip(self.outputs, self.run()):
            captured[...] = written


def _poison(array) -> None:
    array[...] = np.nan if array.dtype.kind == "f" else -1
