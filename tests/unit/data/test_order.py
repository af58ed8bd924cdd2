"""The epoch order: every row once, the same global batches on any rank count, each rank's rows in one range."""
import numpy as np
import pytest

from mpitrain.data.order import Blocks, EpochPlan


def global_batches(plan: EpochPlan, epoch: int, ranks: int) -> list[np.ndarray]:
    """Each step's rows over all ranks (each rank's part sorted, the parts in rank order)."""
    order = plan.epoch(epoch)
    return [np.concatenate([order.row_ids(step, r, ranks) for r in range(ranks)]) for step in range(plan.steps)]


def test_blocks_follow_chunks_and_shards_and_stop_at_max_rows():
    blocks = Blocks.from_shards([2500, 700], 1024)
    assert blocks.rows.tolist() == [1024, 1024, 452, 700] and blocks.shard.tolist() == [0, 0, 0, 1]
    assert blocks.start.tolist() == [0, 1024, 2048, 0]
    assert Blocks.from_shards([2500, 700], 1024, max_rows=1100).rows.tolist() == [1024, 76]


@pytest.mark.parametrize("shards, global_batch, window", [([2500, 3000, 1700], 12, 1200), ([700] * 5, 24, 24),
                                                          ([50, 3, 77], 6, 600)])
def test_every_row_once_per_epoch_and_the_same_global_batches_on_1_2_3_4_ranks(shards, global_batch, window):
    plan = EpochPlan(Blocks.from_shards(shards, 64), global_batch, window, seed=5)
    assert plan.steps == sum(shards) // global_batch and plan.dropped_rows == sum(shards) % global_batch
    for epoch in (0, 1):
        one = global_batches(plan, epoch, 1)
        rows = np.concatenate(one)
        assert len(rows) == len(np.unique(rows)) == plan.used_rows and rows.max() < sum(shards)
        for ranks in (2, 3, 4):
            if global_batch % ranks == 0:
                assert all(np.array_equal(np.sort(a), np.sort(b))
                           for a, b in zip(one, global_batches(plan, epoch, ranks)))
    first, second = (np.concatenate(global_batches(plan, e, 1)) for e in (0, 1))
    assert not np.array_equal(first, second)  # another order every epoch


def test_the_order_is_a_function_of_the_seed_and_shuffle_false_is_fixed():
    blocks = Blocks.from_shards([900, 900], 100)
    same = [np.concatenate(global_batches(EpochPlan(blocks, 10, 200, seed=1), 0, 1)) for _ in range(2)]
    other = np.concatenate(global_batches(EpochPlan(blocks, 10, 200, seed=2), 0, 1))
    assert np.array_equal(*same) and not np.array_equal(same[0], other)
    fixed = EpochPlan(blocks, 10, 200, seed=1, shuffle=False)
    assert np.array_equal(global_batches(fixed, 0, 1)[0], np.arange(0, 200, 20))  # row j of every stratum
    assert np.array_equal(np.concatenate(global_batches(fixed, 0, 1)), np.concatenate(global_batches(fixed, 3, 1)))


def test_a_batch_takes_one_row_from_every_stratum_of_its_window():
    """Sorted data (here: labels in blocks of 100 rows) comes out mixed as its window is."""
    plan = EpochPlan(Blocks.from_shards([1000], 100), 20, 1000, seed=0)  # one window: all ten blocks
    labels = np.repeat(np.arange(10), 100)
    for batch in global_batches(plan, 0, 1):
        assert np.array_equal(np.bincount(labels[batch], minlength=10), np.full(10, 2))


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_each_rank_reads_one_range_per_window_so_chunks_are_read_about_once(ranks):
    blocks = Blocks.from_shards([7500] * 8, 1024)
    plan = EpochPlan(blocks, 128, 128 * 200, seed=0)
    order = plan.epoch(0)
    read = 0
    for window in range(plan.windows):
        spans = [order.span(window, r, ranks) for r in range(ranks)]
        assert [s.start for s in spans[1:]] == [s.stop for s in spans[:-1]]
        for r, span in enumerate(spans):
            read += sum(int(blocks.rows[p.block]) for p in order.pieces(span.start, span.stop))
            first_row = blocks.first_rows
            in_span = np.concatenate([first_row[p.block] + np.arange(p.lo, p.hi)
                                      for p in order.pieces(span.start, span.stop)])
            for step in range(window * 200, min((window + 1) * 200, plan.steps)):
                assert np.isin(order.row_ids(step, r, ranks), in_span).all()
    assert read / blocks.total_rows <= plan.chunk_reads(ranks)  # once, and the blocks cut by edges
    if ranks == 1:
        assert read / blocks.total_rows < 1.1


def test_plan_refuses_a_window_that_is_not_a_multiple_of_the_global_batch():
    with pytest.raises(ValueError, match="multiple of global_batch"):
        EpochPlan(Blocks.from_shards([100], 10), 12, 100, seed=0)
