"""`sync.compression: powersgd`: each gradient matrix as its rank-r factors, with error feedback and warm start
(Vogels, Karimireddy and Jaggi, "PowerSGD", NeurIPS 2019; PyTorch DDP's `powerSGD_hook`).

    power = PowerSGD(model.layout, dense_start, rank=1, xp=np)
    power.mean_(comm, model.grads[dense_start:])        # the ranks' approximate mean gradient, the same everywhere

Per step, each layer's weight gradient M (n x m: a dense layer's W, a conv kernel as (its inputs, its outputs)) plus
the error this rank left over the step before, M', goes as two small matrices: P = M'Q is averaged over the ranks
(one Allreduce for every layer's P and every vector, which go whole), orthonormalized (QR), then Q = M'^T P is
averaged (a second Allreduce) and kept for the next step (the warm start); the step's gradient is P Q^T, the same
on every rank, and M' - P Q^T is this rank's error, added to the next step's M. Nothing is lost: over any steps,
the gradients applied plus the ranks' mean error equal the mean of the true gradients (the unit test holds it to
that). A matrix whose factors are no smaller than itself (r (n + m) >= n m) goes whole with the vectors.

With `overlap`, `allreduce` posts each bucket's first Allreduce as backward finishes it (`post`), and `finish`
does the rest after backward. Bytes per step: r (n + m) per matrix instead of n m, in float32. The first Q of every matrix is the same
seeded normal matrix on every rank. Q and the error are the mode's checkpoint state (`powersgd_q`, and each
rank's own `powersgd_error`), so a resume on as many ranks continues bit for bit.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.nn.flat import flat_views


def factored(layout: list, rank: int) -> tuple[list, list]:
    """The dense part of `layout` (a model's, `[(name, shape)]`) as PowerSGD sends it: (matrices, vectors), each
    matrix (start, stop, (n, m)) whose rank-`rank` factors are smaller than itself, each other entry (start, stop)."""
    matrices, vectors, start = [], [], 0
    for _, shape in layout:
        size = math.prod(shape)
        n, m = (math.prod(shape[:-1]), shape[-1]) if len(shape) >= 2 else (size, 1)
        if len(shape) >= 2 and rank * (n + m) < n * m:
            matrices.append((start, start + size, (n, m)))
        else:
            vectors.append((start, start + size))
        start += size
    return matrices, vectors


def allreduce_bytes(layout: list, rank: int, itemsize: int = 4) -> tuple[int, int]:
    """The bytes of a step's two Allreduces for a model's dense `layout`: every P and vector, then every Q (a dense
    Allreduce of the buffer would carry its size)."""
    matrices, vectors = factored(layout, rank)
    return (itemsize * (sum(n * rank for *_, (n, m) in matrices) + sum(b - a for a, b in vectors)),
            itemsize * sum(m * rank for *_, (n, m) in matrices))


class PowerSGD:
    """The matrices and vectors of a model's dense part (`layout`, the model's layout of it) and their state."""

    def __init__(self, layout: list, rank: int, xp, dtype=np.float32, seed: int = 0):
        self.rank = rank
        self.matrices, self.vectors = factored(layout, rank)  # of the dense buffer
        rng = np.random.default_rng(seed)
        self.q = xp.asarray(np.concatenate([rng.normal(size=m * rank) for *_, (n, m) in self.matrices] or
                                           [np.zeros(0)]).astype(dtype))
        self.error = xp.zeros(sum(stop - start for start, stop, _ in self.matrices), dtype)
        # per matrix, its Q (m x rank) and this rank's error (n x m): views of the two flat buffers, which a resume
        # fills in place
        self.qs = flat_views(self.q, [(k, (m, rank)) for k, (*_, (n, m)) in enumerate(self.matrices)])
        self.errors = flat_views(self.error, [(k, shape) for k, (*_, shape) in enumerate(self.matrices)])
        self.pending = []  # per posted range: its matrices, its vectors, its message (P's and vectors)

    def mean_(self, comm, grads) -> None:
        """Replace the dense gradient buffer `grads` by the ranks' approximate mean (see the module docstring); every
        rank ends with the same values. A collective: two Allreduces."""
        comm.complete([self.post(comm, grads, 0, grads.size)])
        self.finish(comm, grads)

    def post(self, comm, grads, begin: int, end: int):
        """Post the first Allreduce of `grads[begin:end]` (whole layers: a bucket of them), its matrices' P = M'Q and
        its vectors, without waiting; returns the communicator's `Posted`. A collective: every rank posts the same
        ranges in the same order, covering the buffer, before `finish`."""
        xp = array_module(grads)
        inside = [k for k, (start, _, _) in enumerate(self.matrices) if begin <= start < end]
        ps = []
        for k in inside:
            matrix = self._matrix(grads, k)
            matrix += self.errors[k]  # M': the gradient and the error left over
            ps.append((matrix @ self.qs[k]).ravel())
        vectors = [(a, b) for a, b in self.vectors if begin <= a < end]
        message = xp.concatenate([*ps, *(grads[a:b] for a, b in vectors)] or [xp.zeros(0, grads.dtype)])
        self.pending.append((inside, vectors, message))
        return comm.iallreduce_(message)

    def finish(self, comm, grads) -> None:
        """After the posted Allreduces completed (`Communicator.complete`): the vectors' means into `grads`, each P
        orthonormalized, Q = M'^T P averaged (the second Allreduce), and each matrix's P Q^T into `grads`, M' - P Q^T
        into this rank's error. A collective."""
        xp, ps = array_module(grads), {}
        for inside, vectors, message in self.pending:  # summed over the ranks
            message /= comm.size
            offset = 0
            for k in inside:
                n = self.matrices[k][2][0]
                ps[k] = xp.linalg.qr(message[offset:offset + n * self.rank].reshape(n, self.rank))[0]  # orthonormal
                offset += n * self.rank
            for a, b in vectors:
                grads[a:b] = message[offset:offset + b - a]
                offset += b - a
        self.pending = []
        for k, p in ps.items():
            self.qs[k][...] = self._matrix(grads, k).T @ p
        comm.average_(self.q)
        for k, p in ps.items():
            matrix = self._matrix(grads, k)
            approximation = p @ self.qs[k].T
            self.errors[k][...] = matrix - approximation
            matrix[...] = approximation

    def _matrix(self, grads, k: int):
        """Matrix k (n x m) of the buffer `grads`."""
        start, stop, shape = self.matrices[k]
        return grads[start:stop].reshape(shape)

