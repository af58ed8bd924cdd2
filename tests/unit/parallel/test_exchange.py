"""sharing's recursive exchange (mpitrain/parallel/sync/exchange.py) on many rank counts, each rank a thread and its
pairwise messages queues: every rank ends with the exact mean of the messages and the same bits, in 2 log2 P'
messages. Across real ranks: tests/mpi/ranks/exchange_checks.py."""
import queue
import threading

import numpy as np
import pytest

from mpitrain.kernels.threshold import message_count, threshold_decode, threshold_encode
from mpitrain.parallel.costmodel import allreduce_bytes, split_header_bytes
from mpitrain.parallel.sync.codec import ThresholdCodec
from mpitrain.parallel.sync.exchange import allgather, recursive

TAU = 0.5


class Threads:
    """Rank `rank` of `size` ranks run as threads: `sendrecv` through one queue per ordered pair of ranks, the
    messages sent and bytes counted."""

    def __init__(self, rank: int, size: int, boxes: dict):
        self.rank, self.size, self.boxes = rank, size, boxes
        self.sends = self.bytes_sent = 0

    def sendrecv(self, message, dest, out, source):
        if dest is not None:
            self.boxes[self.rank, dest].put(message.copy())
            self.sends, self.bytes_sent = self.sends + 1, self.bytes_sent + message.nbytes
        if source is None:
            return None
        arrived = self.boxes[source, self.rank].get(timeout=60)
        out[:arrived.size] = arrived
        return out[:arrived.size]

    def allgatherv(self, message, counts=None, out=None):  # the allgather exchange's one call, for the reference
        return self.messages


def run_ranks(messages, params, exchange=recursive):
    """`exchange` of `messages` (one per rank) into a copy of `params` on every rank, each rank a thread. Returns
    the ranks' (params, elements sent, communicator); raises the first rank's error, if any."""
    size = len(messages)
    boxes = {(a, b): queue.Queue() for a in range(size) for b in range(size)}
    comms = [Threads(rank, size, boxes) for rank in range(size)]
    results = [None] * size

    def rank_main(rank):
        mine = params.copy()
        comms[rank].messages = messages
        try:
            results[rank] = (mine, exchange(comms[rank], ThresholdCodec(), messages[rank], None, mine), comms[rank])
        except ValueError as e:
            results[rank] = e

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(result is not None for result in results), "a rank hung"
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


def messages_of(ranks: int, n: int, seed: int = 0):
    """A threshold message per rank, of densities from none to every element (sparse and bitmap ones)."""
    rng = np.random.default_rng([seed, ranks])
    densities = [0.0, 0.002, 0.05, 0.3, 1.0]
    return [threshold_encode(np.where(rng.random(n) < densities[rank % 5], rng.choice([-1.0, 0.7], n), 0.1)
                             .astype(np.float32), TAU) for rank in range(ranks)]


@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 6, 7, 8, 12, 13, 16])
@pytest.mark.parametrize("n", [1001, 40, 3])
def test_every_rank_ends_with_the_mean_of_the_messages_bit_for_bit_alike(ranks, n):
    messages = messages_of(ranks, n)
    params = np.random.default_rng(1).normal(size=n).astype(np.float32)
    results = run_ranks(messages, params)
    gathered, gathered_sent, _ = run_ranks(messages, params, allgather)[0]
    exact = params.astype(np.float64)
    for message in messages:
        threshold_decode(message, exact, 1.0 / ranks)
    first = results[0][0]
    assert all(np.array_equal(mine, first) for mine, _, _ in results)  # replicas identical
    assert np.allclose(first, exact, rtol=1e-6, atol=1e-6) and np.allclose(first, gathered, rtol=1e-6, atol=1e-6)
    assert {sent for _, sent, _ in results} == {gathered_sent} == {sum(map(message_count, messages))}


@pytest.mark.parametrize("ranks", [2, 3, 5, 6, 8, 12, 13, 16])
def test_messages_per_rank_grow_as_log2_of_the_ranks_and_bytes_stay_within_a_dense_allreduce(ranks):
    n = 1001
    core = 1 << (ranks.bit_length() - 1)
    extra = ranks - core
    for rank, (_, _, comm) in enumerate(run_ranks(messages_of(ranks, n, seed=2), np.zeros(n, np.float32))):
        folded, folding = rank < 2 * extra and rank % 2 == 0, rank < 2 * extra and rank % 2 == 1
        assert comm.sends == (1 if folded else 2 * (core.bit_length() - 1) + folding)
        assert comm.bytes_sent <= allreduce_bytes(4 * n, ranks) + split_header_bytes(ranks)


def test_ranks_of_different_taus_are_refused():
    messages = messages_of(2, 100)
    messages[1] = threshold_encode(np.ones(100, np.float32), 0.25)
    with pytest.raises(ValueError, match="every rank's message must have the same tau"):
        run_ranks(messages, np.zeros(100, np.float32))
