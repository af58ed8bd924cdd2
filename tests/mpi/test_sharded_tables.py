"""Embedding tables sharded by rows (issue 49) trained under mpiexec: with plain SGD the model of the replicated table
bit for bit on 2, 3 and 4 ranks (the dense part, the whole table gathered from the ranks' rows files, the scores);
a resume on another rank count re-shards and goes on as the replicated run does; eval on 1 and 3 ranks scores the
replicated model (an uneven split: ranks run as many forwards); Adam's lazy state resumes bit for bit; predict and
the ONNX export (its tables in external data past protobuf's limit) agree, and Spark scoring refuses such a model;
a rank stalled before its rows' exchange is named by the watchdog while the other waits in the Alltoallv;
`shard: auto` shards on ranks of little memory, every rank choosing as rank 0, and the run records `rows`; a bag
column and a plain column sharded in one model train the replicated model bit for bit; a column of 10^7 ids trains
on 4 ranks, each holding a quarter of its rows; the dense part keeps its sync mode (averaging, sharing) beside a
sharded table; new raw records, a file vocabulary among their columns, score under MPI as their split does."""
import json
import os
import re
import shutil
import socket
import sys
import time

import h5py
import numpy as np
import pytest
import yaml

from mpitrain.data.shards import read_manifest
from mpitrain.parallel.sharded_rows import RowSharding
from mpitrain.rundir.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.rundir.table_rows import read_share
from mpitrain.testing.datasets import make_click_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, RANK_SCRIPTS, mpiexec
from mpitrain.testing.references import read_split
from mpitrain.testing.sequences import make_bag_dataset

IDS = (50, 5000)
SGD = {"type": "sgd", "lr": 0.1, "momentum": 0.0}


def graph(shard: str) -> list:
    return [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 8, "shard": shard},
            {"name": "flat", "type": "flatten", "input": "emb"},
            {"name": "joined", "type": "concat", "inputs": ["flat", "numeric"]},
            {"name": "hidden", "type": "dense", "input": "joined", "units": 16, "activation": "relu"},
            {"name": "out", "type": "dense", "input": "hidden", "units": 1}]


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    # 513 test rows: 257 and 256 on 2 ranks, two evaluation batches on one rank and one on the other
    make_click_dataset(folder / "data", n_train=3000, n_test=513, ids=IDS)
    return folder


def train(folder, name, ranks, shard, optimizer=SGD, epochs=2, run_dir=None, **sections):
    config = write_config(folder / f"{name}.yaml", folder / "data", run_dir=str(run_dir or folder / name),
                          model={"layers": [], "graph": graph(shard), "loss": "binary_cross_entropy"},
                          train={"epochs": epochs, "batch_size": 64}, optimizer=optimizer, sync={"mode": "allreduce"},
                          **sections)
    result = mpiexec(ranks, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(((run_dir or folder / name) / "summary.json").read_text())


def arrays(run_dir) -> dict:
    """The newest checkpoint's arrays by name, a sharded table's gathered whole from its ranks' rows files."""
    path = list_checkpoints(str(run_dir))[-1]
    with h5py.File(path) as f:
        found = {}
        f["layers"].visititems(lambda name, item: found.update({name: item[...]}) if isinstance(item, h5py.Dataset)
                               else None)
    ckpt = load_checkpoint(path)
    for table in ckpt.sharded_tables:
        whole = np.empty((table["rows"], table["dim"]), np.float32)
        read_share(path, ckpt.ranks, table, "params", RowSharding(table["rows"], 1), 0, whole)
        found[table["name"]] = whole
    return found


def assert_same_model(sharded, replicated, tables=("emb/table0", "emb/table1")):
    a, b = arrays(sharded), arrays(replicated)
    assert sorted(a) == sorted(b) and set(tables) <= set(a)
    for name in a:
        assert np.array_equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def two_ranks(clicks):
    return {shard: train(clicks, f"two-{shard}", 2, shard) for shard in ("rows", "none")}


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_plain_sgd_on_a_sharded_table_trains_the_replicated_model_bit_for_bit(clicks, two_ranks, ranks):
    summaries = two_ranks if ranks == 2 else \
        {shard: train(clicks, f"{ranks}-{shard}", ranks, shard) for shard in ("rows", "none")}
    prefix = "two" if ranks == 2 else ranks
    assert_same_model(clicks / f"{prefix}-rows", clicks / f"{prefix}-none")
    assert summaries["rows"]["evaluation"] == summaries["none"]["evaluation"]
    assert summaries["rows"]["evaluation"]["rows"] == 513
    rows = clicks / f"{prefix}-rows" / "checkpoints" / "ckpt-0002-000000.rows"
    assert sorted(p.name for p in rows.iterdir()) == [str(rank) for rank in range(ranks)]


def test_a_resume_on_three_ranks_reshards_the_rows_and_goes_on_as_the_replicated_run(clicks, two_ranks):
    for shard in ("rows", "none"):
        resumed = clicks / f"resumed-{shard}"
        shutil.copytree(clicks / f"two-{shard}", resumed)
        for path in (resumed / "checkpoints").glob("ckpt-0002-*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()  # back to the end of epoch 1, written by 2 ranks
        train(clicks, f"resumed-{shard}", 3, shard, epochs=3, run_dir=resumed)
    assert_same_model(clicks / "resumed-rows", clicks / "resumed-none")
    with h5py.File(list_checkpoints(str(clicks / "resumed-rows"))[-1]) as f:
        assert f.attrs["ranks"] == 3 and f.attrs["epoch"] == 3


def test_eval_of_a_sharded_run_on_1_and_3_ranks_scores_the_replicated_model(clicks, two_ranks):
    for ranks in (1, 3):
        result = mpiexec(ranks, MPITRAIN, "eval", clicks / "two-rows", timeout=60)
        assert result.returncode == 0, result.stderr
        scores = json.loads((clicks / "two-rows" / "eval-test.json").read_text())
        assert scores["auc"] == two_ranks["none"]["evaluation"]["auc"] and scores["rows"] == 513


def test_adams_lazy_row_state_is_checkpointed_and_resumes_mid_epoch_bit_for_bit(clicks):
    adam, every = {"type": "adam", "lr": 0.003}, {"checkpoint": {"unit": "step", "every": 10, "keep": 100}}
    straight = train(clicks, "adam", 2, "rows", adam, **every)
    assert straight["evaluation"]["auc"] > 0.6
    resumed = clicks / "adam-resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    for path in (clicks / "adam" / "checkpoints").glob("ckpt-0001-000010*"):  # step 10 of the second epoch
        (shutil.copytree if path.is_dir() else shutil.copy)(path, resumed / "checkpoints" / path.name)
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == \
        ["ckpt-0001-000010.h5", "ckpt-0001-000010.rows"]
    train(clicks, "adam", 2, "rows", adam, run_dir=resumed, **every)
    table = clicks / "adam" / "checkpoints" / "ckpt-0002-000000.rows" / "1" / "emb" / "table1"
    assert sorted(p.name for p in table.iterdir()) == ["first_moment.npy", "params.npy", "second_moment.npy"]
    for name in ("params", "first_moment", "second_moment"):
        again = resumed / "checkpoints" / "ckpt-0002-000000.rows" / "1" / "emb" / "table1" / f"{name}.npy"
        assert np.array_equal(np.load(table / f"{name}.npy"), np.load(again))
    assert_same_model(resumed, clicks / "adam")


def test_predict_and_the_onnx_export_of_a_sharded_run_agree_and_a_large_one_keeps_its_tables_apart(
        clicks, two_ranks, tmp_path, monkeypatch):
    import onnxruntime

    from mpitrain.base.errors import ConfigError
    from mpitrain.etl.scoring import load_model
    from mpitrain.rundir import export

    run_dir = clicks / "two-rows"
    for ranks, command in ((2, ["predict", run_dir, "--split", "test"]),  # 257 and 256 rows: uneven batches
                           (1, ["export", run_dir, "--out", tmp_path / "sharded.onnx"])):  # the rows files, whole
        result = mpiexec(ranks, MPITRAIN, *command, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
    with h5py.File(run_dir / "predictions-test.h5") as f:
        predicted = f["probabilities"][...]
    x, _ = read_split(str(clicks / "data"), "test")
    numbers = len(read_manifest(str(clicks / "data")).columns["numeric"])  # x: the numbers, then the ids
    feeds = {"x": x[:, :numbers].astype(np.float32), "categorical": x[:, numbers:].astype(np.int64)}

    def outputs(path):
        return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    whole = outputs(tmp_path / "sharded.onnx")
    assert len(predicted) == 513
    np.testing.assert_allclose(whole, predicted, rtol=0, atol=1e-5)
    # a model past protobuf's 2 GiB (here: past a lowered limit) keeps its tables in PATH.data, read by onnxruntime
    monkeypatch.setattr(export, "EXTERNAL_DATA_BYTES", 100_000)
    export.write_model(export.export_run(str(run_dir)), str(tmp_path / "large.onnx"))
    assert (tmp_path / "large.onnx.data").stat().st_size >= sum(IDS) * 8 * 4 > (tmp_path / "large.onnx").stat().st_size
    assert np.array_equal(outputs(tmp_path / "large.onnx"), whole)
    with pytest.raises(ConfigError, match=r"large.onnx: its weights hold .* bytes .*mpiexec -n N mpitrain predict"):
        load_model(str(tmp_path / "large.onnx"))


@pytest.mark.parametrize("sync", [{"mode": "averaging", "frequency": 1}, {"mode": "sharing", "threshold": 1e-3}])
def test_the_dense_part_keeps_its_sync_mode_beside_a_sharded_table(clicks, two_ranks, sync):
    """averaging and sharing sync the dense part; the sharded rows are stepped by their owners every step, as under
    allreduce. Averaging every step with plain SGD is allreduce's model up to float32 rounding (a mean of parameters
    where allreduce takes a mean of gradients); sharing trains the sharded model at least as well as the replicated
    table under sharing (whose rows are threshold-encoded too)."""
    summaries = {}
    for shard in ("rows", "none") if sync["mode"] == "sharing" else ("rows",):
        name = f"sync-{sync['mode']}-{shard}"
        config = write_config(clicks / f"{name}.yaml", clicks / "data", run_dir=str(clicks / name),
                              model={"layers": [], "graph": graph(shard), "loss": "binary_cross_entropy"},
                              train={"epochs": 2, "batch_size": 64}, optimizer=SGD, sync=sync)
        result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        summaries[shard] = json.loads((clicks / name / "summary.json").read_text())["evaluation"]["auc"]
    mine, reference = arrays(clicks / f"sync-{sync['mode']}-rows"), arrays(clicks / "two-rows")
    assert sorted(mine) == sorted(reference)
    if sync["mode"] == "averaging":
        for key in mine:
            np.testing.assert_allclose(mine[key], reference[key], rtol=0, atol=1e-5, err_msg=key)
    else:
        assert summaries["rows"] >= summaries["none"] - 0.005, summaries
        assert summaries["rows"] > 0.55 and any(not np.array_equal(mine[k], reference[k]) for k in mine)


def give_vocabularies(data, parts: int) -> list[dict]:
    """Give the click dataset at `data` the values of a table the ETL wrote: column c0 a vocabulary in the manifest
    (`s0`, `s1`, ...), column c1 a file vocabulary in `parts` Parquet parts (`v0`, `v1`, ...), laid out as `mpitrain
    etl --vocabulary-files` lays one out; returns each column's {id: its value} (id 0: missing, 1: an unseen value)."""
    import pyarrow as pa

    from mpitrain.data.shards import write_manifest
    from mpitrain.data.vocabulary_files import parts_of
    from mpitrain.etl.vocabulary_files import vocabulary_folder, write_part
    manifest = read_manifest(str(data))
    small, large = manifest.columns["categorical"]
    small["vocabulary"] = [f"s{k}" for k in range(small["ids"] - 2)]
    values = [f"v{k}" for k in range(large["ids"] - 2)]
    part = parts_of(pa.array(values), parts)
    first, texts = 2, {0: None, 1: "never-seen"}
    for p in range(parts):
        mine = sorted(v for v, q in zip(values, part) if q == p)
        write_part(str(data), vocabulary_folder("c1"), p, pa.array(mine, pa.string()), np.ones(len(mine)), first)
        texts.update(zip(range(first, first + len(mine)), mine))
        first += len(mine)
    large.update(vocabulary_path=vocabulary_folder("c1"), vocabulary_parts=parts, hash="fnv1a64-splitmix64")
    write_manifest(str(data), manifest)
    return [{0: None, 1: "never-seen", **{k + 2: v for k, v in enumerate(small["vocabulary"])}}, texts]


def test_new_records_of_a_file_vocabulary_are_scored_under_mpi_as_the_split_they_came_from(tmp_path):
    """`mpiexec -n 3 mpitrain predict RUN --records PATH`: the test split's rows written back as raw Parquet records
    (numbers, a manifest vocabulary's texts, a file vocabulary's texts looked up by the ranks owning its parts,
    missing and unseen values) score as the split does on 2 ranks; a record missing a number is left out, named."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    data = tmp_path / "data"
    make_click_dataset(data, n_train=2000, n_test=300, ids=IDS)
    texts = give_vocabularies(data, parts=4)
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", data, run_dir=str(run_dir),
                          model={"layers": [], "graph": graph("rows"), "loss": "binary_cross_entropy"},
                          train={"epochs": 1, "batch_size": 64}, optimizer=SGD, sync={"mode": "allreduce"})
    for command in (["train", config], ["predict", run_dir, "--split", "test"]):
        result = mpiexec(2, MPITRAIN, *command, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
    with h5py.File(run_dir / "predictions-test.h5") as f:
        expected = f["probabilities"][...]
    x, _ = read_split(str(data), "test")  # the numbers, then the ids
    ids = x[:, 3:].astype(np.int64)
    assert {0, 1} <= set(ids[:, 0]) and {0, 1} <= set(ids[:, 1])  # missing and unseen values among them
    records = {f"n{j}": x[:, j].astype(np.float64).tolist() for j in range(3)}
    records.update({f"c{j}": [texts[j][i] for i in ids[:, j]] for j in range(2)})
    records["n2"][40] = None  # a missing number, not imputed: the record is left out
    pq.write_table(pa.table(records), tmp_path / "new.parquet", row_group_size=32)  # 10 row groups on 3 ranks
    result = mpiexec(3, MPITRAIN, "predict", run_dir, "--records", tmp_path / "new.parquet", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote {run_dir / 'predictions-records.h5'}: 299 rows of 300 records of " in result.stdout
    assert "; 1 left out, the first record 40: column 'n2'" in result.stdout
    with h5py.File(run_dir / "predictions-records.h5") as f:
        rows, scored = f["row"][...], f["probabilities"][...]
        assert "label" not in f and f.attrs["bad_records"] == 1 and f.attrs["records_read"] == 300
    assert np.array_equal(rows, np.delete(np.arange(300), 40))
    np.testing.assert_allclose(scored, expected[rows], rtol=1e-5, atol=1e-6)


@pytest.mark.alone
def test_a_rank_stalled_before_its_row_exchange_is_named_while_the_other_waits_in_the_alltoallv(clicks, tmp_path):
    config = write_config(tmp_path / "stall.yaml", clicks / "data", run_dir=str(tmp_path / "run"),
                          model={"layers": [], "graph": graph("rows"), "loss": "binary_cross_entropy"},
                          train={"epochs": 2, "batch_size": 64, "watchdog_s": 3}, optimizer=SGD)
    started = time.monotonic()
    result = mpiexec(2, MPITRAIN, "train", config, timeout=90,
                     env={**os.environ, "MPITRAIN_TEST_STALL": "forward, backward and the update@1"})
    assert result.returncode != 0 and time.monotonic() - started < 60, result.stderr[-3000:]
    assert re.search(rf"rank 1 on {socket.gethostname()} is in forward, backward and the update of epoch 1 step 3 "
                     r"\([\d.]+ s\); rank 0 waits in the Alltoallv of epoch 1 step 3", result.stderr), \
        result.stderr[-3000:]


def test_shard_auto_shards_on_ranks_of_little_memory_and_the_run_records_rows(clicks, tmp_path):
    table_bytes = sum(IDS) * 8 * 4 * 3  # plain SGD's copies: values, gradients, the delta buffer (state_copies)
    config = write_config(tmp_path / "auto.yaml", clicks / "data", run_dir=str(tmp_path / "auto"),
                          model={"layers": [], "graph": graph("auto"), "loss": "binary_cross_entropy"},
                          train={"epochs": 1, "batch_size": 64}, optimizer=SGD)
    # rank 0 could hold the tables in a quarter of its memory alone, rank 1 in a 40th: rank 0 decides for both
    result = mpiexec(2, sys.executable, os.path.join(RANK_SCRIPTS, "auto_shard.py"), config, 3 * table_bytes,
                     timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())
    assert recorded["model"]["graph"][0]["shard"] == "rows"
    assert sorted(p.name for p in (tmp_path / "auto" / "checkpoints" / "ckpt-0001-000000.rows").iterdir()) == ["0", "1"]


BAG_AND_PLAIN = [{"name": "users", "type": "embedding", "input": "categorical", "dim": 4},
                 {"name": "flat", "type": "flatten", "input": "users"},
                 {"name": "bag", "type": "embedding_bag", "input": "recent", "dim": 8},
                 {"name": "joined", "type": "concat", "inputs": ["bag", "flat", "numeric"]},
                 {"name": "hidden", "type": "dense", "input": "joined", "units": 16, "activation": "relu"},
                 {"name": "out", "type": "dense", "input": "hidden", "units": 2}]


def test_a_sharded_bag_column_beside_a_sharded_plain_column_trains_the_replicated_model_bit_for_bit(tmp_path):
    make_bag_dataset(tmp_path / "data", n_train=1500, n_test=301, ids=500, categorical={"user": 3000})
    for shard in ("rows", "none"):
        graph_of = [{**node, "shard": shard} if "embedding" in node["type"] else node for node in BAG_AND_PLAIN]
        config = write_config(tmp_path / f"{shard}.yaml", tmp_path / "data", run_dir=str(tmp_path / shard),
                              model={"layers": [], "graph": graph_of}, train={"epochs": 2, "batch_size": 32},
                              optimizer=SGD)
        result = mpiexec(3, MPITRAIN, "train", config, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
    sharded, replicated = (json.loads((tmp_path / shard / "summary.json").read_text()) for shard in ("rows", "none"))
    assert sharded["evaluation"] == replicated["evaluation"]
    assert_same_model(tmp_path / "rows", tmp_path / "none", {"users/table0", "bag/table"})


def test_a_column_of_ten_million_ids_trains_sharded_on_4_ranks_each_holding_a_quarter(tmp_path):
    ids = 10**7  # a hashed user column's --hash-buckets 10^7 (ids 0..10^7): a table no test could hold 4 times
    make_click_dataset(tmp_path / "data", n_train=4000, n_test=400, ids=(ids,))
    config = write_config(tmp_path / "users.yaml", tmp_path / "data", run_dir=str(tmp_path / "run"),
                          model={"layers": [], "graph": graph("rows"), "loss": "binary_cross_entropy"},
                          train={"epochs": 1, "batch_size": 64}, optimizer=SGD)
    result = mpiexec(4, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # the table's values alone are 305 MB; replicated, every rank would write them and the gradients' 305 MB, on top
    # of the 300-400 MB a rank takes without a table (numba compiling, on a cold cache); sharded, a quarter of each
    whole_mb = ids * 8 * 4 / 2**20
    assert summary["peak_rss_mb"] < 300 + whole_mb, summary["peak_rss_mb"]
    rows = tmp_path / "run" / "checkpoints" / "ckpt-0001-000000.rows"
    assert [np.load(rows / str(rank) / "emb" / "table0" / "params.npy", mmap_mode="r").shape
            for rank in range(4)] == [(ids // 4, 8)] * 4
