"""kernels/gemm.py: the capturable GEMM's row-major to column-major mapping, checked on the CPU against numpy.

`HostBlas` stands in for nvmath's cuBLAS bindings at that one boundary: it reads each address the GEMM passes as
host memory laid out column-major, as cuBLAS would read device memory, and multiplies with numpy. This checks which
routine, operations, leading dimensions and strides the GEMM chooses, not cuBLAS, and is not a GPU test (the GPU
check runs the same products on a device: tests/system/test_gpu_graphs.py).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from mpitrain.kernels.gemm import OP_N, OP_T, CublasGemm, capturable_gemm, matmul


def _column_major(address: int, dtype, rows: int, columns: int, ld: int):
    """The rows x columns matrix at `address`, column-major with leading dimension `ld`, as a writable view."""
    size = np.dtype(dtype).itemsize
    count = (rows - 1) + (columns - 1) * ld + 1
    memory = np.frombuffer((ctypes.c_char * (count * size)).from_address(address), dtype=dtype)
    return np.lib.stride_tricks.as_strided(memory, (rows, columns), (size, ld * size))


class HostBlas:
    """The bindings' calls CublasGemm makes, on host memory."""

    def __init__(self):
        self.calls, self.streams, self.workspace = [], [], None

    def create(self):
        return 11

    def set_workspace(self, handle, address, nbytes):
        self.workspace = (handle, address, nbytes)

    def set_stream(self, handle, stream):
        self.streams.append(stream)

    def sgemm(self, handle, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        self._gemm(np.float32, "sgemm", handle, op_a, op_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1)

    def dgemm(self, handle, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        self._gemm(np.float64, "dgemm", handle, op_a, op_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1)

    def sgemm_strided_batched(self, handle, op_a, op_b, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                              count):
        self._gemm(np.float32, "sgemm_strided_batched", handle, op_a, op_b, m, n, k, alpha, a, lda, sa, b, ldb, sb,
                   beta, c, ldc, sc, count)

    def dgemm_strided_batched(self, handle, op_a, op_b, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                              count):
        self._gemm(np.float64, "dgemm_strided_batched", handle, op_a, op_b, m, n, k, alpha, a, lda, sa, b, ldb, sb,
                   beta, c, ldc, sc, count)

    def _gemm(self, dtype, name, handle, op_a, op_b, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, count):
        assert handle == 11
        size = np.dtype(dtype).itemsize
        scalar = lambda address: _column_major(address, dtype, 1, 1, 1)[0, 0]  # noqa: E731
        self.calls.append((name, op_a, op_b, m, n, k, lda, ldb, ldc, sa, sb, sc, count))
        for i in range(count):
            stored_a = _column_major(a + i * sa * size, dtype, *((m, k) if op_a == OP_N else (k, m)), lda)
            stored_b = _column_major(b + i * sb * size, dtype, *((k, n) if op_b == OP_N else (n, k)), ldb)
            out = _column_major(c + i * sc * size, dtype, m, n, ldc)
            product = (stored_a if op_a == OP_N else stored_a.T) @ (stored_b if op_b == OP_N else stored_b.T)
            out[...] = scalar(alpha) * product + (scalar(beta) * out if scalar(beta) else 0)  # C unread at beta 0


@pytest.fixture
def blas():
    return HostBlas()


def _gemm(blas, stream=(5,)):
    return CublasGemm(blas, lambda array: array.ctypes.data, lambda: stream[0], np.ascontiguousarray,
                      np.empty(64, dtype=np.uint8))


def _random(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _operands(rng, dtype):
    """(name, a, b) pairs covering every layout the layers pass."""
    a, b = _random(rng, (5, 3), dtype), _random(rng, (3, 4), dtype)
    wide = _random(rng, (5, 7), dtype)
    return [
        ("contiguous", a, b),
        ("a transposed", np.ascontiguousarray(a.T).T, b),
        ("b transposed", a, np.ascontiguousarray(b.T).T),
        ("both transposed", np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T),
        ("rows padded", wide[:, :3], b),  # a leading dimension larger than the columns
        ("columns strided", wide[:, ::3], b),  # neither layout: copied
        ("a column", a, b[:, :1]),
        ("a row", a[:1], b),
        ("attention's scores", _random(rng, (2, 3, 5, 4), dtype),
         np.ascontiguousarray(_random(rng, (2, 3, 6, 4), dtype)).transpose(0, 1, 3, 2)),
        ("heads of a wider batch", _random(rng, (2, 6, 5, 4), dtype)[:, ::2], _random(rng, (2, 3, 4, 2), dtype)),
        ("one matrix in a batch", _random(rng, (1, 1, 5, 4), dtype), _random(rng, (1, 1, 4, 3), dtype)),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_layout_gives_numpys_product(blas, dtype):
    rng = np.random.default_rng(0)
    gemm = _gemm(blas)
    for name, a, b in _operands(rng, dtype):
        out = np.full(a.shape[:-1] + b.shape[-1:], np.nan, dtype=dtype)
        gemm(a, b, out)
        tolerance = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, np.matmul(a, b), rtol=tolerance, atol=tolerance, err_msg=name)
    kinds = {call[0] for call in blas.calls}
    prefix = "s" if dtype == np.float32 else "d"
    assert kinds == {f"{prefix}gemm", f"{prefix}gemm_strided_batched"}


def test_transposed_views_are_read_in_place_and_others_copied(blas):
    rng = np.random.default_rng(1)
    a, b = _random(rng, (5, 3), np.float32), _random(rng, (3, 4), np.float32)
    gemm, out = _gemm(blas), np.empty((5, 4), np.float32)
    gemm(np.ascontiguousarray(a.T).T, b, out)
    # out^T = b^T a^T: b's rows are contiguous (op N, ld 4), a is a transposed view (op T, ld 5)
    assert blas.calls[-1][:9] == ("sgemm", OP_N, OP_T, 4, 5, 3, 4, 5, 4)
    wide = _random(rng, (5, 9), np.float32)
    gemm(wide[:, :3], b, out)
    assert blas.calls[-1][7] == 9  # a's leading dimension: its padded row
    gemm(wide[:, ::3], b, out)
    assert blas.calls[-1][7] == 3  # copied contiguous


def test_batched_strides(blas):
    rng = np.random.default_rng(2)
    q = _random(rng, (2, 3, 5, 4), np.float32)
    k = np.ascontiguousarray(_random(rng, (2, 3, 6, 4), np.float32)).transpose(0, 1, 3, 2)
    out = np.empty((2, 3, 5, 6), np.float32)
    _gemm(blas)(q, k, out)
    name, op_b, op_a, m, n, _, ld_b, ld_a, ldc, stride_b, stride_a, stride_c, count = blas.calls[-1]
    assert (name, op_b, op_a, count) == ("sgemm_strided_batched", OP_T, OP_N, 6)
    assert (stride_b, stride_a, stride_c) == (24, 20, 30)
    np.testing.assert_allclose(out, q @ k, rtol=1e-5, atol=1e-5)


def test_stream_is_set_when_it_changes(blas):
    stream = [5]
    gemm = _gemm(blas, stream)
    a, b, out = np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), np.empty((2, 2), np.float32)
    gemm(a, b, out)
    gemm(a, b, out)
    stream[0] = 9
    gemm(a, b, out)
    assert blas.streams == [5, 9]
    assert blas.workspace[1:] == (gemm.workspace.ctypes.data, 64)


def test_refusals_and_empty_products(blas):
    gemm = _gemm(blas)
    with pytest.raises(TypeError, match="float32 or float64"):
        gemm(np.ones((2, 2), np.int64), np.ones((2, 2), np.int64), np.empty((2, 2), np.int64))
    with pytest.raises(ValueError, match="do not match"):
        gemm(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match="contiguous rows"):
        gemm(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32), np.empty((2, 2), np.float32, order="F"))
    out = np.full((2, 3), 7.0, np.float32)
    gemm(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32), out)
    assert (out == 0).all() and not blas.calls


class DeviceArray:
    """What matmul sees of a device array: not a numpy array."""

    dtype = np.dtype(np.float32)


def test_matmul_uses_the_capturable_gemm_for_device_arrays_only():
    used = []
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    with capturable_gemm(lambda *args: used.append(args)):
        out = np.empty((2, 2), np.float32)
        matmul(a, b, out)  # host arrays: numpy's BLAS
        assert not used and (out == 3).all()
        device_out = DeviceArray()
        matmul(a, b, device_out)
        assert used == [(a, b, device_out)]
    matmul(a, b, out)
    assert len(used) == 1  # outside the block: the arrays' own matmul
