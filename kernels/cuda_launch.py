"""Launching numba-CUDA kernels on cupy arrays: on cupy's current stream, through numba views made once per buffer.

    launch(kernel, grid, block, *args)      # cupy arrays as numba views; numpy arrays (the simulator's) as they are
    launch_over(kernel, threads, block, *args)   # enough blocks of `block` threads for `threads`; none for 0

A numba view of a cupy array costs more than a small kernel, and the layers' workspace arrays persist across steps
and batches, so each buffer's view is made once and kept (`numba_view`). No stream sync: the kernels run on the
stream that wrote the arrays. The layers' kernels/*_cuda.py modules launch this way.
"""
from __future__ import annotations

import functools

from numba import cuda


def launch(kernel, grid, block, *args) -> None:
    """`kernel[grid, block]` on the current cupy stream for cupy arrays (numpy arrays: the simulator's, on its
    default stream)."""
    stream = _stream(_cupy_stream()) if hasattr(args[0], "__cuda_array_interface__") else 0
    kernel[grid, block, stream](*(numba_view(a) if hasattr(a, "__cuda_array_interface__") else a for a in args))


def launch_over(kernel, threads: int, block: int, *args) -> None:
    """`launch` of `kernel` on enough blocks of `block` threads to cover `threads` (none for an empty range)."""
    if threads:
        launch(kernel, -(-threads // block), block, *args)


def _cupy_stream() -> int:
    import cupy
    return cupy.cuda.get_current_stream().ptr


@functools.lru_cache(maxsize=8)
def _stream(pointer: int):
    """numba's handle of cupy's stream `pointer` (0: the default stream)."""
    return cuda.external_stream(pointer) if pointer else cuda.default_stream()


def numba_view(array):
    """numba's view of a cupy array, made once per buffer, shape and strides."""
    interface = array.__cuda_array_interface__
    return _view(interface["data"][0], tuple(interface["shape"]), interface["strides"] and tuple(interface["strides"]),
                 interface["typestr"], array)


_views: dict = {}  # (pointer, shape, strides, type) -> numba's view; the view keeps its array, so its memory alive
VIEWS = 256  # views kept at most: the workspaces grow now and then, and a view of a replaced buffer is not needed


def _view(pointer: int, shape: tuple, strides, typestr: str, array):
    key = (pointer, shape, strides, typestr)
    view = _views.get(key)
    if view is None:
        if len(_views) >= VIEWS:
            _views.clear()
        view = _views[key] = cuda.as_cuda_array(array, sync=False)
    return view
