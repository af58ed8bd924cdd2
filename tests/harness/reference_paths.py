"""Training on the CPU along the GPU's kernel path: every layer kernel takes what cupy arrays run (kernels/dispatch.py)
on numpy arrays, instead of its numba CPU path: the references written against `xp`. The recurrent layers' steps run
numba-CUDA kernels there, which without a GPU only the CUDA simulator runs (NUMBA_ENABLE_CUDASIM=1), a thread at a
time: too slowly to train on more than a few rows.

    python -m mpitrain.testing.reference_paths OUT CONFIG [CONFIG ...]

trains each config twice in this process, 1 rank, from its seed: first on the numba kernels into the run directory
OUT/NAME-numba, then on the references into OUT/NAME-reference (NAME: the config's file name without its suffix).
Their last checkpoints hold the parameters after training. A reference that differs from its kernel in a whole model (an edge the kernel tests missed: a
sequence of no steps, say) shows as parameters apart, on a machine without a GPU.

This is not a GPU test and is not counted as one: what it stands in for at the array boundary is the dispatch on the
array's type, and `cupyx.scatter_add` (numpy's `np.add.at`). The layers' own cupy branches, cupy's kernels and the
device are not exercised: benchmarks/gpu_check.py on a GPU is.
"""
from __future__ import annotations

import functools
import os
import sys
import types

import numpy as np

from mpitrain.kernels import dispatch

_references = [False]  # the switch the patched dispatch reads at each call


def _numpy_or_reference(reference: str, on: str | None = None, gpu: str | None = None):
    """kernels/dispatch.py's decorator, the reference taken for numpy arrays too while `_references[0]` is set."""
    def decorate(cpu_path):
        dispatched, module = _original(reference, on, gpu)(cpu_path), sys.modules[cpu_path.__module__]

        @functools.wraps(cpu_path)
        def kernel(*args, **kwargs):
            return getattr(module, reference)(*args, **kwargs) if _references[0] else dispatched(*args, **kwargs)
        return kernel
    return decorate


_original, dispatch.numpy_or_reference = dispatch.numpy_or_reference, _numpy_or_reference
sys.modules.setdefault("cupyx", types.SimpleNamespace(scatter_add=np.add.at))  # the embeddings' scatter-add


def train_both(out: str, config: str) -> int:
    """Train `config` on the kernels, then on the references, into OUT/NAME-numba and OUT/NAME-reference; the
    exit status of the first that failed, else 0 (the next config trains either way)."""
    from mpitrain import cli  # after the patch: the kernel modules are decorated by it
    name = os.path.splitext(os.path.basename(config))[0]
    for path in ("numba", "reference"):
        _references[0] = path == "reference"
        status = cli.main(["train", config, "--set", f"run_dir={os.path.join(out, f'{name}-{path}')}",
                           "--set", "resume=never"])
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(max([train_both(sys.argv[1], config) for config in sys.argv[2:]]))
