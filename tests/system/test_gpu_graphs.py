"""CUDA graphs of the training step on a device (train.cuda_graph, docs/gpus.md#cuda-graphs): the capturable GEMM
against cupy.matmul, outside and inside a capture; graphed steps against the uncaptured steps on the same GEMM, bit
for bit; a training run with `train.cuda_graph: true` against `false`.

Written for a GPU machine (the GPU check runs it); where cupy sees no GPU every test here is skipped, saying so.
The CPU covers the same logic through stand-ins: tests/unit/kernels/test_gemm.py, tests/unit/training/
test_step_graph.py.
"""
import json

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.config.sections import OptimizerConfig, SyncConfig
from mpitrain.kernels.gemm import CublasGemm, capturable_gemm
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import Conv2D, MaxPool2D
from mpitrain.nn.layers import Dense, Flatten
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend, gpu_available
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.rundir.checkpoint import list_checkpoints
from mpitrain.testing.backend_models import CNN
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec
from mpitrain.training.step_graph import CupyGraphs, GraphedStep
from mpitrain.training.steps import WholeBatch

CNN_NO_DROPOUT = {"layers": [layer for layer in CNN["layers"] if layer["type"] != "dropout"]}  # dropout blocks a graph
pytestmark = pytest.mark.skipif(not gpu_available(), reason="no GPU: cupy is not installed or "
                                "cupy.is_available() is False; the CUDA graph tests need a CUDA GPU")


@pytest.fixture
def cupy():
    import cupy
    return cupy


def test_the_capturable_gemm_equals_cupy_matmul_inside_a_capture(cupy):
    rng = np.random.default_rng(0)
    a, b = cupy.asarray(rng.normal(size=(64, 48)), np.float32), cupy.asarray(rng.normal(size=(48, 32)), np.float32)
    q = cupy.asarray(rng.normal(size=(2, 3, 5, 4)), np.float32)
    k = cupy.ascontiguousarray(cupy.asarray(rng.normal(size=(2, 3, 6, 4)), np.float32)).transpose(0, 1, 3, 2)
    cases = [(a, b), (a.T.copy().T, b), (a, b.T.copy().T), (b.T, a.T), (q, k)]
    gemm = CublasGemm.on_device()
    outs = [cupy.empty(x.shape[:-1] + y.shape[-1:], np.float32) for x, y in cases]
    for (x, y), out in zip(cases, outs):
        gemm(x, y, out)
        cupy.testing.assert_allclose(out, cupy.matmul(x, y), rtol=1e-5, atol=1e-5)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for out in outs:
            out.fill(0)
        stream.begin_capture()
        for (x, y), out in zip(cases, outs):
            gemm(x, y, out)
        graph = stream.end_capture()
        graph.launch(stream=stream)
        stream.synchronize()
    for (x, y), out in zip(cases, outs):
        cupy.testing.assert_allclose(out, cupy.matmul(x, y), rtol=1e-5, atol=1e-5)


def mlp(cupy):
    return Sequential([Dense(64, activation="relu"), Dense(10)], (20,), xp=cupy)


def cnn(cupy):
    return Sequential([Conv2D(8, kernel=3, activation="relu"), BatchNorm(), MaxPool2D(pool=2), Flatten(), Dense(10)],
                      (1, 12, 12), xp=cupy)


def trained(cupy, model, stepper, gemm):
    """Six steps (shapes 32, 32, 32, 32, 9, 32) of `stepper` on `model`: its parameters and statistics, on the host."""
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(type="sgd", lr=0.05, momentum=0.9), model.params, model.decay_mask)
    sync = create_synchronizer(SyncConfig(mode="allreduce", bucket_mb=0),
                               Communicator(MPI.COMM_SELF).for_backend(create_backend("cupy"), False))
    sync.start(model.trainable, updater)
    rng = np.random.default_rng(1)
    for step, rows in enumerate([32, 32, 32, 32, 9, 32]):
        x = cupy.asarray(rng.normal(size=(rows, *model.input_shape)), np.float32)
        y = cupy.asarray(rng.integers(0, 10, rows), np.int32)
        with capturable_gemm(gemm):
            stepper.step(model, x, y, (0, 0, 0, step), None, sync, updater)
    cupy.cuda.Device().synchronize()
    return model.params.get(), model.stats.get()


@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "batchnorm cnn"])
def test_graphed_steps_replay_the_uncaptured_steps_bit_for_bit(cupy, build):
    gemm = CublasGemm.on_device()
    params, stats = trained(cupy, build(cupy), WholeBatch(), gemm)
    stepper = GraphedStep(CupyGraphs())
    graphed_params, graphed_stats = trained(cupy, build(cupy), stepper, gemm)
    assert len(stepper.captured) == 1  # the 32-row shape; the 9-row one ran once, uncaptured
    np.testing.assert_array_equal(graphed_params, params)
    np.testing.assert_array_equal(graphed_stats, stats)


def test_training_with_cuda_graph_true_equals_false(tmp_path):
    make_dataset(tmp_path / "data", n_train=320, shape=(1, 8, 8))
    runs = {}
    for name, setting in (("graph", True), ("eager", False)):
        folder = tmp_path / name
        folder.mkdir()
        config = write_config(folder / "exp.yaml", tmp_path / "data", sync={"mode": "allreduce"}, model=CNN_NO_DROPOUT,
                              backend="cupy", train={"epochs": 2, "cuda_graph": setting})
        result = mpiexec(1, MPITRAIN, "train", config, timeout=300)
        assert result.returncode == 0, result.stderr
        summary = json.loads((folder / "run" / "summary.json").read_text())
        with h5py.File(list_checkpoints(str(folder / "run"))[-1]) as f:
            runs[name] = summary, f["params"][...]
        if setting:
            assert "is a CUDA graph from now on" in result.stderr
    assert runs["graph"][0]["cuda_graphs"] >= 1 and runs["eager"][0]["cuda_graphs"] == 0
    np.testing.assert_allclose(runs["graph"][1], runs["eager"][1], rtol=1e-4, atol=1e-5)
