"""The layers' matrix products, and a cuBLAS of mpitrain's own that a CUDA graph capture can record.

    matmul(a, b, out)                     # out = a @ b: numpy's BLAS, cupy's cuBLAS, or the capturable GEMM in use
    with capturable_gemm(gemm): ...       # this thread's products on `gemm` (a CublasGemm) inside the block

Why a GEMM of its own: cupy's cuBLAS refuses a capturing stream (cupy_backends' `setStream`, called before every
cuBLAS routine, raises NotImplementedError while the stream captures: cupy#6290), so no step with a `cupy.matmul`
can be a CUDA graph. cuBLAS itself records into a graph once its handle has a workspace of its own (without one it
may allocate during the capture, which a capture refuses). `CublasGemm` calls cuBLAS through nvmath-python's
bindings (`nvmath.bindings.cublas`, NVIDIA's), on a handle made here: its workspace set once, its stream set to
cupy's current one whenever that changes, the routines those of cupy.matmul (s/dgemm and their strided-batched
forms). Chosen over cuBLASLt: the same GEMMs as the uncaptured step without matmul descriptors, layouts and a
heuristic query per shape, and the bindings are the maintained ones NVIDIA ships (docs/gpus.md).

Layout: cuBLAS is column-major. A row-major `out` (m, n) is, read column-major, out^T (n, m) = b^T a^T, so the call
is gemm(op_b, op_a, n, m, k, b, a, out). An operand whose rows are contiguous reads as its own transpose (op N); a
transposed view (columns contiguous: `w.T`, `k.transpose(0, 1, 3, 2)`) reads as itself (op T); anything else is
copied contiguous first. More than two dimensions: one strided-batched call over the leading dimensions when each
operand steps through them by one stride (else a contiguous copy); no broadcasting. Not a collective.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from mpitrain.base.arrays import array_module

WORKSPACE_BYTES = 32 << 20  # cuBLAS's recommendation for Hopper (4 MiB for earlier GPUs)
OP_N, OP_T = 0, 1  # cublasOperation_t

_in_use = threading.local()  # this thread's CublasGemm inside `capturable_gemm`


def matmul(a, b, out) -> None:
    """out = a @ b (2-D, or stacks of matrices of the same leading shape): on the capturable GEMM this thread uses
    (`capturable_gemm`) for device arrays, else `matmul` of the arrays' module."""
    gemm = getattr(_in_use, "gemm", None)
    if gemm is not None and not isinstance(out, np.ndarray):
        gemm(a, b, out)
    else:
        array_module(out).matmul(a, b, out=out)


@contextlib.contextmanager
def capturable_gemm(gemm):
    """This thread's `matmul` of device arrays on `gemm` within the block (the graphed training step's)."""
    outer = getattr(_in_use, "gemm", None)
    _in_use.gemm = gemm
    try:
        yield gemm
    finally:
        _in_use.gemm = outer


class CublasGemm:
    """Row-major products on one cuBLAS handle with a preset workspace (see the module's docstring).

    `cublas` is nvmath's bindings module (or a stand-in with its functions); `address(array)` an array's first
    element; `current_stream()` the stream the next call must run on; `contiguous(array)` a C-contiguous copy;
    `workspace` an array of WORKSPACE_BYTES bytes kept for the handle's life. One thread uses an instance."""

    ROUTINES = {np.dtype(np.float32): ("sgemm", "sgemm_strided_batched"),
                np.dtype(np.float64): ("dgemm", "dgemm_strided_batched")}

    def __init__(self, cublas, address, current_stream, contiguous, workspace):
        self.cublas, self.address, self.current_stream, self.contiguous = cublas, address, current_stream, contiguous
        self.workspace = workspace
        self.handle = cublas.create()
        cublas.set_workspace(self.handle, address(workspace), workspace.nbytes)
        self.stream = None
        self.scalars = {dtype: (np.ones(1, dtype), np.zeros(1, dtype)) for dtype in self.ROUTINES}  # alpha, beta

    @classmethod
    def on_device(cls) -> CublasGemm:
        """The handle for cupy's current device (nvmath-python must be installed: `gemm_unavailable`)."""
        import cupy
        from nvmath.bindings import cublas
        return cls(cublas, lambda array: array.data.ptr, lambda: cupy.cuda.get_current_stream().ptr,
                   cupy.ascontiguousarray, cupy.empty(WORKSPACE_BYTES, dtype=np.uint8))

    def __call__(self, a, b, out) -> None:
        """out = a @ b. out's matrices must have contiguous rows (the workspace's and the flat gradient's do)."""
        dtype = out.dtype
        if dtype not in self.ROUTINES or a.dtype != dtype or b.dtype != dtype:
            raise TypeError(f"a capturable GEMM multiplies float32 or float64 arrays of one type, not {a.dtype} @ "
                            f"{b.dtype} into {dtype}")
        batch = out.shape[:-2]
        if a.shape[:-2] != batch or b.shape[:-2] != batch or a.shape[-1] != b.shape[-2] \
                or out.shape[-2:] != (a.shape[-2], b.shape[-1]):
            raise ValueError(f"matmul of {a.shape} and {b.shape} into {out.shape}: the shapes do not match")
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        if out.size == 0:
            return
        if k == 0:
            out.fill(0)
            return
        size = dtype.itemsize
        c_stride = _batch_stride(out, size)
        if out.strides[-1] != size or out.strides[-2] < n * size or c_stride is None:
            raise ValueError(f"the output of a capturable GEMM must have contiguous rows, not strides {out.strides}")
        a, op_a, lda, a_stride = self._operand(a, size)
        b, op_b, ldb, b_stride = self._operand(b, size)
        self._follow_stream()
        one, zero = (s.ctypes.data for s in self.scalars[dtype])
        routine, batched = self.ROUTINES[dtype]
        ldc = out.strides[-2] // size
        count = int(np.prod(batch, dtype=np.int64))
        if batch:
            getattr(self.cublas, batched)(self.handle, op_b, op_a, n, m, k, one, self.address(b), ldb, b_stride,
                                          self.address(a), lda, a_stride, zero, self.address(out), ldc, c_stride,
                                          count)
        else:
            getattr(self.cublas, routine)(self.handle, op_b, op_a, n, m, k, one, self.address(b), ldb,
                                          self.address(a), lda, zero, self.address(out), ldc)

    def _operand(self, x, size: int):
        """(x or a contiguous copy, its op, its leading dimension, its batch stride), all in elements."""
        rows, columns = x.shape[-2:]
        batch_stride = _batch_stride(x, size)
        if batch_stride is not None:
            row_step, column_step = x.strides[-2:]
            if column_step == size and row_step % size == 0 and row_step >= max(columns, 1) * size:
                return x, OP_N, row_step // size, batch_stride  # rows contiguous: column-major, it is x^T
            if row_step == size and column_step % size == 0 and column_step >= max(rows, 1) * size:
                return x, OP_T, column_step // size, batch_stride  # a transposed view: column-major, it is x
        x = self.contiguous(x)
        return x, OP_N, max(columns, 1), rows * columns

    def _follow_stream(self) -> None:
        stream = self.current_stream()
        if stream != self.stream:
            self.cublas.set_stream(self.handle, stream)
            self.stream = stream


def _batch_stride(x, size: int) -> int | None:
    """The elements between consecutive matrices of `x` over all its leading dimensions taken as one, or None
    when they do not step by one stride (0 for a single matrix)."""
    dims = [(count, stride) for count, stride in zip(x.shape[:-2], x.strides[:-2]) if count > 1]
    if not dims:
        return 0
    for (_, outer), (count, inner) in zip(dims, dims[1:]):
        if outer != inner * count:
            return None
    stride = dims[-1][1]
    return stride // size if stride >= 0 and stride % size == 0 else None


def gemm_unavailable() -> str | None:
    """Why `CublasGemm.on_device` cannot work here (nvmath-python missing), or None."""
    try:
        from nvmath.bindings import cublas  # noqa: F401
    except ImportError as e:
        return f"nvmath-python is not installed ({e}): cupy's cuBLAS cannot be captured (pip install nvmath-python)"
    return None
