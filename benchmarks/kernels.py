"""Threshold encode/decode throughput on the CPU, beside a numpy copy of the same array.

Throughput is GB/s of residual read: n * itemsize / seconds (for decode, which touches only
the sent elements, that is an effective rate). `np.copyto` of the same array in the same run
(one thread) is the memory-bandwidth yardstick; the numba kernels use NUMBA_NUM_THREADS
threads; the numpy reference shows what numba buys. The residual is re-filled outside the
timed region before every repetition, tau is the (1 - sparsity) quantile of |r|, and each
figure is the best of `--repeat` runs after a warm-up (which also compiles the kernels).

Target: numba encode >= 50% of the copy's bandwidth.

`--backend cupy` measures the numba-CUDA kernels on cupy arrays instead, beside a
device-to-device copy (`cupy.copyto`) of the same array; every timed run ends with a device
synchronize; results in `kernels_gpu.json`. Without a GPU it stops at once, saying so.

    python benchmarks/kernels.py [--n 10000000] [--sparsity 1e-3] [--repeat 7] [--out benchmarks/results]
    python benchmarks/kernels.py --backend cupy
"""
from __future__ import annotations

import argparse
import sys
import time
from functools import partial

import numba
import numpy as np

from mpitrain.kernels import threshold as kernels
from mpitrain.kernels.threshold import message, reference
from mpitrain.parallel.backend import gpu_available

from common import markdown_table, write_results


def best_seconds(run, prepare=None, repeat: int = 7):
    """(best time of `run()` over `repeat` runs after a warm-up, its last result); `prepare()` runs untimed."""
    best, result = float("inf"), None
    for attempt in range(repeat + 1):
        if prepare:
            prepare()
        start = time.perf_counter()
        result = run()
        if attempt:
            best = min(best, time.perf_counter() - start)
    return best, result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--sparsity", type=float, default=1e-3)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy",
                        help="cupy: the numba-CUDA kernels beside a device-to-device copy (kernels_gpu.json)")
    args = parser.parse_args(argv)
    if args.backend == "cupy":
        return gpu_main(args)

    source = np.random.default_rng(0).standard_normal(args.n).astype(np.float32)
    tau = float(np.quantile(np.abs(source), 1 - args.sparsity))
    residual, copy, out = np.empty_like(source), np.empty_like(source), np.zeros_like(source)
    refill = partial(np.copyto, residual, source)
    seconds = {}
    seconds["copy"], _ = best_seconds(partial(np.copyto, copy, source), repeat=args.repeat)
    seconds["encode"], encoded = best_seconds(partial(kernels.threshold_encode, residual, tau), refill, args.repeat)
    seconds["encode_reference"], _ = best_seconds(partial(message.encode, reference, residual, tau), refill,
                                                  args.repeat)
    seconds["decode"], _ = best_seconds(partial(kernels.threshold_decode, encoded, out), repeat=args.repeat)
    seconds["decode_reference"], _ = best_seconds(partial(message.decode, reference, encoded, out),
                                                  repeat=args.repeat)

    result = kernel_result(args, seconds, encoded, source.itemsize, numba_threads=numba.get_num_threads())
    table = (f"{args.n} float32, sparsity {args.sparsity}, {result['numba_threads']} numba thread(s); "
             f"target: encode >= 0.5 x copy\n\n" + rates_table(result))
    write_results(args.out, "kernels", result, table)
    return result


def gpu_main(args) -> dict:
    """The numba-CUDA encode and decode on cupy arrays, beside a device-to-device copy."""
    if not gpu_available():
        sys.exit("kernels.py --backend cupy: no CUDA GPU here (cupy is missing or cupy.is_available() is False); "
                 "nothing was measured. Install mpitrain[gpu] on a GPU machine.")
    import cupy

    def synchronized(run):
        def timed():
            result = run()
            cupy.cuda.Device().synchronize()
            return result
        return timed

    host = np.random.default_rng(0).standard_normal(args.n).astype(np.float32)
    tau = float(np.quantile(np.abs(host), 1 - args.sparsity))
    source = cupy.asarray(host)
    residual, copy, out = cupy.empty_like(source), cupy.empty_like(source), cupy.zeros_like(source)
    refill = synchronized(partial(cupy.copyto, residual, source))
    seconds = {}
    seconds["copy"], _ = best_seconds(synchronized(partial(cupy.copyto, copy, source)), repeat=args.repeat)
    seconds["encode"], encoded = best_seconds(synchronized(partial(kernels.threshold_encode, residual, tau)), refill,
                                              args.repeat)
    seconds["decode"], _ = best_seconds(synchronized(partial(kernels.threshold_decode, encoded, out)),
                                        repeat=args.repeat)
    device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    result = kernel_result(args, seconds, encoded, source.itemsize, device=device)
    table = (f"{args.n} float32 on {result['device']}, sparsity {args.sparsity}; numba-CUDA kernels on cupy arrays "
             f"beside a device-to-device copy; target: encode >= 0.5 x copy\n\n" + rates_table(result))
    write_results(args.out, "kernels_gpu", result, table)
    return result


def kernel_result(args, seconds: dict, encoded, itemsize: int, **where) -> dict:
    """What a kernels run writes: the sizes, `where` it ran, each kernel's GB/s of residual read and ms."""
    gbytes = args.n * itemsize / 1e9
    rates = {name: gbytes / s for name, s in seconds.items()}
    return {"n": args.n, "sparsity": args.sparsity, **where,
            "count": kernels.message_count(encoded), "encoding": kernels.message_encoding(encoded),
            "gb_per_s": rates, "ms": {name: 1e3 * s for name, s in seconds.items()},
            "encode_over_copy": rates["encode"] / rates["copy"]}


def rates_table(result: dict) -> str:
    """Each kernel's ms, GB/s and rate over the copy's, as a markdown table."""
    rates = result["gb_per_s"]
    rows = [[name, f"{result['ms'][name]:.2f}", f"{rate:.2f}", f"{rate / rates['copy']:.2f}"]
            for name, rate in rates.items()]
    return markdown_table(["kernel", "ms", "GB/s", "/ copy"], rows, "lrrr") + "\n"


if __name__ == "__main__":
    main()
