"""Sharded embedding tables without MPI (mpitrain/parallel/sharded_tables.py, mpitrain/rundir/table_rows.py): a fresh
table's share on any rank is the whole table's rows, a checkpoint's rows written by R ranks read back by R' ranks
are each rank's share, lazy updates against a dense reference on the touched rows, the config refusing what a
sharded table does not train with, `shard: auto`'s choice, and the memory estimate of a rank's share. tests/mpi/test_sharded_tables.py trains them on 2-4 ranks."""
import os
import types

import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.config.sections import ModelConfig, OptimizerConfig, load_config
from mpitrain.nn.embedding import initial_rows
from mpitrain.nn.graph import build_graph
from mpitrain.nn.model import Budget
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sharded_rows import RowSharding
from mpitrain.parallel.sharded_tables import ShardedTable
from mpitrain.rundir.table_rows import check_rows, describe, read_share, rows_file, write_rows


def test_a_fresh_tables_share_on_any_rank_is_the_whole_tables_rows():
    whole = initial_rows(12345, 50, 3)
    assert whole.shape == (50, 3) and abs(whole.std() - 1 / np.sqrt(3)) < 0.1
    large = initial_rows(7, 20000, 8) * np.sqrt(8)  # Normal(0, 1/sqrt(dim)), scaled back to unit variance
    assert abs(large.mean()) < 0.01 and abs(large.std() - 1) < 0.01 and abs((large > 1.96).mean() - 0.025) < 0.003
    for ranks in range(1, 8):
        sharding = RowSharding(50, ranks)
        for rank in range(ranks):
            assert np.array_equal(initial_rows(12345, 50, 3, sharding.ids_of(rank)), whole[sharding.ids_of(rank)])
    assert not np.array_equal(initial_rows(1, 50, 3), whole)  # another key, another table


def shares(table: np.ndarray, ranks: int) -> list:
    """Stand-ins of each rank's `ShardedTable` of `table` (its params and one state slot, the params doubled)."""
    sharding = RowSharding(len(table), ranks)
    return [types.SimpleNamespace(name="emb/table0", rows=len(table), dim=table.shape[1],
                                  arrays=lambda part=table[sharding.ids_of(rank)]: {"params": part,
                                                                                     "first_moment": 2 * part})
            for rank in range(ranks)]


@pytest.mark.parametrize("rows", [1, 5, 37])
def test_rows_written_by_some_ranks_are_read_back_as_any_rank_counts_shares(tmp_path, rows):
    table = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    for written_by in (1, 2, 3, 4):
        checkpoint = str(tmp_path / f"ckpt-{written_by}.h5")
        for rank, share in enumerate(shares(table, written_by)):
            write_rows(checkpoint, rank, [share])
        described = describe(shares(table, 1))
        check_rows(checkpoint, described, written_by)
        for ranks in (1, 2, 3, 5, 6):
            sharding = RowSharding(rows, ranks)
            for rank in range(ranks):
                out = np.full((sharding.shard_rows(rank), 2), -1, np.float32)
                read_share(checkpoint, written_by, described[0], "first_moment", sharding, rank, out)
                assert np.array_equal(out, 2 * table[sharding.ids_of(rank)]), (written_by, ranks, rank)
    checkpoint = str(tmp_path / "ckpt-4.h5")
    assert rows_file("a/ckpt-0001-000002.h5", 3, "emb/table0", "params") == \
        "a/ckpt-0001-000002.rows/3/emb/table0/params.npy"
    np.save(rows_file(checkpoint, 3, "emb/table0", "params"), np.zeros((rows // 4 + 1, 2), np.float32))
    with pytest.raises(DataError, match=r"ckpt-4.h5: .*ckpt-4.rows/3/emb/table0/params.npy holds an array of shape"):
        check_rows(checkpoint, described, 4)
    os.remove(rows_file(checkpoint, 3, "emb/table0", "params"))
    with pytest.raises(DataError, match=r"ckpt-4.h5: its sharded table rows .*ckpt-4.rows/3/emb/table0/params.npy "
                                        r"cannot be read"):
        check_rows(checkpoint, described, 4)


def one_rank_table(rows: int, dim: int, values: np.ndarray, config) -> ShardedTable:
    table = ShardedTable(Communicator(MPI.COMM_SELF.Dup()), "emb/table0", rows, dim, np.float32)
    table.params[...] = values
    table.take_updater(config)
    return table


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rmsprop", "adam", "adamw", "nadam"])
def test_lazy_updates_match_the_dense_updater_on_the_touched_rows_and_leave_the_others(kind):
    config = OptimizerConfig(type=kind, lr=0.05, momentum=0.9 if kind == "sgd" else 0.0, weight_decay=0.0)
    rng = np.random.default_rng(0)
    start = rng.normal(size=(4, 3)).astype(np.float32)
    table = one_rank_table(4, 3, start, config)
    dense = start.copy()
    reference = create_updater(config, dense.reshape(-1), np.zeros(dense.size, np.float32))
    run = create_updater(config, np.zeros(1, np.float32), np.zeros(1, np.float32))  # the run's (its rate and t)
    touched = [[0, 1, 2], [0, 2], [0, 2]]  # row 1 once, row 3 never
    after_first = None
    for rows in touched:
        grads = np.zeros((4, 3), np.float32)
        grads[rows] = rng.normal(size=(len(rows), 3))
        run.iteration += 1
        table.grads[...], table.written = grads, np.array(rows)
        table.step(run)
        dense += reference.delta(grads.reshape(-1), dense.reshape(-1)).reshape(4, 3)
        after_first = table.params[1].copy() if after_first is None else after_first
    np.testing.assert_allclose(table.params[[0, 2]], dense[[0, 2]], rtol=1e-6, atol=1e-7)  # touched every step
    assert np.array_equal(table.params[3], start[3])  # never touched: as drawn
    assert np.array_equal(table.params[1], after_first)  # touched once: no step since
    if kind not in ("adagrad", "rmsprop"):  # a dense step with momentum keeps moving row 1 (lazy: state kept)
        assert not np.allclose(dense[1], after_first)


def test_plain_sgd_steps_the_touched_rows_as_the_replicated_table_does():
    config = OptimizerConfig(type="sgd", lr=0.1, momentum=0.0)
    start = np.ones((3, 2), np.float32)
    table = one_rank_table(3, 2, start, config)
    run = create_updater(config, np.zeros(1, np.float32), np.zeros(1, np.float32))
    table.grads[...] = grads = np.float32([[1, 2], [3, 4], [5, 6]])
    table.written = np.array([0, 2])
    table.step(run)
    expected = start.copy()
    expected[[0, 2]] += grads[[0, 2]] * np.float32(-0.1)  # the replicated table's `row_delta`, in float32
    assert np.array_equal(table.params, expected) and (table.params[1] == 1).all()
    assert table.arrays().keys() == {"params"}  # plain SGD keeps no state


GRAPH = ("model: {layers: [], graph: [{name: emb, type: embedding, input: categorical, dim: 4, shard: rows}, "
         "{name: flat, type: flatten, input: emb}, {name: out, type: dense, input: flat, units: 2}]}\n")


@pytest.mark.parametrize("override, message", [
    ("sync.deterministic=true", r"sync.deterministic is True, expected False with model.graph\[0\].shard: rows"),
    ("train.accumulate=2", r"train.accumulate is 2, expected 1 with model.graph\[0\].shard: rows"),
    ("train.clip_norm=1", r"train.clip_norm is 1.0, expected 0.0 with .*every rank's rows"),
    ("backend=cupy", r"backend is 'cupy', expected 'numpy' with model.graph\[0\].shard: rows"),
    ("model.init_from=runs/a", r"model.init_from is 'runs/a', expected '' with model.graph\[0\].shard: rows \(its rows "
                               r"would start fresh"),
])
def test_the_config_refuses_what_a_sharded_table_does_not_train_with(tmp_path, override, message):
    path = tmp_path / "exp.yaml"
    path.write_text("data: {path: d}\n" + GRAPH)
    assert load_config(str(path)).model.graph[0]["shard"] == "rows"
    with pytest.raises(ConfigError, match=message):
        load_config(str(path), [override])


def test_shard_takes_none_rows_or_auto(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("data: {path: d}\n" + GRAPH.replace("shard: rows", "shard: columns"))
    with pytest.raises(ConfigError, match=r"model.graph\[0\].shard is 'columns', expected one of \('none', 'rows', 'auto'\)"):
        load_config(str(path))


class Numbers:
    shape = (3,)


class Ids:
    shape = (2,)
    ids = (200_000, 50)


def table_graph(shard: str) -> ModelConfig:
    return ModelConfig(graph=[{"name": "emb", "type": "embedding", "input": "categorical", "dim": 16, "shard": shard},
                              {"name": "flat", "type": "flatten", "input": "emb"},
                              {"name": "out", "type": "dense", "input": "flat", "units": 1}],
                       loss="binary_cross_entropy")


def test_shard_auto_shards_a_table_that_would_take_much_of_a_ranks_memory_and_records_its_choice():
    config, groups = table_graph("auto"), {"numeric": Numbers(), "categorical": Ids()}
    whole = 4 * 4 * sum(Ids.ids) * 16  # values, gradients and two moments, float32
    for ranks, memory, chosen in ((4, 2 * whole, "rows"), (4, 8 * whole, "none"), (1, 2 * whole, "none")):
        model = build_graph(config, groups, (5,), 1, np, budget=Budget(64, memory, ranks))
        assert model.layers[0].shard == chosen == model.config_entries()["model.graph"][0]["shard"], (ranks, memory)
        assert model.n_params == 16 * 2 + 1 + (0 if chosen == "rows" else sum(Ids.ids) * 16)
    assert config.graph[0]["shard"] == "auto"  # the config as written
    assert build_graph(config, groups, (5,), 1, np).layers[0].shard == "none"  # outside a run: no budget


def test_a_rank_needs_memory_for_its_share_of_a_sharded_tables_rows(monkeypatch):
    groups, whole = {"numeric": Numbers(), "categorical": Ids()}, 4 * 4 * sum(Ids.ids) * 16
    with pytest.raises(ConfigError, match=r"model.graph: the model needs about [\d,]+ bytes per rank \(3,200,833 "
                                          r"parameters x 4 copies"):
        build_graph(table_graph("none"), groups, (5,), 1, np, budget=Budget(64, whole // 2, 4))
    share = -(-Ids.ids[0] // 4) * 16 + -(-Ids.ids[1] // 4) * 16 + 33
    with pytest.raises(ConfigError, match=rf"\({share:,} parameters x 4 copies"):
        build_graph(table_graph("rows"), groups, (5,), 1, np, budget=Budget(64, 4 * 4 * share, 4))
    assert build_graph(table_graph("rows"), groups, (5,), 1, np, budget=Budget(64, whole // 2, 4)).n_params == 33
