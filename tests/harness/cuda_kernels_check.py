"""Hold the numba-CUDA kernels to the numpy reference, under the CUDA simulator or on a GPU.

Run as `NUMBA_ENABLE_CUDASIM=1 python -m mpitrain.testing.cuda_kernels_check` (the kernels' unit tests do so
in a subprocess: the simulator must be on before numba.cuda is first imported), or without the
simulator on a CUDA GPU (the GPU tests), where the default launch shape also runs on millions of
elements. Every mismatch raises AssertionError, so the exit status is non-zero; success prints OK last.
The simulator runs each thread as a Python thread: n stays small, blocks are small.
"""
from __future__ import annotations

import os
import time

import numpy as np
from numba import cuda

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
assert SIMULATED or cuda.is_available(), "run with NUMBA_ENABLE_CUDASIM=1, or on a machine with a CUDA GPU"

from mpitrain.kernels import recurrent_cuda, updaters, updaters_cuda  # noqa: E402
from mpitrain.kernels import threshold as kernels  # noqa: E402
from mpitrain.kernels.threshold import cuda as cuda_kernels  # noqa: E402
from mpitrain.kernels.threshold import message, reference  # noqa: E402
from mpitrain.testing.recurrent_steps import outputs, step_arrays, step_backward, step_forward  # noqa: E402
from mpitrain.testing.threshold_cases import bits, edge_cases, residual_with_fraction  # noqa: E402
from mpitrain.testing.updater_cases import STEPS, step_inputs  # noqa: E402

TILES = cuda_kernels.CudaKernels(block=32, per_thread=8)  # n = 1000: 4 blocks of 256 elements
CARRY = cuda_kernels.CudaKernels(block=4, per_thread=16)  # n = 600: 10 tiles, so the scan carries


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
    block = updaters_cuda.BLOCK
    updaters_cuda.BLOCK = 8 if SIMULATED else block  # the simulator runs a thread at a time: blocks stay small
    try:
        _check_updater_steps(variants)
    finally:
        updaters_cuda.BLOCK = block
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


def main() -> None:
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
    print(f"OK ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
