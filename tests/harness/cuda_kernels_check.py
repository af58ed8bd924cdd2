"""Hold the numba-CUDA kernels to the numpy reference, under the CUDA simulator or on a GPU.

Run as `NUMBA_ENABLE_CUDASIM=1 python -m mpitrain.testing.cuda_kernels_check` (the kernels' unit tests do so
in a subprocess: the simulator must be on before numba.cuda is first imported), or without the
simulator on a CUDA GPU (the GPU tests), where the default launch shape also runs on millions of
elements. Every mismatch raises AssertionError, so the exit status is non-zero; success prints OK last.
The simulator runs each thread as a Python thread: n stays small, blocks are small.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np
from numba import cuda

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
assert SIMULATED or cuda.is_available(), "run with NUMBA_ENABLE_CUDASIM=1, or on a machine with a CUDA GPU"

from mpitrain.kernels import (  # noqa: E402
    activations,
    activations_cuda,
    batchnorm,
    batchnorm_cuda,
    embedding,
    embedding_cuda,
    im2col,
    im2col_cuda,
    layernorm,
    layernorm_cuda,
    loss,
    loss_cuda,
    pool,
    pool_cuda,
    recurrent_cuda,
    updaters,
    updaters_cuda,
)
from mpitrain.kernels import threshold as kernels  # noqa: E402
from mpitrain.kernels.threshold import cuda as cuda_kernels  # noqa: E402
from mpitrain.kernels.threshold import message, reference  # noqa: E402
from mpitrain.testing.recurrent_steps import outputs, step_arrays, step_backward, step_forward  # noqa: E402
from mpitrain.testing.threshold_cases import bits, edge_cases, residual_with_fraction  # noqa: E402
from mpitrain.testing.updater_cases import STEPS, step_inputs  # noqa: E402

# n = 1000: 4 tiles of 256 elements. The simulator's cost grows with the threads of a block (its scheduler polls
# every thread until all wait at a barrier): there, 8 threads of 32 elements each, the same tiles (17 s -> 6 s).
TILES = cuda_kernels.CudaKernels(block=8, per_thread=32) if SIMULATED else cuda_kernels.CudaKernels(block=32, per_thread=8)
CARRY = cuda_kernels.CudaKernels(block=4, per_thread=16)  # n = 600: 10 tiles, so the scan carries


@contextlib.contextmanager
def simulated_blocks(size: int, *settings):
    """Under the simulator, which runs a thread at a time, each (module, name) of `settings` (a kernel module's
    threads per block) set to `size` for the block of code; on a GPU left as it is. Restored on leaving."""
    saved = [(module, name, getattr(module, name)) for module, name in settings]
    if SIMULATED:
        for module, name, _ in saved:
            setattr(module, name, size)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def check(impl, name, residual, tau, encoding, sign=0.75) -> None:
    """Encode and decode on the simulated device and with the reference: bit-identical or fail."""
    expected_residual = residual.copy()
    expected = message.encode(reference, expected_residual, tau, encoding)
    device = cuda.to_device(residual)
    got = message.encode(impl, device, tau, encoding)
    assert np.array_equal(got.copy_to_host(), expected), f"{name} ({encoding}): messages differ"
    assert np.array_equal(bits(device.copy_to_host()), bits(expected_residual)), f"{name}: residuals differ"
    start = np.random.default_rng(5).standard_normal(residual.size).astype(residual.dtype)
    expected_out, out = start.copy(), cuda.to_device(start)
    message.decode(reference, expected, expected_out, sign)
    message.decode(impl, got, out, sign)
    assert np.array_equal(bits(out.copy_to_host()), bits(expected_out)), f"{name} ({encoding}): decodes differ"
    print(f"ok {name} ({encoding})", flush=True)


def assert_raises(text: str, run, *args) -> None:
    """run(*args) must raise ValueError mentioning `text`."""
    try:
        run(*args)
    except ValueError as error:
        assert text in str(error), error
        return
    raise AssertionError(f"no ValueError saying {text!r}")


def assert_same_values(got, expected, name) -> None:
    """Bit for bit, except that a NaN may have another payload: an arithmetic NaN comes out of the GPU
    as the canonical NaN, while x86 passes on the NaN operand's bits."""
    nan = np.isnan(expected)
    differ = (bits(got) != bits(expected)) & ~(nan & np.isnan(got))
    assert not differ.any(), f"{name} differs at {np.flatnonzero(differ)[:5]}: {got[differ][:5]} != {expected[differ][:5]}"


def check_errors() -> None:
    residual, tau = residual_with_fraction(300, 0.1)
    residual[[40, 290]] = np.nan
    device = cuda.to_device(residual)
    assert_raises("2 NaN value(s), the first at index 40", message.encode, TILES, device, tau)
    assert np.array_equal(bits(device.copy_to_host()), bits(residual)), "NaN: residual changed"
    corrupt = np.array([2, 5, np.float32(0.5).view(np.int32), message.SPARSE, 1, 6], dtype=np.int32)
    assert_raises("1 index(es) outside 1..5", message.decode, TILES, cuda.to_device(corrupt),
                  cuda.to_device(np.zeros(5, dtype=np.float32)))
    print("ok errors", flush=True)


def check_clip() -> None:
    residual = np.r_[np.random.default_rng(0).standard_normal(100) * 3, [np.inf, -np.inf, np.nan, -0.0]]
    residual = residual.astype(np.float32)
    expected, device = residual.copy(), cuda.to_device(residual)
    message.clip(reference, expected, 1.5)
    message.clip(TILES, device, 1.5)
    assert np.array_equal(bits(device.copy_to_host()), bits(expected)), "clip differs"
    update = np.random.default_rng(1).standard_normal(residual.size).astype(np.float32)
    for limit in (1.5, None):
        device = cuda.to_device(expected)
        message.accumulate(TILES, device, cuda.to_device(update), limit)
        added = expected.copy()
        message.accumulate(reference, added, update, limit)
        assert_same_values(device.copy_to_host(), added, f"add then clip to {limit}")
    print("ok clip", flush=True)


def check_default_launch() -> None:
    """The launch shape training uses, on a GPU only: millions of elements, many blocks, both bodies."""
    for encoding, fraction in (("sparse", 0.001), ("bitmap", 0.2)):
        check(cuda_kernels.DEFAULT, "3M elements", *residual_with_fraction(3_000_001, fraction, seed=9), encoding)
    residual = np.random.default_rng(10).standard_normal(3_000_001).astype(np.float32)
    update = np.random.default_rng(11).standard_normal(residual.size).astype(np.float32)
    device, expected = cuda.to_device(residual), residual.copy()
    message.accumulate(cuda_kernels.DEFAULT, device, cuda.to_device(update), 1.5)
    message.accumulate(reference, expected, update, 1.5)
    assert_same_values(device.copy_to_host(), expected, "3M elements: add then clip")
    print("ok default launch", flush=True)


def check_dispatch() -> None:
    """The public functions send device arrays to the CUDA kernels; a host message decodes too."""
    cuda_kernels.DEFAULT = TILES
    residual, tau = residual_with_fraction(200, 0.02)
    encoded = kernels.threshold_encode(cuda.to_device(residual), tau)
    assert kernels.implementation(encoded) is TILES and kernels.message_count(encoded) == 4
    host = encoded.copy_to_host()
    expected, out = np.zeros(200, dtype=np.float32), cuda.to_device(np.zeros(200, dtype=np.float32))
    message.decode(reference, host, expected)
    kernels.threshold_decode(host, out)
    assert np.array_equal(out.copy_to_host(), expected), "host message decoded wrongly"
    print("ok dispatch", flush=True)


def check_recurrent_steps() -> None:
    """The LSTM and GRU step kernels (kernels/recurrent_cuda.py) write what the CPU path writes, padded sequences
    included, in float32 and float64 (the simulator takes numpy arrays; a GPU, device copies): one sequence of one
    unit, and sizes past one block of threads in both directions (recurrent_cuda.BLOCK)."""
    for kind in ("lstm", "gru"):
        for dtype, tolerance in ((np.float32, 1e-5), (np.float64, 1e-12)):
            for batch, units in ((1, 1), (recurrent_cuda.BLOCK[0] + 1, recurrent_cuda.BLOCK[1] + 1)):
                expected = step_arrays(kind, batch, units, dtype, seed=batch + units)
                got = {k: v if SIMULATED or not isinstance(v, np.ndarray) else cuda.to_device(v)
                       for k, v in step_arrays(kind, batch, units, dtype, seed=batch + units).items()}
                for after_backward, run in ((False, step_forward), (True, step_backward)):
                    run(kind, expected)
                    run(kind, got, recurrent_cuda)
                    for name, want in outputs(kind, expected, after_backward).items():
                        have = outputs(kind, got, after_backward)[name]
                        have = have if SIMULATED else have.copy_to_host()
                        np.testing.assert_allclose(have, want, rtol=tolerance, atol=tolerance,
                                                   err_msg=f"{kind} {dtype.__name__} {batch}x{units}: {name}")
    print("ok recurrent steps", flush=True)


def check_updater_steps() -> None:
    """Every updater's kernel (kernels/updaters_cuda.py) takes the CPU kernel's steps, its state slots included, over
    3 steps: with and without L2, more than one block of threads, float32 and float64; AdamW's
    decoupled decay with AMSGrad, and NAdam, too."""
    variants = {**STEPS, "adamw amsgrad": ("adam_variant_step", 3, None), "nadam": ("nadam_step", 2, None)}
    with simulated_blocks(8, (updaters_cuda, "BLOCK")):
        _check_updater_steps(variants)
    print("ok updater steps", flush=True)


def _check_updater_steps(variants: dict) -> None:
    for name, (function, slots, arguments) in variants.items():
        for dtype, tolerance in ((np.float32, 1e-6), (np.float64, 1e-13)):
            for l2, strided in ((False, False), (True, False)):  # the simulator sends only contiguous arrays
                n = updaters_cuda.BLOCK + 3
                state, g, p, decay, out = step_inputs(np.random.default_rng(len(name)), n, dtype, slots, l2, strided)
                expected = [a.copy() for a in (*state, out)]
                got = [a if SIMULATED else cuda.to_device(np.ascontiguousarray(a)) for a in (*state, out)]
                args = (g, p, decay) if SIMULATED else tuple(None if a is None else cuda.to_device(
                    np.ascontiguousarray(a)) for a in (g, p, decay))
                for t in (1, 2, 3):
                    if name == "adamw amsgrad":
                        scalars = (np.full(n, 0.01, dtype), 0.001, 0.9, 0.999, 1e-8, t)
                        getattr(updaters, function)(expected[0], expected[1], expected[2], g, p, decay,
                                                    scalars[0], *scalars[1:], expected[3])
                        getattr(updaters_cuda, function)(got[0], got[1], got[2], *args, scalars[0] if SIMULATED else
                                                         cuda.to_device(scalars[0]), *scalars[1:], got[3])
                        continue
                    scalars = (0.002, 0.9, 0.999, 1e-8, 0.9 * (1 - 0.5 * 0.96 ** (t * 0.004)),
                               0.9 * (1 - 0.5 * 0.96 ** ((t + 1) * 0.004)), 0.5 ** t, 0.5 ** (t + 1), t) \
                        if name == "nadam" else arguments(t)
                    getattr(updaters, function)(*expected[:-1], g, p, decay, *scalars, expected[-1])
                    getattr(updaters_cuda, function)(*got[:-1], *args, *scalars, got[-1])
                for want, have in zip(expected, got):
                    have = have if SIMULATED else have.copy_to_host()
                    np.testing.assert_allclose(have, want, rtol=tolerance, atol=tolerance,
                                               err_msg=f"{name} {dtype.__name__} l2={l2} strided={strided}")


def device(array):
    """What the GPU kernels take in this run: the numpy array under the simulator, a device copy on a GPU."""
    return array if SIMULATED else cuda.to_device(np.ascontiguousarray(array))


def host(array):
    return array if SIMULATED else array.copy_to_host()


def check_activations() -> None:
    """Bias + activation, its derivative and dropout (kernels/activations_cuda.py) write what the CPU kernels write:
    every activation, with a bias and without, in float32 and float64, past one block of threads; the dropout mask
    bit for bit."""
    rng = np.random.default_rng(12)
    with simulated_blocks(8, (activations_cuda, "BLOCK")):
        for dtype, tolerance in ((np.float32, 1e-6), (np.float64, 1e-13)):
            z = rng.normal(0, 2, (3, 7)).astype(dtype)  # 21 elements: 3 blocks of 8 under the simulator
            dy, bias = rng.normal(size=z.shape).astype(dtype), rng.normal(size=7).astype(dtype)
            for kind in (*activations.KINDS, *activations.INPUT_KINDS):
                for b in (bias, bias[:0]):
                    want, got = np.empty_like(z), device(np.zeros_like(z))
                    activations.bias_activation(z, b, kind, want)
                    activations_cuda.bias_activation(device(z), device(b) if b.size else b, kind, got)
                    np.testing.assert_allclose(host(got), want, rtol=tolerance, atol=tolerance,
                                               err_msg=f"bias_activation {kind} {dtype.__name__} bias={b.size}")
                saved = z if kind in activations.INPUT_KINDS else want
                expected, got = np.empty_like(z), device(np.zeros_like(z))
                activations.activation_backward(dy, saved, kind, expected)
                activations_cuda.activation_backward(device(dy), device(saved), kind, got)
                np.testing.assert_allclose(host(got), expected, rtol=tolerance, atol=tolerance,
                                           err_msg=f"activation_backward {kind} {dtype.__name__}")
            seed, threshold = np.uint64(0xC0FFEE), int(0.3 * 2 ** activations.KEYED_BITS)
            want, mask = np.empty_like(z), np.empty_like(z)
            activations.dropout(z, seed, threshold, 1 / 0.7, want, mask)
            got, got_mask = device(np.zeros_like(z)), device(np.zeros_like(z))
            activations_cuda.dropout(device(z), seed, threshold, 1 / 0.7, got, got_mask)
            assert np.array_equal(host(got_mask), mask) and np.array_equal(host(got), want), f"dropout {dtype.__name__}"
            assert 0 < (mask == 0).sum() < mask.size, "dropout: a mask that keeps all or nothing tests nothing"
    print("ok activations", flush=True)


def check_cross_entropy() -> None:
    """Softmax cross-entropy (kernels/loss_cuda.py) against the CPU kernel, plain and weighted: the gradient to the
    device's rounding of exp, the mean loss to rounding (another order of the sum), the correct count exactly; more
    rows than threads, so a thread takes several, and a batch of one row."""
    rng = np.random.default_rng(13)
    with simulated_blocks(8, (loss_cuda, "THREADS")):
        for dtype in (np.float32, np.float64):
            for rows in (1, 2 * loss_cuda.THREADS + 3):
                logits = rng.normal(0, 3, (rows, 5)).astype(dtype)
                labels = rng.integers(0, 5, rows).astype(np.int32)
                weights = rng.uniform(0.5, 2.0, 5)
                for weighted in (False, True):
                    grad, totals = np.empty_like(logits), np.zeros(2)
                    got_grad, got_totals = device(np.zeros_like(logits)), device(np.zeros(2))
                    if weighted:
                        loss.weighted_softmax_cross_entropy(logits, labels, weights, grad, totals)
                        loss_cuda.weighted_softmax_cross_entropy(device(logits), device(labels), device(weights),
                                                                 got_grad, got_totals)
                    else:
                        loss.softmax_cross_entropy(logits, labels, grad, totals)
                        loss_cuda.softmax_cross_entropy(device(logits), device(labels), got_grad, got_totals)
                    name = f"cross-entropy {dtype.__name__} rows={rows} weighted={weighted}"
                    rtol = 1e-6 if dtype is np.float32 else 1e-12  # float32's exp: the simulator's is Python's
                    np.testing.assert_allclose(host(got_grad), grad, rtol=rtol, atol=1e-7, err_msg=name)
                    np.testing.assert_allclose(host(got_totals)[0], totals[0], rtol=rtol, err_msg=name)
                    assert host(got_totals)[1] == totals[1] and 0 <= totals[1] <= rows, name
    print("ok cross-entropy", flush=True)


def check_smoothed_cross_entropy_and_score() -> None:
    """Label-smoothed cross-entropy (kernels/loss_cuda.py), weighted and not, against the CPU kernel (the same
    gradient to the device's exp, the loss to rounding, the correct count exactly); evaluation's score: the
    confusion counts exactly and the loss sum to rounding, added to what the sums held."""
    rng = np.random.default_rng(21)
    with simulated_blocks(8, (loss_cuda, "THREADS")):
        for dtype in (np.float32, np.float64):
            rtol = 1e-6 if dtype is np.float32 else 1e-12
            for rows in (1, 2 * loss_cuda.THREADS + 3):
                logits = rng.normal(0, 3, (rows, 5)).astype(dtype)
                labels = rng.integers(0, 5, rows).astype(np.int32)
                for weights in (None, rng.uniform(0.5, 2.0, 5)):
                    grad, totals = np.empty_like(logits), np.zeros(2)
                    got_grad, got_totals = device(np.zeros_like(logits)), device(np.zeros(2))
                    loss.smoothed_softmax_cross_entropy(logits, labels, weights, 0.1, grad, totals)
                    loss_cuda.smoothed_softmax_cross_entropy(device(logits), device(labels),
                                                             None if weights is None else device(weights), 0.1,
                                                             got_grad, got_totals)
                    name = f"smoothed cross-entropy {dtype.__name__} rows={rows} weighted={weights is not None}"
                    np.testing.assert_allclose(host(got_grad), grad, rtol=rtol, atol=1e-7, err_msg=name)
                    np.testing.assert_allclose(host(got_totals)[0], totals[0], rtol=rtol, err_msg=name)
                    assert host(got_totals)[1] == totals[1], name
                confusion, loss_sum = np.full(25, 2.0), np.array([1.5])  # sums already holding a batch's
                got_confusion, got_loss = device(confusion.copy()), device(loss_sum.copy())
                loss.score(logits, labels, confusion, loss_sum)
                loss_cuda.score(device(logits), device(labels), got_confusion, got_loss)
                name = f"score {dtype.__name__} rows={rows}"
                assert np.array_equal(host(got_confusion), confusion) and confusion.sum() == 50 + rows, name
                np.testing.assert_allclose(host(got_loss), loss_sum, rtol=rtol, err_msg=name)
    print("ok smoothed cross-entropy and score", flush=True)


def check_layernorm() -> None:
    """Layer normalization's forward and backward (kernels/layernorm_cuda.py) against the CPU kernels: with and
    without a fused activation, with and without the input's gradient, float32 and float64, more rows and features
    than a block has threads."""
    rng = np.random.default_rng(14)
    with simulated_blocks(4, (layernorm_cuda, "BLOCK")):
        for dtype, tolerance in ((np.float32, 2e-5), (np.float64, 1e-12)):
            rows, features = 6, 5
            x = (rng.normal(0, 3, (rows, features)) + 10).astype(dtype)  # far from 0: the shifted sums matter
            gamma, beta = rng.normal(size=features).astype(dtype), rng.normal(size=features).astype(dtype)
            dy = rng.normal(size=x.shape).astype(dtype)
            for kind, input_grad in (("none", True), ("tanh", True), ("relu", False)):
                want = {name: np.zeros(shape, dtype) for name, shape in (("x_hat", x.shape), ("inv_std", (rows,)),
                        ("y", x.shape), ("dz", x.shape), ("dgamma", (features,)), ("dbeta", (features,)),
                        ("dx", x.shape))}
                got = {name: device(array.copy()) for name, array in want.items()}
                layernorm.forward(x, gamma, beta, 1e-5, want["x_hat"], want["inv_std"], want["y"], kind)
                layernorm.backward(dy.copy(), want["y"], kind, want["dz"], want["x_hat"], want["inv_std"], gamma,
                                   want["dgamma"], want["dbeta"], want["dx"] if input_grad else None)
                layernorm_cuda.forward(device(x), device(gamma), device(beta), 1e-5, got["x_hat"], got["inv_std"],
                                       got["y"], kind)
                layernorm_cuda.backward(device(dy.copy()), got["y"], kind, got["dz"], got["x_hat"], got["inv_std"],
                                        device(gamma), got["dgamma"], got["dbeta"], got["dx"] if input_grad else None)
                for name in want:
                    np.testing.assert_allclose(host(got[name]), want[name], rtol=tolerance, atol=tolerance,
                                               err_msg=f"layernorm {kind} {dtype.__name__}: {name}")
    print("ok layernorm", flush=True)


def check_embedding() -> None:
    """An embedding table's gather and scatter-add (kernels/embedding_cuda.py) against the CPU kernels: repeated ids,
    the sums bit for bit; on a GPU through a strided `out` and `values` (one column of a batch's (rows, columns, dim)
    array) as the layer passes them (the simulator takes only contiguous arrays)."""
    rng = np.random.default_rng(15)
    with simulated_blocks(8, (embedding_cuda, "BLOCK")):
        for dtype in (np.float32, np.float64):
            table = rng.normal(size=(7, 3)).astype(dtype)
            ids = np.array([4, 0, 4, 6, 4, 1], np.int64)
            batch = np.zeros((len(ids), 2, 3), dtype)
            embedding.gather_rows(table, ids, batch[:, 1])
            got = device(np.zeros_like(batch[:, 1]) if SIMULATED else np.zeros_like(batch))
            embedding_cuda.gather_rows(device(table), device(ids), got if SIMULATED else got[:, 1])
            assert np.array_equal(host(got), batch[:, 1] if SIMULATED else batch), f"gather {dtype.__name__}"
            values = rng.normal(size=(len(ids), 2, 3)).astype(dtype)
            grad, got = np.zeros_like(table), device(np.zeros_like(table))
            embedding.scatter_add_rows(grad, ids, values[:, 0])
            embedding_cuda.scatter_add_rows(got, device(ids), np.ascontiguousarray(values[:, 0]) if SIMULATED
                                            else device(values)[:, 0])
            assert np.array_equal(host(got), grad), f"scatter-add {dtype.__name__}"
    print("ok embedding", flush=True)


def check_windows() -> None:
    """im2col, col2im, their channels-last forms (kernels/im2col_cuda.py) and max pooling (kernels/pool_cuda.py)
    against the CPU kernels, bit for bit: padded and strided windows, overlapping ones, the side-by-side 2 x 2 pool
    with an odd last row and column, ties (pooled zeros) going to the first largest."""
    rng = np.random.default_rng(16)
    with simulated_blocks(32, (im2col_cuda, "BLOCK"), (pool_cuda, "BLOCK")):
        for dtype in (np.float32, np.float64):
            x = rng.normal(size=(2, 3, 5, 7)).astype(dtype)
            for kernel, stride, padding in ((3, 1, "same"), (2, 2, "valid"), (3, 2, "same")):
                g = im2col.geometry(x.shape[1:], kernel, stride, padding)
                name = f"{kernel}x{kernel} stride {stride} {padding} {dtype.__name__}"
                for last in (False, True):
                    shape = (len(x), g.out_height, g.out_width, *((*g.kernel, g.channels) if last else
                                                                  (g.channels, *g.kernel)))
                    image = np.zeros((len(x), *x.shape[2:], x.shape[1]), dtype)
                    cols, got = np.zeros(shape, dtype), device(np.zeros(shape, dtype))
                    if last:
                        im2col.im2col_channels_last(x, g, image, cols)
                        im2col_cuda.im2col_channels_last(device(x), g, None, got)
                    else:
                        im2col.im2col(x, g, 0.0, cols)
                        im2col_cuda.im2col(device(x), g, 0.0, got)
                    assert np.array_equal(host(got), cols), f"im2col {name} channels_last={last}"
                    dcols = rng.normal(size=shape).astype(dtype)
                    dx, got = np.zeros_like(x), device(np.zeros_like(x))
                    if last:
                        im2col.col2im_channels_last(dcols, g, image, dx)
                        im2col_cuda.col2im_channels_last(device(dcols), g, None, got)
                    else:
                        im2col.col2im(dcols, g, dx)
                        im2col_cuda.col2im(device(dcols), g, got)
                    assert np.array_equal(host(got), dx), f"col2im {name} channels_last={last}"
                pooled = np.maximum(x, 0)  # ReLU's zeros: ties
                y = np.zeros((len(x), g.channels, g.out_height, g.out_width), dtype)
                where = np.zeros(y.shape, np.int32)
                got_y, got_where = device(np.zeros_like(y)), device(np.zeros_like(where))
                pool.max_pool(pooled, g, y, where)
                pool_cuda.max_pool(device(pooled), g, got_y, got_where)
                assert np.array_equal(host(got_y), y) and np.array_equal(host(got_where), where), f"max pool {name}"
                dy = rng.normal(size=y.shape).astype(dtype)
                dx, got = np.zeros_like(x), device(np.zeros_like(x))
                pool.max_pool_backward(dy, where, g, dx)
                pool_cuda.max_pool_backward(device(dy), device(where), g, got)
                assert np.array_equal(host(got), dx), f"max pool backward {name}"
    print("ok windows", flush=True)


def check_batchnorm() -> None:
    """Batch normalization's forward (training and evaluation) and backward (kernels/batchnorm_cuda.py) against the
    CPU kernels: images (S > 1) and dense features (S = 1), a fused activation, with and without the input's
    gradient, more values per channel than a block has threads, the running statistics too."""
    rng = np.random.default_rng(17)
    with simulated_blocks(8, (batchnorm_cuda, "THREADS")):
        for dtype, tolerance in ((np.float32, 2e-5), (np.float64, 1e-11)):
            for shape, kind, training, input_grad in (((5, 3, 6), "relu", True, True), ((9, 4, 1), "none", True, False),
                                                      ((5, 3, 6), "tanh", False, True)):
                x = (rng.normal(0, 2, shape) + 5).astype(dtype)
                dy = rng.normal(size=shape).astype(dtype)
                gamma, beta = rng.normal(size=shape[1]).astype(dtype), rng.normal(size=shape[1]).astype(dtype)
                arrays = {"mean": rng.normal(size=shape[1]), "var": rng.uniform(0.5, 2, shape[1]),
                          "x_hat": np.zeros(shape), "inv_std": np.zeros(shape[1]), "y": np.zeros(shape),
                          "dz": np.zeros(shape), "dgamma": np.zeros(shape[1]), "dbeta": np.zeros(shape[1]),
                          "dx": np.zeros(shape)}
                want = {name: array.astype(dtype) for name, array in arrays.items()}
                got = {name: device(array.copy()) for name, array in want.items()}
                for run, out, on in ((batchnorm, want, np.asarray), (batchnorm_cuda, got, device)):
                    run.forward(on(x), on(gamma), on(beta), 1e-5, out["mean"], out["var"], 0.9, training,
                                out["x_hat"], out["inv_std"], out["y"], kind)
                    run.backward(on(dy.copy()), out["y"], kind, out["dz"], out["x_hat"], out["inv_std"], on(gamma),
                                 out["dgamma"], out["dbeta"], out["dx"] if input_grad else None)
                for name in want:
                    np.testing.assert_allclose(host(got[name]), want[name], rtol=tolerance, atol=tolerance,
                                               err_msg=f"batchnorm {shape} {kind} training={training} "
                                                       f"{dtype.__name__}: {name}")
    print("ok batchnorm", flush=True)


def main() -> None:
    if SIMULATED:
        # The simulator's scheduler spins, polling its threads, while they run: with Python's default switch
        # interval (5 ms) each hand-over of the interpreter waits that long. 0.5 ms: the check in half the time.
        sys.setswitchinterval(0.0005)
    start = time.perf_counter()
    for name, residual, tau in edge_cases():
        for encoding in ("sparse", "bitmap"):
            check(TILES, name, residual, tau, encoding)
    for encoding in ("sparse", "bitmap"):
        check(TILES, "4 blocks", *residual_with_fraction(1000, 0.05, seed=7), encoding)
    check(CARRY, "scan carried over 10 tiles", *residual_with_fraction(600, 0.03, seed=8), "sparse")
    check_errors()
    check_clip()
    if not SIMULATED:
        check_default_launch()
    check_dispatch()
    check_recurrent_steps()
    check_updater_steps()
    check_activations()
    check_cross_entropy()
    check_smoothed_cross_entropy_and_score()
    check_layernorm()
    check_embedding()
    check_windows()
    check_batchnorm()
    print(f"OK ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
