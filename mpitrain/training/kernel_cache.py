"""Fill numba's cache with the CPU kernels training runs, once after installing: `mpitrain warm-up` (`make setup`
runs it), so a user's first run loads its kernels instead of compiling them.

    mpitrain warm-up                  # every case, in this process
    mpitrain warm-up --part 1/2       # every other case: two processes share the work

numba compiles a kernel for each combination of argument types it meets (dtype, dimensions, layout, an optional
array or None) and keeps the machine code in its cache (`cache=True`; beside the kernels' sources, or in
NUMBA_CACHE_DIR). A first run compiles what its model, optimizer and sync mode need, 10-60 s of CPU per rank on two
cores, while every later run loads them in a fraction of a second. The cases below meet the float32 combinations a
training run meets on the CPU: each layer type forward and backward (both conv paths, both pooling paths, both
recurrent cells each way), each loss, each optimizer with and without L2 or weight decay, the sharing codec, the
deterministic sum, the batch pipeline's gathering and scaling of uint8 and float32 rows and its reading and padding
of stored sequences (float32 values, integer ids, a class per step), and the evaluation's scoring. A model in float64
(`model.dtype`) compiles its own on first use. Not a collective; it touches no run directory.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from mpitrain.base.workspace import Workspace
from mpitrain.config.sections import ModelConfig, OptimizerConfig
from mpitrain.data.encoding import ID_DTYPE
from mpitrain.data.sequences import Inputs, RaggedBuffer, SequenceBatch
from mpitrain.data.shards import InputGroup
from mpitrain.kernels.fixed_point import column_maxima, fixed_point_sum
from mpitrain.kernels.loss import score
from mpitrain.kernels.rows import all_finite, gather_scaled, scaled
from mpitrain.nn.graph import build_graph
from mpitrain.nn.model import build_model
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.sync.codec import CODECS

log = logging.getLogger("mpitrain")

ROWS = 4  # rows of a warm-up batch: kernels compile by type, not by size
DENSE = [{"type": "dense", "units": 6, "activation": kind}
         for kind in ("relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu")]
IMAGES = [  # im2col (few channels), then channels-last windows and Winograd (8 channels on), both poolings
    {"type": "conv2d", "filters": 8, "kernel": 3, "padding": "same", "activation": "relu"},
    {"type": "batchnorm"}, {"type": "relu"},
    {"type": "maxpool2d", "pool": 2},
    {"type": "conv2d", "filters": 8, "kernel": 3, "padding": "same"},
    {"type": "conv2d", "filters": 4, "kernel": 3, "stride": 2, "padding": "same", "activation": "tanh"},
    {"type": "maxpool2d", "pool": 3, "stride": 1, "padding": "same"},
    {"type": "avgpool2d", "pool": 2},
    {"type": "dropout", "rate": 0.2}, {"type": "flatten"},
    {"type": "dense", "units": 6}, {"type": "batchnorm"}, {"type": "sigmoid"},
    {"type": "dense", "units": 3}]
SEQUENCES = [
    [{"type": "lstm", "units": 4, "return_sequences": True}, {"type": "gru", "units": 4, "bidirectional": True},
     {"type": "dense", "units": 3}],
    [{"type": "gru", "units": 4, "return_sequences": True}, {"type": "lstm", "units": 4, "bidirectional": True},
     {"type": "dense", "units": 3}],
    [{"type": "conv1d", "filters": 4, "kernel": 3, "padding": "causal", "activation": "relu"},
     {"type": "positional"}, {"type": "attention", "heads": 2, "rate": 0.1}, {"type": "global_max_pool"},
     {"type": "dense", "units": 3}],
    [{"type": "cls_token"}, {"type": "transformer", "heads": 2, "ff_units": 4, "rate": 0.1}, {"type": "cls_pool"},
     {"type": "dense", "units": 3}],
    [{"type": "conv1d", "filters": 4, "kernel": 3, "activation": "tanh"}, {"type": "positional", "encoding": "sinusoidal"},
     {"type": "layernorm", "activation": "relu"},
     {"type": "global_avg_pool"}, {"type": "dense", "units": 3}],
]
TOKENS = [{"type": "token_embedding", "ids": 9, "dim": 3}, *SEQUENCES[0]]  # token ids through an embedding
TABLE = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 3},
         {"name": "flat", "type": "flatten", "input": "emb"},
         {"name": "joined", "type": "concat", "inputs": ["flat", "numeric"]},
         {"name": "a", "type": "dense", "input": "joined", "units": 4, "activation": "relu"},
         {"name": "b", "type": "dense", "input": "a", "units": 4},
         {"name": "sum", "type": "add", "inputs": ["a", "b"]},
         {"name": "out", "type": "dense", "input": "sum", "units": 1}]
TABLE_TOKENS = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 4},  # FT-Transformer's
                {"name": "tokens", "type": "feature_tokens", "inputs": ["numeric", "emb"], "dim": 4},
                {"name": "cls", "type": "cls_token", "input": "tokens"},
                {"name": "block", "type": "transformer", "input": "cls", "heads": 2, "ff_units": 4},
                {"name": "pooled", "type": "cls_pool", "input": "block"},
                {"name": "out", "type": "dense", "input": "pooled", "units": 1}]
BAG = [{"name": "bag", "type": "embedding_bag", "input": "recent", "dim": 3, "mode": "max"},  # a bag column of ids
       {"name": "joined", "type": "concat", "inputs": ["bag", "numeric"]},
       {"name": "out", "type": "dense", "input": "joined", "units": 1}]
LOSSES = {"softmax_cross_entropy": 3, "binary_cross_entropy": 1, "multilabel_cross_entropy": 2, "mse": 2,
          "huber": 2, "l1": 2}
SOFTMAX_OPTIONS = [{"class_weights": [1.0, 2.0, 1.0]}, {"label_smoothing": 0.1}]  # each its own kernel
OPTIMIZERS = [{"type": "sgd"}, {"type": "sgd", "momentum": 0.9}, {"type": "sgd", "momentum": 0.9, "nesterov": True},
              {"type": "adagrad"}, {"type": "rmsprop"}, {"type": "adam"}, {"type": "adam", "amsgrad": True},
              {"type": "adamw", "weight_decay": 0.01}, {"type": "adamw", "weight_decay": 0.01, "amsgrad": True},
              {"type": "nadam"}]


def _train(model, x, y) -> None:
    """One training step's forward and backward, and an evaluation's forward."""
    model.init_params(0, "xavier")
    model.train_batch(x, y)
    model.forward(x, training=False)


def _labels(rng, outputs: int, loss: str):
    if loss == "softmax_cross_entropy":
        return rng.integers(0, outputs, ROWS).astype(np.int32)
    return rng.uniform(0, 1, (ROWS, outputs)).astype(np.float32)


def dense_and_losses(rng) -> None:
    """Dense layers with each activation, dropout, batch norm and layer norm on rows, under each loss; the
    softmax cross-entropy also with class weights and with label smoothing."""
    for loss, outputs in LOSSES.items():
        layers = [*DENSE, {"type": "dropout", "rate": 0.5}, {"type": "batchnorm"}, {"type": "layernorm"},
                  {"type": "dense", "units": outputs}]
        model = build_model(ModelConfig(layers=layers, loss=loss), (5,), outputs, np)
        _train(model, rng.normal(size=(ROWS, 5)).astype(np.float32), _labels(rng, outputs, loss))
    for options in SOFTMAX_OPTIONS:
        model = build_model(ModelConfig(layers=[{"type": "dense", "units": 3}], loss_options=options), (5,), 3, np)
        _train(model, rng.normal(size=(ROWS, 5)).astype(np.float32), _labels(rng, 3, "softmax_cross_entropy"))


def images(rng) -> None:
    """Convolutions by im2col, channels last and Winograd, max and average pooling, batch norm on images."""
    model = build_model(ModelConfig(layers=IMAGES), (1, 8, 8), 3, np)
    _train(model, rng.normal(size=(ROWS, 1, 8, 8)).astype(np.float32), _labels(rng, 3, "softmax_cross_entropy"))


def sequences(rng) -> None:
    """LSTM and GRU cells (one way and both ways), causal and valid 1-D convolutions, positions, attention with
    dropout on its weights, a transformer block, layer norm per step, global poolings, on padded sequences of unlike lengths; and token ids
    through an embedding."""
    lengths = np.array([5, 3, 6, 2][:ROWS], np.int64)
    batch = SequenceBatch(rng.normal(size=(ROWS, 6, 2)).astype(np.float32), lengths)
    labels = _labels(rng, 3, "softmax_cross_entropy")
    for layers in SEQUENCES:
        _train(build_model(ModelConfig(layers=layers), (None, 2), 3, np, sequence={"longest": 6, "shortest": 2}),
               batch, labels)
    ids = SequenceBatch(rng.integers(0, 9, (ROWS, 6, 1)).astype(ID_DTYPE), lengths)  # a column of integers
    _train(build_model(ModelConfig(layers=TOKENS), (None, 1), 3, np, sequence={"longest": 6, "shortest": 2}), ids,
           labels)


def table(rng) -> None:
    """Graphs over a table's columns: embedding tables, concat and add, a sigmoid output; the columns as tokens
    through a transformer block; a bag column of ids through an embedding bag."""
    groups = {"numeric": InputGroup(0, (3,)), "categorical": InputGroup(0, (2,), (6, 4))}
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    ids = rng.integers(0, 4, (ROWS, 2)).astype(ID_DTYPE)  # as a shard stores them
    for graph in (TABLE, TABLE_TOKENS):
        model = build_graph(ModelConfig(graph=graph, loss="binary_cross_entropy"), groups, (3,), 1, np)
        _train(model, Inputs(x, {"categorical": ids}), _labels(rng, 1, "binary_cross_entropy"))
    model = build_graph(ModelConfig(graph=BAG, loss="binary_cross_entropy"), {"numeric": InputGroup(0, (3,))}, (3,),
                        1, np, sequences={"recent": (None, 1)}, steps=6, sequence_ids={"recent": 9})
    bags = SequenceBatch(rng.integers(0, 9, (ROWS, 6, 1)).astype(ID_DTYPE), np.array([5, 1, 6, 2][:ROWS], np.int64))
    _train(model, Inputs(x, {"recent": bags}), _labels(rng, 1, "binary_cross_entropy"))


def optimizers(rng) -> None:
    """Each optimizer's step, with L2 and without (their kernels compile once per such variant)."""
    params, mask = rng.normal(size=8).astype(np.float32), np.ones(8, np.float32)
    for options in OPTIMIZERS:
        for l2 in (0.0, 1e-4):
            config = OptimizerConfig(**options, l2=l2).validate("warm-up")
            create_updater(config, params.copy(), mask).delta(rng.normal(size=8).astype(np.float32), params.copy())


def stored_sequences(rng) -> None:
    """A stored sequence column read into the pipeline's ragged buffers (float32 steps checked finite, or integer
    ids), copied between them and padded into a batch, or into a class per step."""
    offsets, index = np.array([0, 3, 4, 6], np.int64), np.array([2, 0], np.int64)
    part = Workspace(np).part("warm-up")
    for dtype in (np.float32, np.dtype(ID_DTYPE)):
        read, window = RaggedBuffer(3, 1, dtype), RaggedBuffer(3, 1, dtype)
        read.space(0, offsets)[...] = rng.integers(0, 3, (6, 1))
        if read.values.dtype.kind == "f":
            all_finite(read.values)
        window.copy_rows(read, 0, 3, 0)
        window.padded(index, part, "x", dtype)
        window.padded_classes(index, part, "y")  # a class per step, stored as either


def batch_pipeline(rng) -> None:
    """The batch pipeline's gathering and scaling of stored rows (uint8 or float32) and targets (classes or
    values), and of stored sequences (`stored_sequences`); the evaluation's scoring of a batch; the sharing codec's
    encoding and decoding, and `sync.deterministic`'s exact sum."""
    index = np.arange(2, dtype=np.int64)
    for stored in (np.zeros((2, 3), np.uint8), np.zeros((2, 3), np.float32)):
        for y in (np.zeros(2, np.int32), np.zeros((2, 2), np.float32)):
            out_x, out_y = np.empty((2, 3), np.float32), np.empty_like(y)
            gather_scaled(stored, y, index, 1.0, 0.0, out_x, out_y)
            scaled(stored, 1.0, 0.0, out_x)
    stored_sequences(rng)
    totals = np.zeros(3 * 3 + 1, np.float64)  # 3 classes' counts, then the loss: as `evaluate` adds up a batch
    score(rng.normal(size=(2, 3)).astype(np.float32), np.zeros(2, np.int32), totals[:-1], totals[-1:])
    for codec in CODECS.values():
        codec().warm_up(np.zeros(64, np.float32))
    kept = np.zeros((2, 3), np.float32)
    column_maxima(kept, np.empty(3, np.float32))
    fixed_point_sum(kept, np.ones(3), np.empty(3, np.int64))


# the slowest first; `--part 1/2` takes images, dense_and_losses and table, `--part 2/2` the others: 37 s and 41 s
# of CPU cold, side by side on this project's two cores (2026-12-07)
CASES = [images, sequences, dense_and_losses, optimizers, table, batch_pipeline]


def warm_up(part: int = 1, parts: int = 1) -> float:
    """Run the cases of `part` of `parts` (every parts-th case from the part-th), compiling their kernels into
    numba's cache or loading them from it; returns the seconds taken. Not a collective."""
    started, rng = time.perf_counter(), np.random.default_rng(0)
    for case in CASES[part - 1::parts]:
        case(rng)
        log.info("warm-up: %s (%.1f s so far)", case.__name__, time.perf_counter() - started)
    return time.perf_counter() - started

