"""Index blocks of threshold messages and reduced blocks (kernels/threshold/blocks.py), against whole-message decodes."""
import numpy as np
import pytest

from mpitrain.kernels.threshold import message, message_count, reference, threshold_encode
from mpitrain.kernels.threshold.blocks import add_block, block_bounds, cut_message, encode_block, reduce_parts


def residual(n, fraction, seed=0, dtype=np.float32):
    """n elements, about `fraction` of them beyond +-1 (either sign), the rest inside."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(-0.9, 0.9, n)
    sent = rng.random(n) < fraction
    values[sent] = rng.choice([-1.5, 1.2, 2.5], size=int(sent.sum()))
    return values.astype(dtype)


def parts_of(parts, sizes):
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [parts[a:b] for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 1001, 4099])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7, 64])
def test_blocks_are_contiguous_near_equal_and_cut_on_bitmap_words(n, ranks):
    bounds = block_bounds(n, ranks)
    lengths = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == ranks + 1 and (lengths >= 0).all()
    assert (bounds[:-1] % 16 == 0).all()  # every block but the last starts and ends on a bitmap word
    assert ranks == 1 or np.ptp(lengths[:-1]) <= 16  # at most one word apart
    assert lengths[-1] <= lengths.max()
    if -(-n // 16) < ranks:
        assert (lengths == 0).any()  # fewer words than ranks: some blocks are empty


@pytest.mark.parametrize("encoding", ["sparse", "bitmap"])
@pytest.mark.parametrize("n, ranks", [(1, 1), (17, 4), (1000, 3), (1001, 4), (4099, 7), (40, 4)])
@pytest.mark.parametrize("fraction", [0.0, 0.05, 1.0])
def test_each_part_decodes_to_its_block_of_the_whole_message(encoding, n, ranks, fraction):
    sent = threshold_encode(residual(n, fraction, seed=n + ranks), 1.0, encoding)
    whole = np.zeros(n, np.float32)
    message.decode(reference, sent, whole, 0.25)
    bounds = block_bounds(n, ranks)
    parts, sizes = cut_message(sent, bounds)
    assert parts.dtype == np.int32 and parts.size == sizes.sum() and len(sizes) == ranks
    counts = []
    for part, lo, hi in zip(parts_of(parts, sizes), bounds[:-1], bounds[1:]):
        count, length, tau, kind = message.read_header(reference, part)
        assert length == hi - lo and tau == 1.0 and kind == message.ENCODINGS[encoding]
        block = np.zeros(hi - lo, np.float32)
        message.decode(reference, part, block, 0.25)  # the reference checks the indices and body length
        assert np.array_equal(block, whole[lo:hi])
        counts.append(count)
    assert sum(counts) == message_count(sent)


def test_cutting_needs_blocks_of_the_message_s_length():
    sent = threshold_encode(residual(100, 0.1), 1.0)
    with pytest.raises(ValueError, match="blocks end at 96, but the message is for 100 elements"):
        cut_message(sent, np.array([0, 48, 96]))


@pytest.mark.parametrize("encoding", ["sparse", "bitmap", "auto"])
def test_a_block_reduced_from_every_rank_s_part_equals_the_whole_messages_summed(encoding):
    """The owner of block j sums the ranks' parts in rank order: the same adds, in the same order, as decoding
    the whole messages in rank order, so bit for bit the same block."""
    n, ranks = 1001, 4
    messages = [threshold_encode(residual(n, fraction, seed=rank), 1.0, encoding)
                for rank, fraction in enumerate([0.01, 0.3, 1.0, 0.0])]
    whole = np.zeros(n, np.float32)
    for sent in messages:
        message.decode(reference, sent, whole, 1 / ranks)
    bounds = block_bounds(n, ranks)
    cut = [parts_of(*cut_message(sent, bounds)) for sent in messages]
    for j, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        block = np.zeros(hi - lo, np.float32)
        sent = reduce_parts([parts[j] for parts in cut], block, 1 / ranks)
        assert np.array_equal(block, whole[lo:hi])
        assert sent == sum(int(np.count_nonzero(np.abs(residual(n, f, seed=r)[lo:hi]) >= 1.0))
                           for r, f in enumerate([0.01, 0.3, 1.0, 0.0]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nonzero", [0, 1, 7, 300, 333, 334, 1000])
def test_reduced_blocks_are_sparse_or_dense_whichever_is_smaller_and_add_back_exactly(dtype, nonzero):
    n, words = 1000, np.dtype(dtype).itemsize // 4
    block = np.zeros(n, dtype)
    where = np.random.default_rng(nonzero).choice(n, nonzero, replace=False)
    block[where] = np.random.default_rng(1).normal(size=nonzero)
    reduced = encode_block(block, 77)
    sparse = nonzero * (words + 1) < n * words
    expected = 4 + (nonzero * (words + 1) if sparse else n * words)
    assert reduced.dtype == np.int32 and reduced[0] == (0 if sparse else 1) and reduced[3] == 77
    assert reduced.size == expected + expected % words  # padded to whole values: aligned when concatenated
    assert reduced.size <= 4 + min(nonzero * (words + 1), n * words) + 1
    out = np.arange(n, dtype=dtype)
    assert add_block(reduced, out) == 77
    assert np.array_equal(out, np.arange(n, dtype=dtype) + block)


def test_reduced_blocks_of_float64_stay_aligned_back_to_back():
    blocks = [np.zeros(n) for n in (5, 16, 0, 33)]
    for i, block in enumerate(blocks):
        block[::3] = i + 0.5
    reduced = [encode_block(block, 1) for block in blocks]
    joined = np.concatenate(reduced)
    start = 0
    for block, part in zip(blocks, reduced):
        assert start % 2 == 0  # int32 offset of each block: its float64 values start 8-byte aligned
        out = np.zeros(block.size)
        add_block(joined[start:start + part.size], out)
        assert np.array_equal(out, block)
        start += part.size


@pytest.mark.parametrize("damage, text", [
    (lambda m: m[:3], "corrupt reduced block of 3 int32"),
    (lambda m: m[:-1], "corrupt reduced block"),
    (lambda m: np.r_[[7], m[1:]].astype(np.int32), r"header \[7,"),
    (lambda m: np.r_[m[:2], [99], m[3:]].astype(np.int32), r"for 10 float32 elements"),
])
def test_a_corrupt_reduced_block_is_refused(damage, text):
    block = np.zeros(10, np.float32)
    block[3] = 1
    with pytest.raises(ValueError, match=text):
        add_block(damage(encode_block(block, 1)), np.zeros(10, np.float32))
