"""The floating-point work of training a sequence model, counted from its layers' shapes, and this machine's
single-core sgemm rate: a speed as a fraction of what the machine's GEMM can do (issue 32: FLOPs per sample x
samples/s / sgemm FLOP/s).

A multiply-add counts 2, and only the matrix products count (gate functions, activations, pooling, the loss and the
update grow with the sizes, not with their products). Training a product costs three times its forward (the
forward, the input's gradient, the weights' gradient), so a sample costs 3 x its forward's products, L being the
mean valid steps of a sequence (the padding a batch computes is not counted as work):

    lstm, F inputs, H units:                     L x 2 x (F + H) x 4H
    conv1d, F inputs, K taps, C filters, stride S: ceil(L / S) x 2 x K x F x C   (causal and same; valid: L - span + 1)
    dense on a vector, I inputs, U units:        2 x I x U   (per step of a sequence: L x 2 x I x U)
    attention, F features:                       L x 2 x 4F^2 + 2 x 2 x L^2 x F  (projections; scores, weighted values)
    transformer, F features, N ff_units:         attention's + L x 2 x 2 x F x N
    global_max_pool, global_avg_pool, positional, layernorm:   0

(attention's L^2 is taken at the mean length: the square of the mean, a little below the mean of the squares.)

An image model given as a `model.graph` (`image_graph_training_flops`) counts the same way:

    conv2d, C channels in, F filters of KH x KW, an OH x OW output: OH x OW x 2 x C x KH x KW x F
    dense, I inputs, U units:                                          2 x I x U
    batchnorm, activations, add, pooling, flatten:                     0

    python -c "from mpitrain.testing.flops import sgemm_rate; print(sgemm_rate())"   # under OPENBLAS_NUM_THREADS=1
"""
from __future__ import annotations

import math
import time

import numpy as np


def forward_flops(layers: list[dict], features: int, length: float) -> float:
    """The matrix products' FLOPs of one sequence of `length` steps of `features` numbers through `layers`."""
    total, steps = 0.0, length
    for spec in layers:
        kind = spec["type"]
        if kind == "lstm" and not spec.get("bidirectional") and not spec.get("return_sequences"):
            units = spec["units"]
            total += steps * 2 * (features + units) * 4 * units
            features, steps = units, None
        elif kind == "conv1d":
            span = spec.get("dilation", 1) * (spec["kernel"] - 1) + 1
            stride = spec.get("stride", 1)
            steps = (steps - span) // stride + 1 if spec.get("padding", "causal") == "valid" else math.ceil(steps / stride)
            total += steps * 2 * spec["kernel"] * features * spec["filters"]
            features = spec["filters"]
        elif kind in ("global_max_pool", "global_avg_pool"):
            steps = None
        elif kind == "dense":
            total += (1 if steps is None else steps) * 2 * features * spec["units"]
            features = spec["units"]
        elif kind in ("attention", "transformer"):
            total += steps * 2 * 4 * features ** 2 + 2 * 2 * steps ** 2 * features
            total += steps * 2 * 2 * features * spec["ff_units"] if kind == "transformer" else 0
        elif kind in ("positional", "layernorm"):
            continue
        else:
            raise ValueError(f"no FLOP count for a {kind} layer here ({spec}); expected a one-way lstm returning its "
                             "last state, conv1d, a global pool, dense, positional, layernorm, attention or transformer")
    return total


def image_graph_training_flops(nodes: list[dict], input_shape: tuple[int, ...]) -> float:
    """FLOPs of training on one image of `input_shape` (C, H, W) through `nodes` (a config's model.graph): 3 x its
    forward's products."""
    from mpitrain.kernels.im2col import geometry

    shapes, total = {"numeric": tuple(input_shape)}, 0.0
    for node in nodes:
        kind, shape = node["type"], shapes[(node.get("inputs") or [node.get("input")])[0]]
        if kind == "conv2d":
            g = geometry(shape, node["kernel"], node.get("stride", 1), node.get("padding", "valid"))
            shape = (node["filters"], g.out_height, g.out_width)
            total += g.out_height * g.out_width * 2 * g.channels * math.prod(g.kernel) * node["filters"]
        elif kind in ("maxpool2d", "avgpool2d"):
            pool = node.get("pool", 2)
            g = geometry(shape, pool, node.get("stride") or (pool if isinstance(pool, int) else pool[0]),
                         node.get("padding", "valid"))
            shape = (shape[0], g.out_height, g.out_width)
        elif kind == "flatten":
            shape = (math.prod(shape),)
        elif kind == "dense":
            total += 2 * math.prod(shape) * node["units"]
            shape = (node["units"],)
        elif kind not in ("batchnorm", "relu", "tanh", "sigmoid", "add", "dropout"):
            raise ValueError(f"no FLOP count for a {kind} node here ({node}); expected an image graph")
        shapes[node["name"]] = shape
    return 3 * total


def training_flops(layers: list[dict], features: int, length: float) -> float:
    """FLOPs of training on one sample: 3 x its forward's."""
    return 3 * forward_flops(layers, features, length)


def sgemm_rate(n: int = 1024, repeat: int = 5) -> float:
    """FLOP/s of numpy's float32 (n, n) x (n, n) matmul, the best of `repeat`, on the threads BLAS has (set
    OPENBLAS_NUM_THREADS=1 for one core)."""
    a, b = np.random.default_rng(0).random((2, n, n), dtype=np.float32)
    out = a @ b
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best
