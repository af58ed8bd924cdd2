"""The training step's forward and backward as a CUDA graph per batch shape (`train.cuda_graph`).

    stepper = graphed(config.train.cuda_graph, stepper, model, backend)   # the stepper, or a GraphedStep around it

On a GPU a small model's step is dozens of kernel launches of a few microseconds each, and cupy spends about 10 us
of host time on each (docs/gpus.md): the host, not the GPU, sets the pace. A CUDA graph records the launches once
and replays them as one. `GraphedStep` runs a batch shape's first WARMUP_STEPS steps as usual (numba and cupy
compile, the workspace takes its arrays, cuBLAS its kernels), then captures `model.train_batch` on static input
arrays, on a stream of its own, with the capturable GEMM (`mpitrain.kernels.gemm`) and a private memory pool, and
from then on copies each batch into those arrays and launches the graph. The sync step (the collectives and the
update) runs between graphs as before: MPI stages through the host, and the update's learning rate and step count,
which change every step, are kernel arguments a graph would replay unchanged (one fused kernel already: nothing to
gain). The eager steps of a graphed shape use the same GEMM, so a replay computes what they would, bit for bit.

What cannot be captured (`graph_blockers`): anything on the CPU; a step of several passes (train.tbptt_steps,
train.accumulate, sync.deterministic); a sharded table (collectives inside forward); embedding tables (their
backward's `unique` has a size the host reads); dropout at a rate above 0 (its seed is a kernel argument). Batches
of sequences (a SequenceBatch: lengths vary) run uncaptured. `auto` captures when nothing blocks and runs uncaptured
otherwise, saying why once; `true` refuses to start (or stops at a failed capture) with the reason; `false` never
captures. At most MAX_SHAPES shapes are captured (the full batch, the last short one); others run uncaptured.
Not a collective: every rank decides alike from the same config and model, and the collectives stay outside.
"""
from __future__ import annotations

import collections
import contextlib
import logging

from mpitrain.base.errors import ConfigError
from mpitrain.kernels.gemm import CublasGemm, capturable_gemm, gemm_unavailable
from mpitrain.training.steps import WholeBatch

log = logging.getLogger(__name__)

WARMUP_STEPS = 2  # eager steps of a batch shape before its capture: a cupy kernel first loaded while a stream
# captures records nothing useful (cupy#8318, a ReductionKernel's first use), so every kernel is loaded before it
MAX_SHAPES = 2  # batch shapes captured at most (each graph keeps its own activations' memory)


def graph_blockers(stepper, model, backend) -> list[str]:
    """Why this run's step cannot be a CUDA graph: an empty list when it can."""
    reasons = []
    if not backend.on_gpu:
        reasons.append(f"the backend is {backend.name}: a CUDA graph needs the cupy backend on a GPU")
    elif missing := gemm_unavailable():
        reasons.append(missing)
    if not isinstance(stepper, WholeBatch):
        reasons.append("a step of several forward and backward passes (train.tbptt_steps, train.accumulate or "
                       "sync.deterministic)")
    if model.sharded_tables:
        reasons.append("a sharded table's rows move by collectives inside forward")
    for name, layer in zip(model.names, model.layers):
        if layer.capture_blocker:
            reasons.append(f"layer {name}: {layer.capture_blocker}")
    return reasons


def graphed(setting, stepper, model, backend, graphs=None):
    """`stepper`, or a GraphedStep around it as `train.cuda_graph` `setting` (auto, True, False) asks: raises
    ConfigError for True when something blocks the capture. `graphs`: the device's graphs (CupyGraphs by default)."""
    if setting is False:
        return stepper
    reasons = graph_blockers(stepper, model, backend)
    if reasons and setting is True:
        raise ConfigError("train.cuda_graph: true, but the step cannot be captured: " + "; ".join(reasons) +
                          " (train.cuda_graph: auto runs it uncaptured)")
    if reasons:
        if backend.on_gpu:
            log.info("train.cuda_graph: the step runs uncaptured: %s", "; ".join(reasons))
        return stepper
    return GraphedStep(graphs or CupyGraphs(), required=setting is True)


class GraphedStep:
    """A whole-batch step whose forward and backward replay a CUDA graph per batch shape (see the module).
    `step` is a collective (the sync step), as every stepper's."""

    def __init__(self, graphs, required: bool = False, warmup: int = WARMUP_STEPS, max_shapes: int = MAX_SHAPES):
        self.graphs, self.required, self.warmup, self.max_shapes = graphs, required, warmup, max_shapes
        self.captured: dict = {}  # batch shape -> Captured
        self.eager = collections.Counter()  # batch shape -> steps run uncaptured
        self.refused: set = set()  # batch shapes whose capture failed

    def micro_rows(self, rows: int) -> int:
        return rows

    def step(self, model, x, y, key: tuple, grads_ready, sync, updater):
        """Train on batch (`x`, `y`) and update (a collective: the sync step); (mean loss, correct) on the device,
        arrays of their own (not the graph's, which the next replay overwrites). `key` seeds dropout, which a
        graphed model has not."""
        shape = batch_shape(x, y)
        with self.graphs.on_stream():
            captured = self.captured.get(shape)
            if captured is None and self._due(shape):
                captured = self._capture(model, x, y, shape)
            if captured is not None:
                loss, correct = captured.replay(x, y)
            else:
                self.eager[shape] += 1
                with self.graphs.gemm():
                    loss, correct = model.train_batch(x, y, key=key, grads_ready=grads_ready)
            sync.step(model.trainable, updater)
        return loss, correct

    def _due(self, shape) -> bool:
        return (shape is not None and shape not in self.refused and self.eager[shape] >= self.warmup
                and len(self.captured) < self.max_shapes)

    def _capture(self, model, x, y, shape):
        """Capture the step of batches of `shape` on static inputs; None (uncaptured from now on) when it fails
        under `auto`, ConfigError under `true`."""
        inputs = static_copy(x), static_copy(y)
        try:
            with self.graphs.gemm():
                graph, outputs = self.graphs.capture(lambda: model.train_batch(*inputs))
        except Exception as e:  # noqa: BLE001 (any failure: the step runs as before)
            if self.required:
                raise ConfigError(f"train.cuda_graph: true, but the step of batches {describe(shape)} could not be "
                                  f"captured: {type(e).__name__}: {e} (train.cuda_graph: auto runs it uncaptured)") \
                    from e
            log.warning("train.cuda_graph: the step of batches %s runs uncaptured: its capture failed: %s: %s",
                        describe(shape), type(e).__name__, e)
            self.refused.add(shape)
            return None
        self.captured[shape] = Captured(graph, inputs, outputs)
        log.info("train.cuda_graph: the step of batches %s is a CUDA graph from now on", describe(shape))
        return self.captured[shape]


class Captured:
    """One batch shape's graph, its static inputs and the arrays its replay writes the loss and count into."""

    def __init__(self, graph, inputs: tuple, outputs: tuple):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs

    def replay(self, x, y):
        """Copy the batch into the static inputs, launch, and return copies of (loss, correct)."""
        fill(self.inputs[0], x)
        fill(self.inputs[1], y)
        self.graph.launch()
        return tuple(output.copy() for output in self.outputs)


def batch_shape(x, y):
    """The key of a batch's graph: its arrays' shapes and types (a dict of named arrays for a graph model), or None
    for a batch no graph takes (a SequenceBatch: its lengths vary)."""
    try:
        return _shape_of(x), _shape_of(y)
    except TypeError:
        return None


def _shape_of(a) -> tuple:
    if isinstance(a, dict):
        return tuple((name, _shape_of(value)) for name, value in sorted(a.items()))
    if hasattr(a, "__array_interface__") or hasattr(a, "__cuda_array_interface__"):
        return tuple(a.shape), a.dtype.str
    raise TypeError(f"a {type(a).__name__} batch")


def static_copy(a):
    """A new array (or dict of arrays) holding `a`'s values: a graph's input, allocated outside the capture."""
    if isinstance(a, dict):
        return {name: value.copy() for name, value in a.items()}
    return a.copy()


def fill(static, a) -> None:
    """Copy batch `a` into the graph's input `static` (on the current stream)."""
    if isinstance(static, dict):
        for name, value in static.items():
            value[...] = a[name]
    else:
        static[...] = a


def describe(shape) -> str:
    return " and ".join(str(part) for part in shape)


class CupyGraphs:
    """CUDA graphs with cupy: a non-blocking stream of the step's own (a capture refuses the legacy default
    stream), the capturable GEMM, and a memory pool per graph, so that no array freed during a capture is handed
    out later while the graph still writes it (cupy#9655). Made on the run's device."""

    def __init__(self):
        import cupy
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.cublas = CublasGemm.on_device()
        self.pools: list = []  # each graph's, kept as long as this object

    @contextlib.contextmanager
    def on_stream(self):
        """The step's stream made current, after what the legacy default stream holds (the batch's upload, by the
        prefetch thread) and before what it holds next (evaluation, the metrics' copies)."""
        null = self.cupy.cuda.Stream.null
        self.stream.wait_event(null.record())
        with self.stream:
            yield
        null.wait_event(self.stream.record())

    def gemm(self):
        return capturable_gemm(self.cublas)

    def capture(self, run):
        """(the graph of what `run()` launches, what it returned); nothing runs until the graph is launched."""
        pool = self.cupy.cuda.MemoryPool()
        with self.cupy.cuda.using_allocator(pool.malloc):
            self.stream.begin_capture()
            try:
                outputs = run()
            except BaseException:
                with contextlib.suppress(Exception):
                    self.stream.end_capture()
                raise
            graph = self.stream.end_capture()
        self.pools.append(pool)
        return _Launch(graph, self.stream), outputs


class _Launch:
    def __init__(self, graph, stream):
        self.graph, self.stream = graph, stream

    def launch(self) -> None:
        self.graph.launch(stream=self.stream)
