"""Threshold kernels: the numba CPU versions against the numpy reference, element for element.

`kernels.*` on numpy arrays runs the numba CPU kernels; `message.*(reference, ...)` runs the
reference through the same shared steps. Floats are compared bit for bit (so -0.0 != 0.0).
`edge_cases` is shared with cuda_kernels_check.py, which holds the CUDA kernels to the same.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from mpitrain.kernels import threshold as kernels  # noqa: E402
from mpitrain.kernels.threshold import cpu, message, reference  # noqa: E402
from mpitrain.testing.threshold_cases import bits, edge_cases, residual_with_fraction  # noqa: E402

ENCODINGS = ("auto", "sparse", "bitmap")








def assert_matches_reference(residual, tau, encoding, sign=1.0) -> np.ndarray:
    """Encode and decode with the CPU kernels and the reference; everything must be bit-identical."""
    expected_residual, got_residual = residual.copy(), residual.copy()
    expected = message.encode(reference, expected_residual, tau, encoding)
    got = kernels.threshold_encode(got_residual, tau, encoding)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(bits(got_residual), bits(expected_residual))
    start = np.random.default_rng(3).standard_normal(residual.size).astype(residual.dtype)
    expected_out, got_out = start.copy(), start.copy()
    message.decode(reference, expected, expected_out, sign)
    kernels.threshold_decode(got, got_out, sign)
    np.testing.assert_array_equal(bits(got_out), bits(expected_out))
    return got


def test_example_messages_by_hand():
    tau_bits = int(np.float32(0.25).view(np.int32))
    after = np.array([0.5, 0.0, -0.0, 0.125, 0.25], dtype=np.float32)
    for impl_encode in (kernels.threshold_encode, lambda r, t, e: message.encode(reference, r, t, e)):
        residual = np.array([0.75, -0.25, -0.0, 0.125, 0.5], dtype=np.float32)
        assert impl_encode(residual.copy(), 0.25, "sparse").tolist() == [3, 5, tau_bits, 0, 1, -2, 5]
        # bits 0, 1, 4 sent; bit 1 + 16 because element 1 is negative
        assert impl_encode(residual, 0.25, "auto").tolist() == [3, 5, tau_bits, 1, 0b10_0000_0000_0001_0011]
        np.testing.assert_array_equal(bits(residual), bits(after))


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("case", edge_cases(), ids=lambda case: case[0])
def test_edge_cases_match_reference(case, encoding):
    _, residual, tau = case
    assert_matches_reference(residual, tau, encoding)


def test_minus_zero_and_exact_tau():
    residual = next(r for name, r, _ in edge_cases() if name.startswith("+-tau exactly"))
    sent = kernels.threshold_encode(residual.copy(), 0.25, "sparse")[message.HEADER_SIZE:]
    assert sent[:3].tolist() == [1, -2, 7]  # +tau and -tau sent, -0.0 and 0.0 and just-below not


def test_bit_31_is_the_sign_of_element_15():
    word = kernels.bitmap_encode(np.r_[np.zeros(15), -1.0].astype(np.float32), 0.5)[message.HEADER_SIZE]
    assert word == np.uint32((1 << 15) | (1 << 31)).view(np.int32)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fraction", [0, 1e-3, 0.05, 1])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 4099])
def test_random_residuals_match_reference(n, fraction, encoding):
    residual, tau = residual_with_fraction(n, fraction, seed=n)
    assert_matches_reference(residual, tau, encoding, sign=1 / 3)


@pytest.mark.parametrize("fraction", [1e-3, 0.01, 0.2])
def test_many_chunks_match_reference(fraction):
    n = 300_001
    assert n > 4 * cpu.CHUNK
    residual, tau = residual_with_fraction(n, fraction)
    assert_matches_reference(residual, tau, "auto", sign=-0.5)


def test_uneven_chunks_match_reference():
    """One dense chunk between empty ones: each chunk's offset comes from the prefix sum."""
    residual = np.zeros(5 * cpu.CHUNK + 7, dtype=np.float32)
    residual[2 * cpu.CHUNK + 3:3 * cpu.CHUNK:5] = -1.0
    residual[-1] = 2.0
    got = assert_matches_reference(residual, 0.5, "sparse")
    body = got[message.HEADER_SIZE:]
    assert body[0] == -(2 * cpu.CHUNK + 4) and body[-1] == residual.size and np.all(np.diff(np.abs(body)) > 0)


@pytest.mark.parametrize("n", [160, 161])
def test_auto_chooses_bitmap_from_n_over_16(n):
    for count in (9, 10, 11):
        residual = np.zeros(n, dtype=np.float32)
        residual[::7][:count] = 1.0
        encoded = assert_matches_reference(residual, 0.5, "auto")
        expected = "bitmap" if count * 16 >= n else "sparse"
        assert kernels.message_encoding(encoded) == expected and kernels.message_count(encoded) == count


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("n", [100, 3 * cpu.CHUNK])
def test_nan_raises_and_changes_nothing(n, encoding):
    residual, tau = residual_with_fraction(n, 0.5)
    residual[[n - 7, n - 3]] = np.nan
    for encode in (kernels.threshold_encode, lambda r, t, e: message.encode(reference, r, t, e)):
        before = residual.copy()
        with pytest.raises(ValueError, match=f"2 NaN value.*index {n - 7}"):
            encode(residual, tau, encoding)
        np.testing.assert_array_equal(bits(residual), bits(before))


def test_size_limit_is_checked_without_allocating():
    assert kernels.check_size(kernels.MAX_ELEMENTS) == 2**31 - 2
    with pytest.raises(ValueError, match="int32"):
        kernels.check_size(kernels.MAX_ELEMENTS + 1)
    huge = np.broadcast_to(np.float32(0), (2**31,))  # 8 GB in name, one float in memory
    with pytest.raises(ValueError, match="int32"):
        kernels.threshold_encode(huge, 0.5)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fraction", [0.01, 0.3])
def test_round_trip_restores_the_residual(fraction, encoding):
    """decode(encode(r)) + residual after == r: exactly for a power-of-two tau."""
    before, _ = residual_with_fraction(5000, fraction)
    for tau, exact in ((2.0**-2, True), (float(np.quantile(np.abs(before), 1 - fraction)), False)):
        residual, sent = before.copy(), np.zeros_like(before)
        kernels.threshold_decode(kernels.threshold_encode(residual, tau, encoding), sent)
        if exact:
            np.testing.assert_array_equal(sent + residual, before)
        else:
            np.testing.assert_allclose(sent + residual, before, rtol=1e-6, atol=1e-7)


def test_bitmap_wrappers_and_message_helpers():
    residual, tau = residual_with_fraction(100, 0.01)
    encoded = kernels.bitmap_encode(residual.copy(), tau)
    assert kernels.message_encoding(encoded) == "bitmap" and encoded.size == message.HEADER_SIZE + 7
    assert kernels.message_count(encoded) == 1
    out = np.zeros(100, dtype=np.float32)
    kernels.bitmap_decode(encoded, out, sign=2.0)
    assert np.count_nonzero(out) == 1 and np.abs(out).max() == np.float32(2 * np.float32(tau))
    with pytest.raises(ValueError, match="sparse message"):
        kernels.bitmap_decode(kernels.threshold_encode(residual.copy(), tau, "sparse"), out)


def test_clip_matches_reference():
    residual = np.r_[np.random.default_rng(0).standard_normal(3000) * 3,
                     [np.inf, -np.inf, np.nan, -0.0, 1.5, -1.5]].astype(np.float32)
    expected, got = residual.copy(), residual.copy()
    message.clip(reference, expected, 1.5)
    kernels.clip_residual(got, 1.5)
    np.testing.assert_array_equal(bits(got), bits(expected))
    assert np.nanmax(np.abs(got)) == 1.5
    with pytest.raises(ValueError, match="limit"):
        kernels.clip_residual(got, 0.0)


@pytest.mark.parametrize("limit", [1.5, None])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_to_residual_matches_reference(limit, dtype):
    rng = np.random.default_rng(1)
    residual = np.r_[rng.standard_normal(3000) * 3, [np.inf, -np.inf, np.nan, -0.0, 1.5, -1.5, 1.0]].astype(dtype)
    update = np.r_[rng.standard_normal(3000), [1.0, 1.0, 0.0, -0.0, 0.25, -0.25, np.nan]].astype(dtype)
    expected, got = residual.copy(), residual.copy()
    message.accumulate(reference, expected, update, limit)
    kernels.add_to_residual(got, update, limit)
    np.testing.assert_array_equal(bits(got), bits(expected))
    assert np.isnan(got[-5]) and np.isnan(got[-1]), "NaN must survive, so encode reports it"
    if limit is None:
        np.testing.assert_array_equal(got[:3000], (residual + update)[:3000])
    else:
        assert np.nanmax(np.abs(got)) == 1.5 and got[-3] == 1.5 and got[-2] == -1.5
    with pytest.raises(ValueError, match="update must match the residual"):
        kernels.add_to_residual(got, update[:10])
    with pytest.raises(ValueError, match="limit"):
        kernels.add_to_residual(got, update, 0.0)


@pytest.mark.parametrize("tau", [0.0, -1.0, np.nan, np.inf, 1e-50, 1e39])
def test_bad_tau_raises(tau):
    with pytest.raises(ValueError, match="tau must be finite and > 0"):
        kernels.threshold_encode(np.ones(4, dtype=np.float32), tau)


def test_bad_arguments_raise():
    ones = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match="encoding must be"):
        kernels.threshold_encode(ones.copy(), 0.5, "dense")
    with pytest.raises(ValueError, match="1-D float32 or float64"):
        kernels.threshold_encode(np.ones((2, 2), dtype=np.float32), 0.5)
    with pytest.raises(ValueError, match="1-D float32 or float64"):
        kernels.threshold_encode(np.ones(4, dtype=np.int32), 0.5)
    with pytest.raises(TypeError, match="numpy or CUDA array"):
        kernels.threshold_encode([1.0, 2.0], 0.5)


def test_bad_messages_raise():
    encoded = kernels.threshold_encode(np.array([1.0, 0.0, -1.0, 0.0, 0.0], dtype=np.float32), 0.5, "sparse")
    out = np.zeros(5, dtype=np.float32)
    with pytest.raises(ValueError, match="for 5 elements, but out has 6"):
        kernels.threshold_decode(encoded, np.zeros(6, dtype=np.float32))
    with pytest.raises(ValueError, match="header says 6"):
        kernels.threshold_decode(encoded[:-1], out)
    with pytest.raises(ValueError, match="1-D int32"):
        kernels.threshold_decode(encoded.astype(np.int64), out)
    with pytest.raises(ValueError, match="corrupt threshold message header"):
        kernels.threshold_decode(np.array([1, 5, 0, 0, 1], dtype=np.int32), out)  # tau 0
    for index in (0, 6, -6, np.iinfo(np.int32).min):
        corrupt = encoded.copy()
        corrupt[-1] = index
        for decode in (kernels.threshold_decode, lambda m, o: message.decode(reference, m, o)):
            with pytest.raises(ValueError, match="1 index.*outside 1..5"):
                decode(corrupt, out.copy())
