"""Spark scoring (`mpitrain score`, real Spark local[2]) of a sequence model: Parquet records of a sequence column
(standardized per channel), a bag column of merchant names (empty and missing lists among them, names never seen
in training) and two numbers (standardized) score as `mpitrain predict` scored the same rows of the dataset the ETL
wrote; a source without the model's columns or numbers, and a source of no named columns, are refused in one line."""
from __future__ import annotations

import contextlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpitrain import cli
from mpitrain.base.errors import ConfigError
from mpitrain.data.shards import read_manifest
from mpitrain.etl import cli as etl_cli
from mpitrain.etl.scoring import plan_scoring
from mpitrain.etl.sources import SourceOptions
from mpitrain.testing.datasets import write_config
from mpitrain.testing.launch import MPITRAIN, command
from mpitrain.testing.references import read_split
from tests.system.test_score import read_output

GRAPH = [{"name": "bag", "type": "embedding_bag", "input": "recent", "dim": 4},
         {"name": "steps", "type": "lstm", "input": "readings", "units": 4},
         {"name": "joined", "type": "concat", "inputs": ["bag", "steps", "numeric"]},
         {"name": "out", "type": "dense", "input": "joined", "units": 3}]


def write_records(path, n: int, seed: int, first_id: int = 0) -> None:
    """`n` records: an `id` (a key), `amount` and `id_number` (the id as a number: the stored rows are found again
    by it), `readings` (3-9 steps of 2 numbers), `recent` (0-4 merchants of m0..m19, a missing list every 7th
    record; m15.. only in the records of seed 1), and a class from the bag and the readings."""
    rng = np.random.default_rng(seed)
    readings = [rng.normal(5, 3, size=(rng.integers(3, 10), 2)).round(3).tolist() for _ in range(n)]
    bags = [None if i % 7 == 3 else [f"m{int(v)}" for v in rng.integers(0, 15 if seed == 0 else 20,
                                                                         rng.integers(0, 5))] for i in range(n)]
    label = [int(sum(int(m[1:]) % 3 for m in bag or []) + (np.mean(r) > 5)) % 3 for bag, r in zip(bags, readings)]
    ids = np.arange(first_id, first_id + n)
    pq.write_table(pa.table({"id": [f"r{i}" for i in ids], "label": pa.array(label, pa.int32()),
                             "amount": rng.normal(100, 30, n), "id_number": ids.astype(np.float64),
                             "readings": readings, "recent": pa.array(bags, pa.list_(pa.string()))}), str(path))


@pytest.fixture(scope="module")
def sequence_model(spark, tmp_path_factory):
    """The records through `mpitrain etl --sequence readings --bag recent --standardize` (a test file of its own;
    the bag's 15 merchants past --max-vocabulary 10: a file vocabulary, --vocabulary-files), a graph trained on them
    and `mpitrain predict` of its test split: (folder, run dir)."""
    import argparse

    from mpitrain.etl.cli import add_arguments, plan_from_args
    from mpitrain.etl.job import write_dataset
    folder = tmp_path_factory.mktemp("sequence-scoring")
    write_records(folder / "train.parquet", 300, seed=0)
    write_records(folder / "test.parquet", 80, seed=1, first_id=1000)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    write_dataset(spark, plan_from_args(parser.parse_args([
        "--source", f"parquet:{folder / 'train.parquet'}", "--test", str(folder / "test.parquet"),
        "--sequence", "readings", "--bag", "recent", "--features", "amount,id_number", "--standardize",
        "--max-vocabulary", "10", "--vocabulary-files", "--out", str(folder / "data"), "--shards", "2"])))
    bag = next(c for c in read_manifest(str(folder / "data")).sequences if c["name"] == "recent")
    assert bag["ids"] == 17 and bag["vocabulary_path"] == "vocabularies/recent"
    config = write_config(folder / "config.yaml", folder / "data", train={"epochs": 2, "batch_size": 32},
                          model={"layers": [], "graph": GRAPH})
    for args in ([MPITRAIN, "train", config], [MPITRAIN, "predict", folder / "run", "--split", "test"]):
        result = command(*args)
        assert result.returncode == 0, result.stdout + result.stderr
    return folder, folder / "run"


def test_a_sequence_model_scores_raw_records_as_predict_scored_their_stored_rows(spark, sequence_model, monkeypatch):
    import h5py
    folder, run_dir = sequence_model
    monkeypatch.setattr(etl_cli, "spark_session", lambda master, name: contextlib.nullcontext(spark))
    assert cli.main(["score", "--model", str(run_dir), "--source", f"parquet:{folder / 'test.parquet'}", "--out",
                     str(folder / "scored"), "--features", "amount,id_number", "--keys", "id"]) == 0
    metrics = json.loads((folder / "scored" / "_metrics.json").read_text())
    got = read_output(folder / "scored", "id")
    ids = np.array([int(key[1:]) for key in got["id"]])
    x, labels = read_split(str(folder / "data"), "test")  # the stored rows, in predict's order: found by id_number
    rank = np.argsort(np.argsort(x[:, 1]))  # each stored row's place by id (standardized ids keep their order)
    with h5py.File(run_dir / "predictions-test.h5") as f:
        expected, predicted = f["probabilities"][...], f["predicted"][...]
    expected_by_id, predicted_by_id = np.empty_like(expected), np.empty_like(predicted)
    expected_by_id[rank], predicted_by_id[rank] = expected, predicted
    order = np.argsort(ids)
    assert metrics["rows"] == metrics["records"] == 80 and len(ids) == 80
    np.testing.assert_allclose(got["probabilities"][order], expected_by_id, rtol=0, atol=1e-5)
    assert (got["predicted"][order] == predicted_by_id).all() and (got["label"][order] == labels[np.argsort(rank)]).all()
    assert metrics["accuracy"] == pytest.approx(float((predicted == labels).mean()), abs=1e-12)


def test_what_a_sequence_model_cannot_score_is_refused_in_one_line(sequence_model, tmp_path):
    folder, run_dir = sequence_model
    pq.write_table(pa.table({"label": [0, 1], "amount": [1.0, 2.0], "id_number": [1.0, 2.0],
                             "readings": [[[1.0, 2.0]], [[3.0, 4.0]]]}), str(tmp_path / "no-bag.parquet"))
    with pytest.raises(ConfigError, match=r"--bag recent: no column 'recent' in parquet:"):
        plan_scoring(str(run_dir), f"parquet:{tmp_path / 'no-bag.parquet'}", str(tmp_path / "out"),
                     options=SourceOptions(features=("amount", "id_number")))
    with pytest.raises(ConfigError, match=r"rows of shape \[1\], but the model takes \[2\] \(the numeric --features "
                                          r"beside its sequences\)"):
        plan_scoring(str(run_dir), f"parquet:{folder / 'test.parquet'}", str(tmp_path / "out"),
                     options=SourceOptions(features=("amount",)))
    with pytest.raises(ConfigError, match=r"a sequence model reads the columns of"):
        plan_scoring(str(run_dir), "digits:", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
