"""Real Fashion-MNIST rows through the whole pipeline, as README.md's quick start runs it: `mpitrain etl`,
`mpitrain info`, 2-rank training, distributed evaluation, the report."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

from mpitrain.etl.idx import IMAGES_MAGIC, LABELS_MAGIC, find_splits, read_records
from mpitrain.testing import launch
from mpitrain.testing.datasets import write_idx
from mpitrain.testing.launch import FASHION, MPIEXEC, MPITRAIN, require_fashion_mnist

REPO = launch.REPO
SUBSET = {"train": 4000, "test": 1000}
PREFIX = {"train": "train", "test": "t10k"}


def fashion_subset(folder) -> None:
    """The first rows of each real Fashion-MNIST split, as IDX files of their own."""
    folder.mkdir()
    for split, (images, labels) in find_splits(FASHION).items():
        n = SUBSET[split]
        write_idx(folder / f"{PREFIX[split]}-images-idx3-ubyte.gz", read_records(images, 0, n), IMAGES_MAGIC)
        write_idx(folder / f"{PREFIX[split]}-labels-idx1-ubyte.gz", read_records(labels, 0, n), LABELS_MAGIC)


def quick_start_commands() -> list[list[str]]:
    """The commands of README.md's quick start, split into arguments."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    block = re.search(r"## Quick start\n+```\n(.*?)```", text, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def test_readme_quick_start_runs_and_two_ranks_learn_fashion_mnist(tmp_path):
    """Every quick-start command, run as written in a fresh folder holding configs/, with three changes for
    time: the Fashion-MNIST folder is a subset of its rows, Spark gets 2 cores, training runs 3 epochs."""
    require_fashion_mnist()
    fashion_subset(tmp_path / "idx")
    shutil.copytree(os.path.join(REPO, "configs"), tmp_path / "configs")
    commands = quick_start_commands()
    assert [c[c.index("mpitrain") + 1] for c in commands] == ["etl", "info", "train", "eval", "report"]
    outputs = []
    for args in commands:
        args = [f"idx:{tmp_path / 'idx'}" if a == f"idx:{FASHION}" else a for a in args]
        args = [MPIEXEC if a == "mpiexec" else MPITRAIN if a == "mpitrain" else a for a in args]
        args += {"etl": ["--master", "local[2]"], "train": ["--set", "train.epochs=3"]}.get(
            args[args.index(MPITRAIN) + 1], [])
        result = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                                env={**os.environ, "PYSPARK_PYTHON": sys.executable, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
        outputs.append(result.stdout)
    assert "train: 4000 rows in 8 shards" in outputs[1] and "checksums verified" in outputs[1]
    run_dir = tmp_path / "runs" / "fashion_mlp"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["sync_mode"] == "sharing" and len(set(summary["replica_hashes"])) == 1
    assert summary["test_accuracy"] > 0.75  # chance is 0.10; the full run reaches ~0.89
    assert summary["evaluation"]["rows"] == 1000
    assert f"accuracy {summary['test_accuracy']:.4f}" in outputs[3]  # eval scores the checkpoint training ended on
    assert (run_dir / "confusion-test.png").exists() and (run_dir / "report.png").exists()
