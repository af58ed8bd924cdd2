"""A model's workspace: every array a training or evaluation step writes, allocated once and reused.

    ws = model.workspace.part("03_dense")          # what a layer gets (`Layer.ws`)
    y = ws("y", (len(x), units), x.dtype)          # the same array every step of this batch shape

A step's forward outputs, saved activations and masks, backward outputs, the loss's
gradient and the batch pipeline's buffers are all arrays of the workspace, written with
`out=`, in-place ufuncs and kernels that take their output. An array is made the first
time its (owner, name, shape, dtype) is asked for and handed out again after that, so a
step allocates nothing once the first steps of a batch shape have run: what a CUDA graph
capture needs, and no page-faulting allocation or extra pass over memory on the CPU.

The shape is part of the key, so training batches, evaluation batches and the last short
evaluation batch keep arrays of their own instead of reallocating each other's at every
switch; the arrays live as long as the model (`nbytes`, `table()` show them all). A caller
must not keep an array from one step to the next: the next step of that shape overwrites it.
"""
from __future__ import annotations

import numpy as np


class Workspace:
    """The arrays of one model, keyed by (owner, name, shape, dtype), on array module `xp`. Not a collective."""

    def __init__(self, xp):
        self.xp = xp
        self.arrays: dict[tuple, object] = {}

    def part(self, owner: str) -> WorkspacePart:
        """The view a layer (or the loss, the batches) gets: arrays named within `owner`."""
        return WorkspacePart(self, owner)

    def array(self, owner: str, name: str, shape: tuple, dtype, host: bool = False):
        """The array `name` of `owner` of this shape (a tuple of ints) and dtype: made (uninitialized) on first
        use, then reused. `host`: a numpy array whatever the model's array module (the batch pipeline's host side)."""
        key = (owner, name, shape, np.dtype(dtype), host)
        array = self.arrays.get(key)
        if array is None:
            array = self.arrays[key] = (np if host else self.xp).empty(key[2], dtype=key[3])
        return array

    def at_least(self, owner: str, name: str, size: int, dtype, host: bool = False):
        """The first `size` elements of the 1-D array `name` of `owner`, which grows (to twice its size at
        least, so rarely) when `size` outgrows it: buffers whose length varies from step to step (`sharing`'s
        messages, a batch of sequences). Make it once at its usual largest size and a step allocates nothing. `host`: a
        numpy array whatever the model's array module."""
        key = (owner, name, None, np.dtype(dtype), host)
        array = self.arrays.get(key)
        if array is None or array.size < size:
            array = self.arrays[key] = (np if host else self.xp).empty(max(size, 2 * array.size if array is not None else 0),
                                                     dtype=key[3])
        return array[:size]

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.arrays.values())

    def table(self) -> list[tuple[str, str, tuple, str, int]]:
        """(owner, name, shape, dtype, bytes) of every array, in the order they were made."""
        return [(owner, name + (" (host)" if host else ""), array.shape, dtype.name, array.nbytes)
                for (owner, name, _, dtype, host), array in self.arrays.items()]


class WorkspacePart:
    """`part(name, shape, dtype)`: the workspace array `name` of one owner (see `Workspace.array`)."""

    def __init__(self, workspace: Workspace, owner: str):
        self.workspace, self.owner = workspace, owner

    def __call__(self, name: str, shape, dtype, host: bool = False):
        return self.workspace.array(self.owner, name, shape, dtype, host)

    def at_least(self, name: str, size: int, dtype, host: bool = False):
        return self.workspace.at_least(self.owner, name, size, dtype, host)

    def part(self, name: str) -> WorkspacePart:
        """The part of owner `OWNER/name`: a layer made of layers gives each its own."""
        return WorkspacePart(self.workspace, f"{self.owner}/{name}")
