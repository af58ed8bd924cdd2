"""One switch for the layer kernels: numpy arrays take the numba path, any other array (cupy) the
reference written against `xp`, or where the kernel names a GPU module, that module's kernel of its name.

    @numpy_or_reference("max_pool_reference")
    def max_pool(x, g, out, where):
        _max_pool_cpu(x, ...)            # the body is the numpy path

    @numpy_or_reference("sgd_step_reference", gpu=".updaters_cuda")   # cupy arrays: updaters_cuda.sgd_step

The array that decides is the first argument unless `on` names another. The reference is looked
up by name in the kernel's module when called, so it may be defined below the kernel; the GPU module
is imported at its first call (numba.cuda only where a GPU path runs).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys

import numpy as np


def numpy_or_reference(reference: str, on: str | None = None, gpu: str | None = None):
    """Decorate a kernel whose body is its numpy path: calls with a non-numpy array at parameter `on` (default:
    the first) go to the function `reference` of the kernel's module instead, with the same arguments; with `gpu`
    (a module relative to the kernel's), a device array goes to that module's function of the kernel's name."""
    def decorate(cpu_path):
        names = list(inspect.signature(cpu_path).parameters)
        position = names.index(on) if on else 0
        module = sys.modules[cpu_path.__module__]

        @functools.wraps(cpu_path)
        def kernel(*args, **kwargs):
            array = args[position] if position < len(args) else kwargs[names[position]]
            if isinstance(array, np.ndarray):
                return cpu_path(*args, **kwargs)
            if gpu and hasattr(array, "__cuda_array_interface__"):
                device = importlib.import_module(gpu, module.__package__)
                return getattr(device, cpu_path.__name__)(*args, **kwargs)
            return getattr(module, reference)(*args, **kwargs)
        return kernel
    return decorate
