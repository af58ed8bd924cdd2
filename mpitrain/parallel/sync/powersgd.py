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

Bytes per step: r (n + m) per matrix instead of n m, in float32. The first Q of every matrix is the same
seeded normal matrix on every rank. Q and the error are the mode's checkpoint state (`powersgd_q`, and each
rank's own `powersgd_error`), so a resume on as many ranks continues bit for bit.
"""
from __future__ import annotations

import math

import numpy as np

from mpitrain.base.arrays import array_module


class PowerSGD:
    """The matrices and vectors of a model's dense part (`layout`, the model's layout of it) and their state."""

    def __init__(self, layout: list, rank: int, xp, dtype=np.float32, seed: int = 0):
        self.rank = rank
        self.matrices, self.vectors = [], []  # (start, stop, (n, m)) of the dense buffer; (start, stop)
        start = 0
        for _, shape in layout:
            size = math.prod(shape)
            n, m = (math.prod(shape[:-1]), shape[-1]) if len(shape) >= 2 else (size, 1)
            if len(shape) >= 2 and rank * (n + m) < n * m:
                self.matrices.append((start, start + size, (n, m)))
            else:
                self.vectors.append((start, start + size))
            start += size
        rng = np.random.default_rng(seed)
        self.q = xp.asarray(np.concatenate([rng.normal(size=m * rank) for *_, (n, m) in self.matrices] or
                                           [np.zeros(0)]).astype(dtype))
        self.error = xp.zeros(sum(stop - start for start, stop, _ in self.matrices), dtype)

    def mean_(self, comm, grads) -> None:
        """Replace the dense gradient buffer `grads` by the ranks' approximate mean (see the module docstring); every
        rank ends with the same values. A collective: two Allreduces."""
        xp = array_module(grads)
        matrices, errors, qs = [], self._views(self.error), self._q_views()
        for (start, stop, (n, m)), error in zip(self.matrices, errors):
            matrix = grads[start:stop].reshape(n, m)
            matrix += error.reshape(n, m)  # M': the gradient and the error left over
            matrices.append(matrix)
        ps = [matrix @ q for matrix, q in zip(matrices, qs)]
        first = xp.concatenate([*(p.ravel() for p in ps), *(grads[a:b] for a, b in self.vectors)] or
                               [xp.zeros(0, grads.dtype)])
        comm.average_(first)
        offset = 0
        for p in ps:
            p[...] = first[offset:offset + p.size].reshape(p.shape)
            offset += p.size
        for a, b in self.vectors:
            grads[a:b] = first[offset:offset + b - a]
            offset += b - a
        ps = [xp.linalg.qr(p)[0] for p in ps]  # orthonormal columns (reduced QR), the same on every rank
        for matrix, p, q in zip(matrices, ps, qs):
            q[...] = matrix.T @ p
        comm.average_(self.q)
        for matrix, p, q, error in zip(matrices, ps, qs, errors):
            approximation = p @ q.T
            error[...] = (matrix - approximation).ravel()
            matrix[...] = approximation

    def _views(self, flat) -> list:
        """Per matrix, its part of a flat buffer of the matrices' sizes back to back."""
        views, offset = [], 0
        for start, stop, _ in self.matrices:
            views.append(flat[offset:offset + stop - start])
            offset += stop - start
        return views

    def _q_views(self) -> list:
        """Per matrix (n x m), its Q (m x rank) in the flat `q`."""
        views, offset = [], 0
        for *_, (n, m) in self.matrices:
            views.append(self.q[offset:offset + m * self.rank].reshape(m, self.rank))
            offset += m * self.rank
        return views

    def bytes_per_step(self, itemsize: int = 4) -> int:
        """The values both Allreduces carry per step, in bytes (what a dense Allreduce of the buffer would carry:
        its size)."""
        return itemsize * (self.q.size + sum(n * self.rank for *_, (n, m) in self.matrices)
                           + sum(b - a for a, b in self.vectors))
