"""A bag column (`embedding_bag`, empty bags among them) trained on 2 ranks: its table's rows exchanged sparse give the
model of the dense exchange bit for bit, for fewer bytes, and the model learns the bag's effect."""
import json

import pytest

from mpitrain.testing.datasets import write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec
from mpitrain.testing.sequences import make_bag_dataset

IDS, DIM = 500, 8
GRAPH = [{"name": "bag", "type": "embedding_bag", "input": "recent", "dim": DIM},
         {"name": "joined", "type": "concat", "inputs": ["bag", "numeric"]},
         {"name": "hidden", "type": "dense", "input": "joined", "units": 16, "activation": "relu"},
         {"name": "out", "type": "dense", "input": "hidden", "units": 2}]


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bags")
    manifest = make_bag_dataset(folder / "data", ids=IDS)
    assert manifest.sequences[0]["shortest"] == 0  # empty bags among them
    return folder, max(manifest.label_counts["test"]) / sum(manifest.label_counts["test"])


def train(folder, name, **sync):
    config = write_config(folder / f"{name}.yaml", folder / "data", run_dir=str(folder / name),
                          model={"layers": [], "graph": GRAPH}, train={"epochs": 3, "batch_size": 64},
                          optimizer={"type": "adam", "lr": 0.01}, sync={"mode": "allreduce", **sync})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads((folder / name / "summary.json").read_text())


def test_bag_rows_go_sparse_and_give_the_model_of_the_dense_exchange(bags):
    folder, majority = bags
    sparse = train(folder, "sparse")
    dense = train(folder, "dense", embeddings="dense")
    assert sparse["replica_hashes"] == dense["replica_hashes"] and len(set(sparse["replica_hashes"])) == 1
    assert sparse["bytes_sent_per_step_max"] < dense["bytes_sent_per_step_min"] - IDS * DIM * 4 / 2
    assert sparse["evaluation"]["accuracy"] > majority + 0.03, (sparse["evaluation"], majority)  # it learns
