"""A training step and an evaluation allocate nothing: each shipped image config in each sync mode, and the shipped
transformer (`configs/fashion_transformer.yaml`: positions, attention with dropout, layer norm, GELU, pooling over
ragged sequences) under allreduce, 2 ranks, the real training loop measuring itself with tracemalloc
(`train.trace_allocations`, mpitrain/training/allocations.py); the thirteen runs in turn in one job."""
import json
import os

import pytest

from mpitrain.testing import launch
from mpitrain.testing.datasets import make_dataset
from mpitrain.testing.sequences import make_sequence_dataset

REPO = launch.REPO
CONFIGS = ["fashion_mlp", "fashion_lenet", "fashion_cnn_bn", "fashion_dbn"]
LIMIT = 4096  # bytes: no numpy array larger than this, and the step's few Python objects stay below it
# an evaluation reads its rows from the shards, block by block into kept buffers: h5py makes a few small Python
# objects per read (selections, about 1 KB), and every so many reads rebuilds its object registry (a weakref dict
# of about 9 KB); far below one evaluation batch (256 rows of 784 bytes: 200 KB) or one layer's output
EVALUATION_LIMIT = 4 * LIMIT


@pytest.fixture(scope="module")
def fashion_shaped(tmp_path_factory):
    """Rows shaped like Fashion-MNIST's (1x28x28, 10 classes): 400 training rows per rank (several steps past the
    two warm-up steps at batch 32 and 64) and 300 test rows per rank (a full evaluation batch of 256 and a short one)."""
    path = tmp_path_factory.mktemp("fashion-shaped") / "data"
    make_dataset(path, n_train=800, n_test=600, shards=2, num_classes=10, shape=(1, 28, 28))
    return path


@pytest.fixture(scope="module")
def rows_shaped(tmp_path_factory):
    """Sequences shaped like Fashion-MNIST's rows (28 features per step, 10 classes), of 20 to 28 steps: 400
    training and 300 test rows per rank, so the two warm-up steps meet batches of the longest padded length."""
    path = tmp_path_factory.mktemp("rows-shaped") / "data"
    make_sequence_dataset(path, n_train=800, n_test=600, classes=10, features=28, lengths=(20, 28))
    return path


MODES = ["allreduce", "averaging", "sharing"]
SEQUENCE_CONFIGS = ["fashion_transformer"]  # under allreduce: the modes' own buffers are the image runs' above
RUNS = [(name, mode) for name in CONFIGS for mode in MODES] + [(name, "allreduce") for name in SEQUENCE_CONFIGS]


@pytest.fixture(scope="module")
def measured(fashion_shaped, rows_shaped, tmp_path_factory) -> dict:
    """Each run of RUNS, measuring its allocations, trained in turn in one job of 2 ranks (as a Python script
    would: ranks/train_each.py): {(config, mode): run directory}."""
    folder = tmp_path_factory.mktemp("allocations")
    runs, arguments = {}, []
    for name, mode in RUNS:
        runs[name, mode] = folder / f"{name}-{mode}"
        data = rows_shaped if name in SEQUENCE_CONFIGS else fashion_shaped
        shorter = ("optimizer.schedule.warmup=2",) if name in SEQUENCE_CONFIGS else ()  # 12 steps, not 500
        arguments += [os.path.join(REPO, "configs", f"{name}.yaml"), *[
            part for setting in (f"data.path={data}", f"run_dir={runs[name, mode]}", f"sync.mode={mode}",
                                 "sync.frequency=3", "train.epochs=2", "train.trace_allocations=true",
                                 "pretrain.epochs=1", "report=false", *shorter) for part in ("--set", setting)]]
    result = launch.train_each(2, *arguments, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return runs


@pytest.mark.parametrize("name, mode", RUNS)
def test_a_training_step_and_an_evaluation_allocate_no_array(measured, name, mode):
    summary = json.loads((measured[name, mode] / "summary.json").read_text())
    allocated = summary["allocated_bytes"]
    assert summary["steps_per_epoch"] * 2 > 2  # steps past the warm-up were measured
    assert 0 < allocated["step"] <= LIMIT and 0 < allocated["evaluation"] <= EVALUATION_LIMIT, allocated
