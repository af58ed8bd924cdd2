"""`backend: cupy` against the CPU backend: kernels against their references, training on 1 rank and under
`mpiexec -n 2` (two ranks sharing one GPU) in every sync mode, and the sequence, attention and bag layers on 1
rank, results equal within float32 tolerance; the watchdog's roll-call names a rank stalled on cupy.

Written for a GPU machine; where cupy sees no GPU every test here is skipped, saying so.
"""
import json
import math
import os
import re

import h5py
import numpy as np
import pytest

from mpitrain.kernels.threshold import message, reference
from mpitrain.parallel.backend import gpu_available
from mpitrain.rundir.checkpoint import list_checkpoints
from mpitrain.testing.backend_models import CNN, SEQUENCE_MODELS, write_model_data
from mpitrain.testing.cuda_check import run_cuda_kernels_check
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec
from mpitrain.testing.updater_cases import STEPS, step_inputs

pytestmark = pytest.mark.skipif(not gpu_available(), reason="no GPU: cupy is not installed or "
                                "cupy.is_available() is False; the cupy backend's tests need a CUDA GPU")
MODES = [{"mode": "allreduce"}, {"mode": "averaging", "frequency": 3}, {"mode": "sharing", "threshold": 1.0e-2},
         {"mode": "sharing", "threshold": 1.0e-2, "exchange": "split"},
         {"mode": "sharing", "threshold": 1.0e-2, "exchange": "recursive"}, {"mode": "none"}]


@pytest.fixture
def cupy():
    import cupy
    return cupy


def test_conv_and_pool_kernels_on_cupy_equal_the_cpu_kernels(cupy):
    from mpitrain.kernels.activations import KINDS
    from mpitrain.kernels.conv_rows import activation_backward_rows, bias_activation_nchw
    from mpitrain.kernels.im2col import col2im, geometry, im2col
    from mpitrain.kernels.pool import max_pool, max_pool_backward

    def outputs(shape, dtype=np.float32):
        """An output array for the CPU kernel and one for cupy's."""
        return np.empty(shape, dtype), cupy.empty(shape, dtype)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 9, 8)).astype(np.float32)
    for kernel, stride, padding in ((3, 1, "same"), (2, 2, "valid"), ((3, 2), 2, "same")):
        g = geometry(x.shape[1:], kernel, stride, padding)
        cols, cols_dev = outputs((3, *g.cols_shape))
        im2col(x, g, 0.0, cols)
        im2col(cupy.asarray(x), g, 0.0, cols_dev)
        np.testing.assert_array_equal(cols_dev.get(), cols)
        dx, dx_dev = outputs(x.shape)
        col2im(cols, g, dx)
        col2im(cols_dev, g, dx_dev)
        np.testing.assert_allclose(dx_dev.get(), dx, rtol=1e-6, atol=1e-6)
        (y, y_dev), (where, where_dev) = (outputs((3, 2, g.out_height, g.out_width), dtype)
                                          for dtype in (np.float32, np.int32))
        max_pool(x, g, y, where)
        max_pool(cupy.asarray(x), g, y_dev, where_dev)
        np.testing.assert_array_equal(y_dev.get(), y)
        np.testing.assert_array_equal(where_dev.get(), where)
        max_pool_backward(y, where, g, dx)
        max_pool_backward(y_dev, where_dev, g, dx_dev)
        np.testing.assert_allclose(dx_dev.get(), dx, rtol=1e-6)
    rows, b = rng.normal(size=(3 * 4 * 5, 6)).astype(np.float32), rng.normal(size=6).astype(np.float32)
    dy = rng.normal(size=(3, 6, 4, 5)).astype(np.float32)
    for kind in KINDS:
        y, y_dev = outputs(dy.shape)
        bias_activation_nchw(rows, b, kind, y)
        bias_activation_nchw(cupy.asarray(rows), cupy.asarray(b), kind, y_dev)
        np.testing.assert_allclose(y_dev.get(), y, rtol=1e-6, atol=1e-7)
        (dz, dz_dev), (sums, sums_dev) = outputs(rows.shape), outputs((3, 6), np.float64)
        activation_backward_rows(dy, y, kind, dz, sums)
        activation_backward_rows(cupy.asarray(dy), y_dev, kind, dz_dev, sums_dev)
        np.testing.assert_allclose(dz_dev.get(), dz, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(sums_dev.get(), sums, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("l2", [False, True], ids=["no-l2", "l2"])
@pytest.mark.parametrize("name", list(STEPS))
def test_updater_steps_on_cupy_equal_the_cpu_kernels(cupy, name, l2):
    from mpitrain.kernels import updaters
    function, slots, args = STEPS[name]
    step = getattr(updaters, function)
    state, g, p, decay, out = step_inputs(np.random.default_rng(1), 1000, np.float32, slots, l2, False)
    host = [*state, g, p, decay, out]
    device = [None if a is None else cupy.asarray(a) for a in host]
    for t in (1, 2, 3):
        step(*host[:-1], *args(t), host[-1])
        step(*device[:-1], *args(t), device[-1])
        for on_host, on_device in zip(host, device):
            if on_host is not None:
                np.testing.assert_allclose(on_device.get(), on_host, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("encoding", ["sparse", "bitmap"])
def test_threshold_kernels_on_cupy_equal_the_reference(cupy, encoding):
    from mpitrain.kernels import threshold as kernels
    residual = np.random.default_rng(2).normal(0, 1e-2, size=50_001).astype(np.float32)
    expected_residual = residual.copy()
    expected = message.encode(reference, expected_residual, 1.5e-2, encoding)
    device = cupy.asarray(residual)
    encoded = kernels.threshold_encode(device, 1.5e-2, encoding)
    np.testing.assert_array_equal(encoded.get(), expected)
    np.testing.assert_array_equal(device.get(), expected_residual)
    out, expected_out = cupy.zeros(residual.size, dtype=cupy.float32), np.zeros_like(residual)
    kernels.threshold_decode(encoded, out, 0.5)
    message.decode(reference, expected, expected_out, 0.5)
    np.testing.assert_array_equal(out.get(), expected_out)
    kernels.clip_residual(device, 1e-2)
    assert float(abs(device).max()) <= 1e-2


@pytest.mark.parametrize("encoding", ["sparse", "bitmap"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_exchange_blocks_on_cupy_equal_numpy(cupy, encoding, dtype):
    """Cutting, summing and re-encoding blocks: the same xp code on cupy arrays, the same int32 messages."""
    from mpitrain.kernels import threshold as kernels
    from mpitrain.kernels.threshold.blocks import add_block, block_bounds, cut_message, encode_block, reduce_parts
    n, ranks = 50_001, 4
    residuals = [np.random.default_rng(seed).normal(0, 1e-2, size=n).astype(dtype) for seed in range(ranks)]
    bounds = block_bounds(n, ranks)
    host = [cut_message(kernels.threshold_encode(r.copy(), 1.5e-2, encoding), bounds) for r in residuals]
    device = [cut_message(kernels.threshold_encode(cupy.asarray(r), 1.5e-2, encoding), bounds) for r in residuals]
    for (parts, sizes), (device_parts, device_sizes) in zip(host, device):
        np.testing.assert_array_equal(device_sizes, sizes)
        np.testing.assert_array_equal(device_parts.get(), parts)
    def block_2(parts, sizes):  # the part for rank 2
        return parts[sizes[:2].sum():sizes[:3].sum()]

    lo, hi = bounds[2], bounds[3]
    block, device_block = np.zeros(hi - lo, dtype), cupy.zeros(hi - lo, dtype)
    sent = reduce_parts([block_2(*cut) for cut in host], block, 1 / ranks)
    assert reduce_parts([block_2(*cut) for cut in device], device_block, 1 / ranks) == sent
    np.testing.assert_array_equal(device_block.get(), block)
    reduced, device_reduced = encode_block(block, sent), encode_block(device_block, sent)
    np.testing.assert_array_equal(device_reduced.get(), reduced)
    out, device_out = np.ones(hi - lo, dtype), cupy.ones(hi - lo, dtype)
    assert add_block(reduced, out) == add_block(device_reduced, device_out) == sent
    np.testing.assert_array_equal(device_out.get(), out)


@pytest.mark.parametrize("encoding", ["sparse", "bitmap"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_recursive_exchange_counts_on_cupy_equal_numpy(cupy, encoding, dtype):
    """A message's counts, count blocks sparse and dense, and the scaled add: the same xp code on cupy arrays."""
    from mpitrain.kernels import threshold as kernels
    from mpitrain.kernels.threshold.counts import add_counts, add_message, add_scaled, encode_counts
    n, tau = 50_001, 1.5e-2
    residual = np.random.default_rng(0).normal(0, 1e-2, size=n).astype(dtype)
    sent = kernels.threshold_encode(residual.copy(), tau, encoding)
    counts, device_counts = np.zeros(n, np.int8), cupy.zeros(n, np.int8)
    assert add_message(sent, counts) == add_message(cupy.asarray(sent), device_counts)
    np.testing.assert_array_equal(device_counts.get(), counts)
    for lo, hi in ((0, n), (100, 117), (0, 2000)):  # dense, and sparse where few are set
        block, device_block = encode_counts(counts[lo:hi], 7, tau), encode_counts(device_counts[lo:hi], 7, tau)
        np.testing.assert_array_equal(device_block.get(), block)
        out, device_out = np.ones(hi - lo, np.int8), cupy.ones(hi - lo, np.int8)
        assert add_counts(block, out, tau) == add_counts(device_block, device_out, tau) == 7
        np.testing.assert_array_equal(device_out.get(), out)
    params, device_params = np.ones(n, dtype), cupy.ones(n, dtype)
    add_scaled(counts, params, tau / 3)
    add_scaled(device_counts, device_params, tau / 3)
    np.testing.assert_array_equal(device_params.get(), params)


def test_numba_cuda_kernels_on_the_gpu_equal_the_reference():
    """cuda_kernels_check.py, which tests/unit/kernels/test_threshold_cudasim.py runs under the simulator, on the real device."""
    assert "ok default launch" in run_cuda_kernels_check(simulator=False, timeout=600)


def test_nccl_on_one_rank_sums_and_broadcasts_device_buffers(cupy, tmp_path):
    """comm.device_collectives: nccl on this GPU: an Allreduce (blocking and posted) and a Bcast of device buffers
    through NCCL on one rank leave them as they were (the sum of one), and a training run on one rank says NCCL
    summed its gradients and ends where MPI's does."""
    from mpi4py import MPI

    from mpitrain.parallel.backend import create_backend
    from mpitrain.parallel.comm import Communicator
    comm = Communicator(MPI.COMM_SELF.Dup()).for_backend(create_backend("cupy"), "auto", "nccl")
    assert comm.device_collectives == "nccl", "cupy has no NCCL here"
    values = cupy.arange(1000, dtype=cupy.float32) / 7
    buf, posted_buf = values.copy(), values.copy()
    comm.allreduce_(buf)
    comm.complete([comm.iallreduce_(posted_buf)])
    comm.bcast_(buf)
    np.testing.assert_array_equal(buf.get(), values.get())
    np.testing.assert_array_equal(posted_buf.get(), values.get())
    make_dataset(tmp_path / "data", n_train=320, shape=(1, 8, 8))
    runs = {}
    for name in ("nccl", "mpi"):
        folder = tmp_path / name
        folder.mkdir()
        config = write_config(folder / "exp.yaml", tmp_path / "data", backend="cupy", train={"epochs": 1},
                              comm={"device_collectives": name})
        result = mpiexec(1, MPITRAIN, "train", config, timeout=300)
        assert result.returncode == 0, result.stderr
        runs[name] = json.loads((folder / "run" / "summary.json").read_text())
    assert runs["nccl"]["device_collectives"] == "nccl" and runs["mpi"]["device_collectives"] == "mpi"
    assert runs["nccl"]["replica_hashes"] == runs["mpi"]["replica_hashes"]


def trained(tmp_path, name, n, backend, sync, model):
    folder = tmp_path / name
    folder.mkdir()
    config = write_config(folder / "exp.yaml", tmp_path / "data", sync=sync, model=model, backend=backend,
                          train={"epochs": 1})
    result = mpiexec(n, MPITRAIN, "train", config, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((folder / "run" / "summary.json").read_text())
    with h5py.File(list_checkpoints(str(folder / "run"))[-1]) as f:
        return summary, f["params"][...]


@pytest.mark.parametrize("model", [{}, CNN], ids=["mlp", "cnn"])
def test_one_rank_on_cupy_equals_numpy(tmp_path, model):
    make_dataset(tmp_path / "data", n_train=320, shape=(1, 8, 8))
    cpu, cpu_params = trained(tmp_path, "numpy", 1, "numpy", {"mode": "none"}, model)
    gpu, gpu_params = trained(tmp_path, "cupy", 1, "cupy", {"mode": "none"}, model)
    assert gpu["backend"] == "cupy" and cpu["backend"] == "numpy"
    np.testing.assert_allclose(gpu_params, cpu_params, rtol=1e-3, atol=1e-4)
    assert math.isclose(gpu["test_loss"], cpu["test_loss"], rel_tol=1e-3)


@pytest.mark.parametrize("sync", MODES, ids=["-".join(m[key] for key in ("mode", "exchange") if key in m) for m in MODES])
def test_two_ranks_sharing_one_gpu_equal_numpy_in_every_mode(tmp_path, sync):
    make_dataset(tmp_path / "data", n_train=320, shape=(1, 8, 8))
    cpu, cpu_params = trained(tmp_path, "numpy", 2, "numpy", sync, CNN)
    gpu, gpu_params = trained(tmp_path, "cupy", 2, "cupy", sync, CNN)
    assert len(set(gpu["replica_hashes"])) == (2 if sync["mode"] == "none" else 1)
    assert gpu["host_staging"] == (not gpu["cuda_aware_mpi"])
    if sync["mode"] == "sharing":  # a threshold decides discretely: rounding may send another element
        assert abs(gpu["test_accuracy"] - cpu["test_accuracy"]) < 0.05
    else:
        np.testing.assert_allclose(gpu_params, cpu_params, rtol=1e-3, atol=1e-4)
        assert math.isclose(gpu["test_loss"], cpu["test_loss"], rel_tol=1e-3)


def backends_agree(tmp_path, name: str, backends=("numpy", "cupy")) -> None:
    """SEQUENCE_MODELS[name] trained on 1 rank on each of `backends` from the same seed ends with the same
    parameters and test loss within float32 tolerance."""
    write_model_data(name, tmp_path / "data")
    (first, first_params), (second, second_params) = (
        trained(tmp_path, f"{backend}-{i}", 1, backend, {"mode": "none"}, SEQUENCE_MODELS[name])
        for i, backend in enumerate(backends))
    assert (first["backend"], second["backend"]) == backends
    np.testing.assert_allclose(second_params, first_params, rtol=1e-3, atol=1e-4)
    assert math.isclose(second["test_loss"], first["test_loss"], rel_tol=1e-3)


@pytest.mark.parametrize("name", SEQUENCE_MODELS)
def test_the_sequence_attention_and_bag_layers_on_cupy_equal_numpy(tmp_path, name):
    backends_agree(tmp_path, name)


def test_dropout_masks_are_the_same_on_cupy_and_numpy(cupy):
    from mpitrain.nn.layers import keyed_bits
    np.testing.assert_array_equal(keyed_bits(cupy, (5, 1, 2, 3, 4), (64, 33)).get(),
                                  keyed_bits(np, (5, 1, 2, 3, 4), (64, 33)))


def test_the_roll_call_names_a_rank_stalled_in_its_step_on_cupy(tmp_path):
    """The watchdog's roll-call on the GPU path (issue 51): 2 ranks on cupy, rank 1 stalled in its step; one line
    names it and where rank 0 waits, as on the CPU (tests/mpi/test_rollcall.py)."""
    from tests.mpi.test_rollcall import HOST, WAITING, stalled
    make_dataset(tmp_path / "data", n_train=400, n_test=64)
    line, folder = stalled(tmp_path, tmp_path / "data", 2, "forward, backward and the update@1", backend="cupy")
    assert re.search(rf"rank 1 on {HOST} is in forward, backward and the update of epoch 1 step 3 \([\d.]+ s\); rank 0 "
                     rf"waits in the {WAITING} of epoch 1 step 3", line), line
    assert os.path.isfile(os.path.join(folder, "rank-1.json")) and os.path.isfile(os.path.join(folder, "verdict.txt"))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_the_compression_codecs_on_cupy_equal_numpy(cupy, name):
    """`sync.compression`'s encode and decode on device arrays give numpy's messages and values bit for bit."""
    from mpitrain.parallel.sync.compression import COMPRESSIONS
    codec = COMPRESSIONS[name]()
    values = (np.random.default_rng(0).normal(size=5000) * 1e-3).astype(np.float32)
    wire = codec.encode(cupy.asarray(values))
    np.testing.assert_array_equal(cupy.asnumpy(wire), codec.encode(values))
    out, expected = cupy.empty(values.size, np.float32), np.empty(values.size, np.float32)
    codec.decode(wire, out)
    codec.decode(codec.encode(values), expected)
    np.testing.assert_array_equal(cupy.asnumpy(out), expected)
