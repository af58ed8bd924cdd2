"""How many images of a batch a convolution takes at once, so that its scratch arrays stay in a core's L2 cache.

    step = images_per_chunk(x, bytes_per_image)    # numpy: as many as fit SCRATCH_BYTES; cupy: the batch
    for start in range(0, len(x), step): ...

A conv layer's im2col windows are 25-100x its input (LeNet's second layer: 8 MB for a batch
of 64, 128 KB an image). Written whole, they leave the cache before the GEMM reads them,
and a second rank on the node evicts them again (two ranks' workspaces overflow a shared
L3). Taken a chunk of images at a time, im2col writes windows that the GEMM reads from L2,
and backward rebuilds them the same way instead of keeping the batch's.

The chunk's scratch gets half of the L2 cache of the core this process runs on (sysfs on
Linux): the other half holds what the GEMM reads beside it, OpenBLAS's packed block of the
weights and the chunk's input and output. Where sysfs says nothing, FALLBACK_L2_BYTES. Arrays
other than numpy's (cupy) take the whole batch at once: a GPU launches a kernel per chunk
and has no use for the host's caches.
"""
from __future__ import annotations

import glob
import os

from .dispatch import numpy_or_reference

FALLBACK_L2_BYTES = 1 << 20  # a server core's L2 where sysfs is missing: 1 MiB on AMD Zen 4, 1-2 MiB on Intel Xeons
L2_SHARE = 0.5  # of the L2 cache, for the chunk's scratch arrays; the rest for the GEMM's other operands


def l2_cache_bytes(cpu_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The size of the first CPU's level-2 data or unified cache in bytes, from sysfs; FALLBACK_L2_BYTES without."""
    for index in sorted(glob.glob(os.path.join(cpu_dir, "index*"))):
        try:
            with open(os.path.join(index, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(index, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(index, "size")) as f:
                size = f.read().strip()
        except OSError:
            continue
        if level == "2" and kind in ("Data", "Unified"):
            return _bytes(size)
    return FALLBACK_L2_BYTES


def _bytes(size: str) -> int:
    """sysfs' cache size ("1024K", "2M", "512") in bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)


SCRATCH_BYTES = int(L2_SHARE * l2_cache_bytes())


@numpy_or_reference("whole_batch")
def images_per_chunk(array, bytes_per_image: int) -> int:
    """The images of the numpy batch `array` to take at once when each needs `bytes_per_image` of scratch: as many
    as fit SCRATCH_BYTES, at least 1, at most the batch."""
    return max(1, min(len(array), SCRATCH_BYTES // bytes_per_image))


def whole_batch(array, bytes_per_image: int) -> int:
    """images_per_chunk of other arrays (cupy): the batch, in one chunk."""
    return max(len(array), 1)
