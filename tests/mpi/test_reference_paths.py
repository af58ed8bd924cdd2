"""The GPU's kernel path checked on the CPU: each backend model (mpitrain.testing.backend_models) trained on the numba
kernels and on what cupy arrays run (mpitrain.testing.reference_paths, one process for all) ends with the same
parameters. The recurrent model is left out: what cupy arrays run there are numba-CUDA kernels, which only the CUDA
simulator runs without a GPU, a thread at a time, too slowly for training (tests/harness/cuda_kernels_check.py holds
them to the CPU path step by step, padded sequences included). Not a GPU test: the layers' own cupy branches and
the device are left to benchmarks/gpu_check.py.
A reference that gave NaN for a sequence of no steps, where its kernel gave 0, was seen first on a GPU; this finds
such a difference here."""
import subprocess
import sys

import h5py
import numpy as np
import pytest

from mpitrain.rundir.checkpoint import list_checkpoints
from mpitrain.testing.backend_models import CNN, SEQUENCE_MODELS, write_model_data
from mpitrain.testing.datasets import write_config

MODELS = {"cnn": CNN, **{name: model for name, model in SEQUENCE_MODELS.items() if name != "recurrent"}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every model trained both ways, 1 epoch on 1 rank, in one process: the folder of their run directories, and
    what the process wrote to stderr (why a run is missing)."""
    work = tmp_path_factory.mktemp("reference-paths")
    configs = []
    for name, model in MODELS.items():
        write_model_data(name, work / f"{name}-data")
        configs.append(write_config(work / f"{name}.yaml", work / f"{name}-data", model=model, train={"epochs": 1}))
    done = subprocess.run([sys.executable, "-m", "mpitrain.testing.reference_paths", str(work), *configs],
                          capture_output=True, text=True, timeout=300)
    return work, done.stderr


def last_params(run_dir) -> np.ndarray:
    with h5py.File(list_checkpoints(str(run_dir))[-1]) as f:
        return f["params"][...]


@pytest.mark.parametrize("name", MODELS)
def test_training_on_the_references_equals_training_on_the_numba_kernels(trained, name):
    work, stderr = trained
    runs = [work / f"{name}-{path}" for path in ("numba", "reference")]
    assert all((run / "summary.json").exists() for run in runs), stderr[-3000:]
    numba, reference = map(last_params, runs)
    assert np.isfinite(reference).all()
    np.testing.assert_allclose(reference, numba, rtol=1e-3, atol=1e-4)
