"""Plain numpy versions of the kernel primitives (see `message`): obviously correct, used by tests.

Use through the shared steps, e.g. `message.encode(reference, residual, tau)`.
"""
from __future__ import annotations

import numpy as np

from .message import BITS_PER_WORD

WORD_BITS = np.arange(BITS_PER_WORD, dtype=np.uint32)


def count(residual, tau):
    return int(np.count_nonzero(np.abs(residual) >= tau)), bool(np.isnan(residual).any()), None


def _send(residual, tau) -> tuple[np.ndarray, np.ndarray]:
    """Indices with |r_i| >= tau and their signs (+1/-1); subtracts sign*tau from those r_i."""
    index = np.flatnonzero(np.abs(residual) >= tau)
    sign = np.sign(residual[index])
    residual[index] -= sign * tau
    return index, sign


def write_sparse(residual, tau, plan, body) -> None:
    index, sign = _send(residual, tau)
    body[:] = np.where(sign < 0, -(index + 1), index + 1)


def write_bitmap(residual, tau, words) -> None:
    index, sign = _send(residual, tau)
    sent = np.zeros(words.size * BITS_PER_WORD, dtype=np.uint32)
    negative = np.zeros_like(sent)
    sent[index] = 1
    negative[index[sign < 0]] = 1
    words[:] = (sent.reshape(-1, BITS_PER_WORD) << WORD_BITS).sum(axis=1, dtype=np.uint32)
    words |= (negative.reshape(-1, BITS_PER_WORD) << (WORD_BITS + BITS_PER_WORD)).sum(axis=1, dtype=np.uint32)


def decode_sparse(body, out, delta) -> int:
    index = np.abs(body.astype(np.int64)) - 1
    valid = (index >= 0) & (index < out.size)
    out[index[valid & (body > 0)]] += delta
    out[index[valid & (body < 0)]] -= delta
    return int(np.count_nonzero(~valid))


def decode_bitmap(words, out, delta) -> None:
    bits = (words[:, None] >> np.arange(2 * BITS_PER_WORD, dtype=np.uint32)) & 1
    sent = bits[:, :BITS_PER_WORD].astype(bool).ravel()[:out.size]
    negative = bits[:, BITS_PER_WORD:].astype(bool).ravel()[:out.size]
    out[sent & ~negative] += delta
    out[sent & negative] -= delta


def clip(residual, limit) -> None:
    np.clip(residual, -limit, limit, out=residual)


def add_clipped(residual, update, limit) -> None:
    residual += update
    clip(residual, limit)


def empty(like, size: int) -> np.ndarray:
    return np.empty(size, dtype=np.int32)


def to_host(array) -> np.ndarray:
    return np.asarray(array)


def set_header(message, header) -> None:
    message[:header.size] = header
