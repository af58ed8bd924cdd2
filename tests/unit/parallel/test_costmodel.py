"""The cost model of sharing's exchanges (mpitrain/parallel/costmodel.py) and auto's choice (mpitrain/parallel/sync/exchange.py)."""
import math

import pytest

from mpitrain.parallel.costmodel import (
    Network,
    allgather_exchange,
    allreduce_bytes,
    message_elements,
    recursive_exchange,
    split_exchange,
    split_header_bytes,
)
from mpitrain.parallel.sync.exchange import choose_exchange

MLP = 648010  # parameters of configs/fashion_mlp.yaml
LENET = 187780  # configs/fashion_lenet.yaml
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


def exchange_cost(name, network, sizes, n):
    """(seconds, wire bytes) of exchange `name` for messages of `sizes` int32."""
    nbytes = [4 * size for size in sizes]
    return {"allgather": lambda: allgather_exchange(network, nbytes),
            "split": lambda: split_exchange(network, nbytes, n, 4),
            "recursive": lambda: recursive_exchange(network, nbytes, n)}[name]()


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
    assert recursive_exchange(DEFAULT, [4000], 10_000) == (0.0, 0.0)


@pytest.mark.parametrize("n", [MLP, 1001, 17])
@pytest.mark.parametrize("itemsize", [4, 8])
def test_recursive_never_moves_more_than_a_dense_ring_allreduce_plus_headers(n, itemsize):
    """Its counts are 1 byte (to 127 ranks) or 2 (to 32767): even the whole counts sent back to a folded rank
    keep it under a float32 ring's 8n (P-1)/P."""
    for ranks in RANKS + [127, 128, 129, 5000, 32767]:
        for name, size in messages(n).items():
            seconds, wire = recursive_exchange(DEFAULT, [size] * ranks, n)
            assert 0 < wire <= ring(n, itemsize, ranks) + split_header_bytes(ranks), (ranks, name)
            assert seconds > 0
        mixed = [list(messages(n).values())[rank % 6] for rank in range(ranks)]
        assert recursive_exchange(DEFAULT, mixed, n)[1] <= ring(n, itemsize, ranks) + split_header_bytes(ranks)


def test_recursive_takes_2_log2_rounds_and_2_more_where_ranks_fold():
    """Latency alone: the Allgather of the sizes (log2 P steps) and the pairwise rounds."""
    steps = Network(latency_s=1.0, byte_s=0.0)
    for ranks, rounds in ((2, 2), (3, 4), (4, 4), (5, 6), (8, 6), (64, 12), (100, 14), (1024, 20)):
        assert recursive_exchange(steps, [4000] * ranks, MLP)[0] == math.ceil(math.log2(ranks)) + rounds
    assert split_exchange(steps, [4000] * 1024, MLP, 4)[0] > 2 * 1023  # the Alltoallv and the Allgatherv's ring


def test_recursive_bytes_stay_flat_in_the_ranks_once_the_counts_are_dense():
    size = sparse_bytes(MLP, 0.01)
    wire = [recursive_exchange(DEFAULT, [size] * ranks, MLP)[1] for ranks in (256, 512, 1024)]
    assert max(wire) < 1.1 * min(wire) and wire[-1] < 0.3 * allreduce_bytes(4 * MLP, 1024)  # 2-byte counts
    assert recursive_exchange(DEFAULT, [size] * 64, MLP)[1] < 0.15 * allreduce_bytes(4 * MLP, 64)  # 1-byte counts


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


def test_auto_leaves_the_allgather_when_the_allgathered_bytes_dominate():
    every = int32s(sparse_bytes(MLP, 1.0))  # every element sent as a sparse index (encoding: sparse)
    assert choose_exchange("auto", DEFAULT, [every] * 2, MLP, 4) == "recursive"  # 1-byte counts: a quarter
    assert choose_exchange("auto", DEFAULT, [every] * 4, MLP, 4) == "recursive"
    slow = Network.of(latency_us=1.0, gbps=0.001)
    assert choose_exchange("auto", slow, [int32s(sparse_bytes(1000, 1.0))] * 4, 1000, 4) == "recursive"
    one_percent = int32s(sparse_bytes(MLP, 0.01))  # the MLP's messages
    assert choose_exchange("auto", DEFAULT, [one_percent] * 16, MLP, 4) == "allgather"
    assert choose_exchange("auto", DEFAULT, [one_percent] * 64, MLP, 4) == "recursive"
    assert choose_exchange("auto", DEFAULT, [one_percent] * 1024, MLP, 4) == "recursive"


def test_auto_splits_where_the_split_exchange_is_fastest():
    """1000 ranks, not a power of two: the folded ranks get the whole summed counts back, and on a network of bytes
    alone (no latency) that costs recursive more than split's 2P messages do."""
    free = Network(latency_s=0.0, byte_s=1.0)
    sizes = [int32s(sparse_bytes(MLP, 0.01))] * 1000
    assert exchange_cost("split", free, sizes, MLP)[0] < exchange_cost("recursive", free, sizes, MLP)[0]
    assert choose_exchange("auto", free, sizes, MLP, 4) == "split"
    assert choose_exchange("auto", DEFAULT, sizes, MLP, 4) == "recursive"


@pytest.mark.parametrize("setting", ["allgather", "split", "recursive"])
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
    """LeNet's 187,780 parameters at 1% on 1024 ranks: the model calls the allgather faster than split on an idle
    100 Gb/s network (fewer steps), but it would send about 4x a dense Allreduce's bytes: auto leaves it."""
    ranks = 1024
    sizes = [int32s(sparse_bytes(LENET, 0.01))] * ranks
    assert exchange_cost("allgather", DEFAULT, sizes, LENET)[0] < exchange_cost("split", DEFAULT, sizes, LENET)[0]
    assert exchange_cost("allgather", DEFAULT, sizes, LENET)[1] > 3 * allreduce_bytes(4 * LENET, ranks)
    assert choose_exchange("auto", DEFAULT, sizes, LENET, 4) == "recursive"
    for ranks in (2, 4, 16, 64, 256, 1024):  # whatever it picks stays within the dense Allreduce's bytes
        picked = choose_exchange("auto", DEFAULT, sizes[:ranks], LENET, 4)
        assert exchange_cost(picked, DEFAULT, sizes[:ranks], LENET)[1] <= (allreduce_bytes(4 * LENET, ranks)
                                                                            + split_header_bytes(ranks))


@pytest.mark.parametrize("network", [DEFAULT, Network.of(latency_us=5.0, gbps=10.0)], ids=["100 Gb/s", "10 Gb/s"])
@pytest.mark.parametrize("model, n, message", [("MLP", MLP, 11703), ("LeNet", LENET, 5671)])
def test_auto_is_at_or_under_a_dense_allreduce_in_time_and_bytes_up_to_1024_ranks(network, model, n, message):
    """Issue 30's table (benchmarks/cluster.py's extrapolation in docs/benchmarks.md): the messages as measured on
    the simulated cluster (about 0.45% and 0.75% of the parameters), 64 to 1024 ranks; at 256 and more, recursive's 2 log2 P
    messages are what keeps it under, as the allgather's bytes and split's 2P messages are not."""
    for ranks in (64, 256, 1024):
        sizes = [message // 4] * ranks
        picked = choose_exchange("auto", network, sizes, n, 4)
        seconds, wire = exchange_cost(picked, network, sizes, n)
        assert seconds <= network.allreduce(4 * n, ranks) and wire <= allreduce_bytes(4 * n, ranks), (ranks, picked)
        if ranks >= 256:
            assert picked == "recursive" and exchange_cost("split", network, sizes, n)[0] > seconds


def test_a_sharded_tables_bytes_per_rank_stay_flat_as_ranks_grow_and_a_replicated_ones_grow():
    from mpitrain.parallel.costmodel import alltoall_bytes, replicated_table_step, sharded_table_step
    network = Network.of(latency_us=1.0, gbps=100)
    sharded = [sharded_table_step(network, 512, 32, ranks)[1] for ranks in (2, 64, 1024)]
    replicated = [replicated_table_step(network, 512, 32, ranks)[1] for ranks in (2, 64, 1024)]
    payload = [b - alltoall_bytes(8, ranks) for b, ranks in zip(sharded, (2, 64, 1024))]  # less the part sizes
    assert payload[0] == 256 * (8 + 2 * 4 * 32) and payload[2] == pytest.approx(512 * 1023 / 1024 * (8 + 2 * 4 * 32))
    assert replicated[2] == pytest.approx(1023 * 512 * 33 * 4 + 1023 * 8) and replicated[2] > 100 * sharded[2]
    assert sharded_table_step(network, 512, 32, 1) == (0.0, 0.0)
    # its latency grows with the ranks (pairwise steps); at 1024 ranks three Alltoallv's steps dominate
    assert sharded_table_step(network, 512, 32, 1024)[0] > 3 * 1023 * 1e-6
    assert replicated[0] < sharded[0] * 2  # on 2 ranks the two are alike
