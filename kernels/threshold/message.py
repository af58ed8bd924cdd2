"""The threshold message format and the encode/decode steps all implementations share.

A message is an int32 array `[count, n, tau as float32 bits, encoding]` + body
(docs/architecture.md, "sharing"). Encoding 0 (sparse): `count` signed 1-based indices in
ascending order, +(i+1) for +tau at element i, -(i+1) for -tau. Encoding 1 (bitmap):
ceil(n/16) words, element i in word i//16 at bit i%16 (sent) and bit i%16+16 (sent negative);
the kernels see the bitmap body as uint32, the bit pattern the int32 message carries.

Validation, the encoding choice and the header live here once; an implementation (the numpy
`reference`, numba `cpu`, numba-CUDA `cuda`) only supplies these primitives:

    count(residual, tau) -> (sent, any NaN, plan)   read-only pass; plan feeds write_sparse
    write_sparse(residual, tau, plan, body)          subtract sign*tau, write ascending indices
    write_bitmap(residual, tau, words)               subtract sign*tau, write the uint32 words
    decode_sparse(body, out, delta) -> bad           add +-delta; count indices outside 1..n
    decode_bitmap(words, out, delta)                 add +-delta for each set bit
    clip(residual, limit)                            clip in place to [-limit, limit]
    empty(like, size) -> int32 array                 on the same device as `like`
    to_host(array) -> numpy array
    set_header(message, header)                      write the 4 header ints
"""
from __future__ import annotations

import numpy as np

HEADER_SIZE = 4
SPARSE, BITMAP = 0, 1
ENCODINGS = {"sparse": SPARSE, "bitmap": BITMAP}
BITS_PER_WORD = 16
# Largest n: every signed 1-based index, and n + 1, still fit in int32.
MAX_ELEMENTS = 2**31 - 2
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class NaNResidual(ValueError):
    """The residual to encode holds NaN: the training diverged (nothing was encoded)."""


def check_size(n: int) -> int:
    """Return `n`, or raise ValueError when n elements cannot be indexed by int32 messages."""
    if n > MAX_ELEMENTS:
        raise ValueError(f"threshold messages index at most {MAX_ELEMENTS} elements (int32), got {n}: "
                         "split the buffer into smaller ones")
    return n


def bitmap_words(n: int) -> int:
    """Body length of a bitmap message for n elements."""
    return -(-n // BITS_PER_WORD)


def choose_encoding(encoding: str, count: int, n: int) -> int:
    """`auto` sends a bitmap once the sparse body would reach its size (count >= n/16)."""
    if encoding == "auto":
        return BITMAP if count * BITS_PER_WORD >= n else SPARSE
    return ENCODINGS[encoding]


def positive(value, dtype, name: str):
    """`value` rounded to `dtype`; it must be finite and > 0 there."""
    with np.errstate(over="ignore", under="ignore"):
        rounded = np.dtype(dtype).type(value)
    if not (np.isfinite(rounded) and rounded > 0):
        raise ValueError(f"{name} must be finite and > 0 as {np.dtype(dtype)}, got {value!r}")
    return rounded


def check_vector(array, name: str) -> None:
    """Residuals and decode targets are flat float32/float64 buffers."""
    if array.ndim != 1 or array.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a 1-D float32 or float64 array, got {array.ndim}-D {array.dtype}")


def parse_header(header: np.ndarray, message_size: int) -> tuple[int, int, np.float32, int]:
    """(count, n, tau, encoding) of a message, after checking it is well formed."""
    if message_size < HEADER_SIZE:
        raise ValueError(f"a threshold message has at least {HEADER_SIZE} int32 header values, got {message_size}")
    count, n, tau_bits, encoding = (int(v) for v in header)
    tau = np.int32(tau_bits).view(np.float32)
    if encoding not in (SPARSE, BITMAP) or not 0 <= count <= n or not (np.isfinite(tau) and tau > 0):
        raise ValueError(f"corrupt threshold message header [count={count}, n={n}, tau={tau}, encoding={encoding}]")
    body = count if encoding == SPARSE else bitmap_words(n)
    if message_size != HEADER_SIZE + body:
        raise ValueError(f"threshold message has {message_size} values, its header says {HEADER_SIZE + body}")
    return count, n, tau, encoding


def capacity(n: int, encoding: str = "auto") -> int:
    """The longest message (int32 values) `encode` can write for n elements with `encoding`: auto turns to a
    bitmap before a sparse body would reach its length, so only `sparse` may send all n indices."""
    return HEADER_SIZE + (n if encoding == "sparse" else bitmap_words(n))


def encode(impl, residual, tau, encoding: str = "auto", out=None):
    """Send every |r_i| >= tau: subtract sign(r_i)*tau from the residual in place, return the message: the
    first values of `out` (int32, at least `capacity` long) when given, else a new array.

    NaN raises NaNResidual (a ValueError) before anything is changed.
    """
    check_vector(residual, "residual")
    n = check_size(residual.size)
    if encoding != "auto" and encoding not in ENCODINGS:
        raise ValueError(f"encoding must be auto, sparse or bitmap, got {encoding!r}")
    tau32 = positive(tau, np.float32, "tau")  # the message carries tau as a float32
    tau_r = residual.dtype.type(tau32)
    count, has_nan, plan = impl.count(residual, tau_r)
    if has_nan:
        nan = np.isnan(impl.to_host(residual))
        raise NaNResidual(f"residual holds {np.count_nonzero(nan)} NaN value(s), the first at index "
                          f"{np.argmax(nan)}; nothing was encoded")
    kind = choose_encoding(encoding, count, n)
    size = HEADER_SIZE + (count if kind == SPARSE else bitmap_words(n))
    if out is not None and out.size < size:
        raise ValueError(f"a message of {size} int32 values does not fit the {out.size} of `out`")
    message = impl.empty(residual, size) if out is None else out[:size]
    impl.set_header(message, np.array([count, n, tau32.view(np.int32), kind], dtype=np.int32))
    body = message[HEADER_SIZE:]
    if kind == BITMAP:
        impl.write_bitmap(residual, tau_r, body.view(np.uint32))
    elif count:  # with nothing sent, the residual stays as it is
        impl.write_sparse(residual, tau_r, plan, body)
    return message


def decode(impl, message, out, sign: float = 1.0) -> None:
    """Add sign*tau*(+1/-1) to `out` at every element the message sends.

    The step sign*tau is rounded once to out's dtype, so every implementation adds the same value.
    A sparse index outside 1..n raises ValueError (the other elements have been added by then).
    """
    check_vector(out, "out")
    _, n, tau, kind = read_header(impl, message)
    if n != out.size:
        raise ValueError(f"threshold message is for {n} elements, but out has {out.size}")
    if not np.isfinite(sign):
        raise ValueError(f"sign must be finite, got {sign!r}")
    delta = out.dtype.type(float(sign) * float(tau))
    body = message[HEADER_SIZE:]
    if kind == BITMAP:
        impl.decode_bitmap(body.view(np.uint32), out, delta)
        return
    bad = impl.decode_sparse(body, out, delta)
    if bad:
        raise ValueError(f"threshold message holds {bad} index(es) outside 1..{n}: corrupt message")


def read_header(impl, message) -> tuple[int, int, np.float32, int]:
    """(count, n, tau, encoding) of a message on any device."""
    if message.ndim != 1 or message.dtype != np.int32:
        raise ValueError(f"a threshold message is a 1-D int32 array, got {message.ndim}-D {message.dtype}")
    return parse_header(impl.to_host(message[:HEADER_SIZE]), message.size)


def clip(impl, residual, limit) -> None:
    """Clip the residual in place to [-limit, limit] (NaN stays NaN)."""
    check_vector(residual, "residual")
    impl.clip(residual, positive(limit, residual.dtype, "limit"))


def accumulate(impl, residual, update, limit=None) -> None:
    """residual += update, clipped to [-limit, limit] unless limit is None, in one pass (NaN stays NaN)."""
    check_vector(residual, "residual")
    if update.shape != residual.shape or update.dtype != residual.dtype:
        raise ValueError(f"update must match the residual ({residual.size} {residual.dtype}), "
                         f"got {update.size} {update.dtype}")
    bound = residual.dtype.type(np.inf) if limit is None else positive(limit, residual.dtype, "limit")
    impl.add_clipped(residual, update, bound)
