"""The row-sharding rule and a batch's route (mpitrain/parallel/sharded_rows.py) without MPI: every id on exactly one
rank at any rank count, shards within one row of each other, de-duplicated routes that rebuild the batch, and the
exchanges on one rank (the whole table). tests/mpi/test_sharded_rows.py runs the exchanges on 2-4 ranks."""
import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sharded_rows import RowSharding, add_row_grads, gather_rows


@pytest.mark.parametrize("rows", [1, 7, 100, 1001])
def test_every_id_lives_on_exactly_one_rank_at_any_rank_count(rows):
    for ranks in range(1, 10):
        sharding = RowSharding(rows, ranks)
        held = np.concatenate([np.arange(rows)[sharding.ids_of(rank)] for rank in range(ranks)])
        assert sorted(held) == list(range(rows))  # each id once
        sizes = [sharding.shard_rows(rank) for rank in range(ranks)]
        assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
        for rank in range(ranks):
            ids = np.arange(rows)[sharding.ids_of(rank)]
            assert (sharding.owner(ids) == rank).all()
            assert np.array_equal(sharding.local(ids), np.arange(sizes[rank]))  # its shard's rows, in order


def test_frequent_ids_spread_over_the_ranks():
    """A vocabulary numbered from the most frequent value: the 8 hottest ids land on 4 ranks two each."""
    assert np.bincount(RowSharding(10**6, 4).owner(np.arange(8)), minlength=4).tolist() == [2, 2, 2, 2]


def test_a_route_sends_each_distinct_id_once_grouped_by_owner_and_rebuilds_the_batch():
    ids = np.array([[5, 3], [5, 8], [0, 3], [9, 9]])
    route = RowSharding(10, 3).route(ids)
    assert route.unique.tolist() == [0, 3, 5, 8, 9]
    assert np.array_equal(route.unique[route.inverse], ids)
    assert route.unique[route.order].tolist() == [0, 3, 9, 5, 8]  # owners 0, 0, 0, 2, 2: each owner's ascending
    assert route.counts.tolist() == [3, 0, 2]
    empty = RowSharding(10, 3).route(np.zeros((0, 2), np.int64))
    assert empty.unique.size == 0 and empty.inverse.shape == (0, 2) and empty.counts.tolist() == [0, 0, 0]


def test_on_one_rank_the_exchanges_are_the_whole_table():
    comm = Communicator(MPI.COMM_SELF.Dup())
    table = np.random.default_rng(0).normal(size=(6, 2))
    sharding = RowSharding(6, 1)
    ids = np.array([4, 1, 4, 0])
    route = sharding.route(ids)
    rows = gather_rows(comm, route, table)
    assert np.array_equal(rows[route.inverse], table[ids])
    grad = np.zeros_like(table)
    add_row_grads(comm, route, np.ones((route.unique.size, 2)), grad)
    assert grad[:, 0].tolist() == [1, 1, 0, 0, 1, 0]
