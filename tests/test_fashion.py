"""Real Fashion-MNIST rows through the whole pipeline: `mpitrain etl`, `mpitrain info`, 2-rank training."""
import json
import os

from conftest import FASHION, MPITRAIN, command, mpiexec, require_fashion_mnist
from mpitrain.etl.idx import IMAGES_MAGIC, LABELS_MAGIC, find_splits, read_records
from test_etl import write_idx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBSET = {"train": 4000, "test": 1000}
PREFIX = {"train": "train", "test": "t10k"}


def fashion_subset(folder) -> None:
    """The first rows of each real Fashion-MNIST split, as IDX files of their own."""
    folder.mkdir()
    for split, (images, labels) in find_splits(FASHION).items():
        n = SUBSET[split]
        write_idx(folder / f"{PREFIX[split]}-images-idx3-ubyte.gz", read_records(images, 0, n), IMAGES_MAGIC)
        write_idx(folder / f"{PREFIX[split]}-labels-idx1-ubyte.gz", read_records(labels, 0, n), LABELS_MAGIC)


def test_two_ranks_learn_fashion_mnist(tmp_path):
    require_fashion_mnist()
    fashion_subset(tmp_path / "idx")
    result = command(MPITRAIN, "etl", "--source", f"idx:{tmp_path / 'idx'}", "--out", tmp_path / "fashion",
                     "--shards", "4", "--master", "local[2]", timeout=300)
    assert result.returncode == 0, result.stderr
    info = command(MPITRAIN, "info", tmp_path / "fashion", timeout=60)
    assert info.returncode == 0 and "train: 4000 rows in 4 shards" in info.stdout and "checksums verified" in info.stdout
    run_dir = tmp_path / "run"
    result = mpiexec(2, MPITRAIN, "train", os.path.join(REPO, "configs", "fashion_mlp.yaml"),
                     f"--set=data.path={tmp_path / 'fashion'}", f"--set=run_dir={run_dir}", "--set=train.epochs=3",
                     "--set=sync.mode=averaging", "--set=sync.frequency=5", timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks"] == 2 and len(set(summary["replica_hashes"])) == 1
    assert summary["test_accuracy"] > 0.75  # chance is 0.10; the full run reaches ~0.89
    assert summary["evaluation"]["rows"] == 1000
