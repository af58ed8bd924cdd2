"""The cost model of sharing's exchanges (mpitrain/parallel/costmodel.py) and auto's choice (mpitrain/parallel/sync/exchange.py)."""
import math

import pytest

from mpitrain.parallel.costmodel import (Network, allgather_exchange, allreduce_bytes, message_elements, split_exchange,
                                split_header_bytes)
from mpitrain.parallel.sync.exchange import choose_exchange

MLP = 648010  # parameters of configs/fashion_mlp.yaml
RANKS = [2, 3, 4, 5, 8, 16, 63, 64, 100, 256, 1000, 1024]
DEFAULT = Network.of(latency_us=1.0, gbps=100.0)  # sync.latency_us and sync.link_gbps's defaults


def sparse_bytes(n, density):
    """A sparse threshold message sending `density` of n elements: header + one int32 per element."""
    return 16 + 4 * round(density * n)


def bitmap_bytes(n):
    return 16 + 4 * math.ceil(n / 16)


def messages(n):
    """Message sizes from nearly empty to every element sent as a sparse index (sync.encoding: sparse)."""
    return {"empty": 16, "0.1%": sparse_bytes(n, 0.001), "1%": sparse_bytes(n, 0.01), "6%": sparse_bytes(n, 0.06),
            "bitmap": bitmap_bytes(n), "every element, sparse": sparse_bytes(n, 1.0)}


def ring(n, itemsize, ranks):
    return 2 * (ranks - 1) / ranks * itemsize * n


@pytest.mark.parametrize("n", [MLP, 1001, 17])
@pytest.mark.parametrize("itemsize", [4, 8])
def test_split_never_moves_more_than_a_dense_ring_allreduce_plus_headers(n, itemsize):
    for ranks in RANKS:
        for name, size in messages(n).items():
            seconds, wire = split_exchange(DEFAULT, [size] * ranks, n, itemsize)
            assert 0 < wire <= ring(n, itemsize, ranks) + split_header_bytes(ranks), (ranks, name)
            assert seconds > 0
        mixed = [list(messages(n).values())[rank % 6] for rank in range(ranks)]  # ranks of every density at once
        assert split_exchange(DEFAULT, mixed, n, itemsize)[1] <= ring(n, itemsize, ranks) + split_header_bytes(ranks)


def test_dense_messages_make_split_move_about_a_ring_allreduce():
    """Every element sent: the reduced blocks are dense, and the bound is nearly reached (it is not loose)."""
    for ranks in (4, 64, 1024):
        wire = split_exchange(DEFAULT, [sparse_bytes(MLP, 1.0)] * ranks, MLP, 4)[1]
        assert wire >= 0.99 * ring(MLP, 4, ranks)


def test_allgather_moves_every_other_rank_s_message_and_split_does_not_grow_with_the_ranks():
    size = sparse_bytes(MLP, 0.01)
    for ranks in RANKS:
        assert allgather_exchange(DEFAULT, [size] * ranks)[1] == (ranks - 1) * (8 + size)
    split = [split_exchange(DEFAULT, [size] * ranks, MLP, 4)[1] for ranks in (64, 256, 1024)]
    assert max(split) < 1.1 * min(split)  # bounded by the dense blocks: flat in P
    assert allgather_exchange(DEFAULT, [size] * 1024)[1] > 9 * split[-1]


def test_one_rank_exchanges_nothing():
    assert allgather_exchange(DEFAULT, [4000]) == (0.0, 0.0)
    assert split_exchange(DEFAULT, [4000], 10_000, 4) == (0.0, 0.0)


def test_a_message_sends_at_most_one_element_per_index_or_all_of_a_bitmap():
    n = 1000
    assert list(message_elements([0, 4 * 10, 4 * math.ceil(n / 16), 4 * 100, 4 * n], n)) == [0, 10, n, 100, n]


def test_collective_costs_follow_mpich_s_algorithms():
    """The refactored Allreduce and Allgatherv costs: recursive doubling when small, else reduce-scatter + allgather
    or a ring."""
    assert DEFAULT.allreduce(1000, 4) == pytest.approx(2e-6 + 2000 * 8e-11)
    assert DEFAULT.allreduce(1e6, 4) == pytest.approx(4e-6 + 1.5e6 * 8e-11)
    assert allreduce_bytes(1e6, 4) == 1.5e6 and allreduce_bytes(1e6, 1) == 0.0
    assert DEFAULT.allgatherv([100, 200, 300]) == pytest.approx(2e-6 + 500 * 8e-11)
    assert DEFAULT.allgatherv([1e6] * 4) == pytest.approx(3e-6 + 3e6 * 8e-11)


def int32s(nbytes):
    return (nbytes - 16) // 4 + 4  # a message's size in int32, as the Allgather of sizes gives it


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_auto_keeps_allgather_on_few_ranks_with_the_default_network(ranks):
    """Messages as `encoding: auto` makes them: never longer than a bitmap."""
    for size in messages(MLP).values():
        if size <= bitmap_bytes(MLP):
            assert choose_exchange("auto", DEFAULT, [int32s(size)] * ranks, MLP, 4) == "allgather"


def test_auto_splits_when_the_allgathered_bytes_dominate():
    every = int32s(sparse_bytes(MLP, 1.0))  # every element sent as a sparse index (encoding: sparse)
    assert choose_exchange("auto", DEFAULT, [every] * 2, MLP, 4) == "allgather"  # 2 ranks: split never pays
    assert choose_exchange("auto", DEFAULT, [every] * 4, MLP, 4) == "split"
    slow = Network.of(latency_us=1.0, gbps=0.001)
    assert choose_exchange("auto", slow, [int32s(sparse_bytes(1000, 1.0))] * 4, 1000, 4) == "split"
    one_percent = int32s(sparse_bytes(MLP, 0.01))  # the MLP's messages: SparCML's crossover, 2n/k, is ~200 ranks
    assert choose_exchange("auto", DEFAULT, [one_percent] * 64, MLP, 4) == "allgather"
    assert choose_exchange("auto", DEFAULT, [one_percent] * 1024, MLP, 4) == "split"


@pytest.mark.parametrize("setting", ["allgather", "split"])
def test_a_set_exchange_is_kept_whatever_the_cost(setting):
    assert choose_exchange(setting, DEFAULT, [5] * 3, 1000, 4) == setting


def test_the_fit_recovers_a_network_from_its_allreduces_and_pingpongs():
    truth = Network.of(latency_us=40.0, gbps=0.9)
    sizes = [1024, 16384, 262144, 1048576, 2592040, 4194304]
    for ranks in (2, 4, 8):
        fitted = Network.fit([(n, truth.allreduce(n, ranks)) for n in sizes], ranks)
        assert abs(fitted.latency_us - 40.0) < 1e-6 and abs(fitted.gbps - 0.9) < 1e-9
    link = Network.from_pingpong([(n, truth.cost(1, n)) for n in sizes])
    assert abs(link.latency_us - 40.0) < 1e-6 and abs(link.gbps - 0.9) < 1e-9
    noisy = Network.fit([(n, truth.allreduce(n, 4) * (1.1 if i % 2 else 0.9)) for i, n in enumerate(sizes)], 4)
    assert 0.75 < noisy.gbps < 1.1 and 30 < noisy.latency_us < 50  # errors of 10% move it little


def test_auto_never_lets_the_allgather_outgrow_a_dense_allreduce():
    """LeNet's 187,780 parameters at 1% on 1024 ranks: the model calls the allgather faster on an idle 100 Gb/s
    network (fewer steps), but it would send about 4x a dense Allreduce's bytes: auto splits."""
    lenet, ranks = 187780, 1024
    sizes = [int32s(sparse_bytes(lenet, 0.01))] * ranks
    nbytes = [4 * size for size in sizes]
    assert allgather_exchange(DEFAULT, nbytes)[0] < split_exchange(DEFAULT, nbytes, lenet, 4)[0]
    assert allgather_exchange(DEFAULT, nbytes)[1] > 3 * allreduce_bytes(4 * lenet, ranks)
    assert choose_exchange("auto", DEFAULT, sizes, lenet, 4) == "split"
    for ranks in (2, 4, 16, 64, 256, 1024):  # whatever it picks stays within the dense Allreduce's bytes
        picked = choose_exchange("auto", DEFAULT, [int32s(sparse_bytes(lenet, 0.01))] * ranks, lenet, 4)
        exchange = allgather_exchange(DEFAULT, [4 * s for s in sizes[:ranks]]) if picked == "allgather" else \
            split_exchange(DEFAULT, [4 * s for s in sizes[:ranks]], lenet, 4)
        assert exchange[1] <= allreduce_bytes(4 * lenet, ranks) + split_header_bytes(ranks)
