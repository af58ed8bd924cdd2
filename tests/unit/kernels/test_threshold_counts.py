"""Threshold messages as integer counts and the count blocks of the recursive exchange (kernels/threshold/counts.py),
against the reference decode."""
import numpy as np
import pytest

from mpitrain.kernels.threshold import message, reference, threshold_encode
from mpitrain.kernels.threshold.counts import (
    add_counts,
    add_message,
    add_scaled,
    count_dtype,
    counts_capacity,
    encode_counts,
)

TAU = np.float32(0.5)


def residual(n, fraction, seed=0):
    """n float32 elements, about `fraction` of them beyond +-tau (either sign), the rest inside."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(-0.4, 0.4, n)
    sent = rng.random(n) < fraction
    values[sent] = rng.choice([-0.75, 0.6, 1.25], size=int(sent.sum()))
    return values.astype(np.float32)


def test_counts_are_the_narrowest_integers_that_hold_every_rank_s_sign():
    assert [count_dtype(ranks) for ranks in (1, 127, 128, 32767, 32768, 2**31 - 1)] == [
        np.int8, np.int8, np.int16, np.int16, np.int32, np.int32]
    with pytest.raises(ValueError, match="no count dtype for 2147483648 ranks"):
        count_dtype(2**31)


@pytest.mark.parametrize("encoding", ["sparse", "bitmap"])
@pytest.mark.parametrize("n", [1, 17, 1001])
@pytest.mark.parametrize("fraction", [0.0, 0.05, 1.0])
def test_a_message_s_counts_are_its_decode_divided_by_tau(encoding, n, fraction):
    sent = threshold_encode(residual(n, fraction, seed=n), TAU, encoding)
    decoded = np.zeros(n, np.float32)
    message.decode(reference, sent, decoded, 1.0)
    counts = np.full(n, 3, np.int8)  # added to what is there
    assert add_message(sent, counts) == message.read_header(reference, sent)[0]
    assert np.array_equal(counts - 3, decoded / TAU)


def test_a_message_for_other_elements_or_with_indices_outside_them_is_refused():
    sent = threshold_encode(residual(100, 0.1), TAU, "sparse")
    with pytest.raises(ValueError, match="is for 100 elements, but the counts have 99"):
        add_message(sent, np.zeros(99, np.int8))
    corrupt = sent.copy()
    corrupt[-1] = 101
    with pytest.raises(ValueError, match="indices outside 1..100"):
        add_message(corrupt, np.zeros(100, np.int8))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32])
@pytest.mark.parametrize("nonzero", [0, 1, 7, 199, 200, 201, 333, 1000])
def test_count_blocks_are_sparse_or_dense_whichever_is_shorter_and_add_back_exactly(dtype, nonzero):
    n, width = 1000, np.dtype(dtype).itemsize
    counts = np.zeros(n, dtype)
    counts[np.random.default_rng(nonzero).choice(n, nonzero, replace=False)] = np.random.default_rng(1).choice(
        [-100, -1, 1, 2, 120], size=nonzero)
    block = encode_counts(counts, 2**40 + 5, TAU)
    sparse_words, dense_words = nonzero + -(-nonzero * width // 4), -(-n * width // 4)
    assert block.dtype == np.int32 and block[0] == (0 if sparse_words < dense_words else 1)
    assert block.size == 6 + min(sparse_words, dense_words) <= counts_capacity(n, dtype)
    out = np.arange(n).astype(dtype)
    assert add_counts(block, out, TAU) == 2**40 + 5  # sent is an int64
    assert np.array_equal(out, np.arange(n).astype(dtype) + counts)


def test_an_empty_range_is_a_header_alone():
    block = encode_counts(np.zeros(0, np.int8), 3, TAU)
    assert block.size == 6 and add_counts(block, np.zeros(0, np.int8), TAU) == 3


@pytest.mark.parametrize("damage, text", [
    (lambda b: b[:5], "at least 6 int32 header values, got 5"),
    (lambda b: b[:-1], "corrupt count block"),
    (lambda b: np.r_[[7], b[1:]].astype(np.int32), r"header \[7,"),
    (lambda b: np.r_[b[:2], [99], b[3:]].astype(np.int32), "for 10 int8 counts"),
])
def test_a_corrupt_count_block_is_refused(damage, text):
    counts = np.zeros(10, np.int8)
    counts[3] = 2
    with pytest.raises(ValueError, match=text):
        add_counts(damage(encode_counts(counts, 1, TAU)), np.zeros(10, np.int8), TAU)


def test_a_count_block_of_another_tau_is_refused():
    block = encode_counts(np.ones(10, np.int8), 10, TAU)
    with pytest.raises(ValueError, match="summed with tau 0.5, this rank's with 0.25: every rank's message must"):
        add_counts(block, np.zeros(10, np.int8), 0.25)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scaled_counts_add_what_decoding_each_message_adds(dtype):
    """One message: bit for bit a decode's +-tau/N; several: the same sum to float rounding (another order)."""
    n, ranks = 1001, 5
    messages = [threshold_encode(residual(n, 0.3, seed=rank), TAU) for rank in range(ranks)]
    start = np.random.default_rng(0).normal(size=n).astype(dtype)
    for chosen in (messages[:1], messages):
        decoded, scaled, counts = start.copy(), start.copy(), np.zeros(n, np.int8)
        for sent in chosen:
            message.decode(reference, sent, decoded, 1.0 / ranks)
            add_message(sent, counts)
        add_scaled(counts, scaled, 1.0 / ranks * float(TAU))
        assert np.array_equal(scaled, decoded) if len(chosen) == 1 else np.allclose(scaled, decoded, rtol=1e-6, atol=1e-6)
