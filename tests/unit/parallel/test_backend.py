"""The backend: choosing numpy or cupy, the transfer counter, and no host round trip inside a training step.

The step test runs on numpy here and on cupy where a GPU is present: the numpy backend
counts the same copies the GPU path makes, so the CPU run checks the trainer's bookkeeping.
"""
import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import OptimizerConfig
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import Conv2D, MaxPool2D
from mpitrain.nn.layers import KEYED_BITS, Dense, Dropout, Flatten, ReLU, keyed_bits
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend, gpu_available
from mpitrain.training.metrics import Traffic, Window

NO_GPU = "no GPU: cupy is not installed or cupy.is_available() is False; this test needs a CUDA GPU"
BACKENDS = ["numpy", pytest.param("cupy", marks=pytest.mark.skipif(not gpu_available(), reason=NO_GPU))]


def counts(backend):
    t = backend.transfers
    return t.to_device, t.to_device_bytes, t.to_host, t.to_host_bytes


def test_auto_takes_the_gpu_when_there_is_one_else_numpy():
    backend = create_backend("auto")
    assert backend.name == ("cupy" if gpu_available() else "numpy")
    assert backend.on_gpu == gpu_available()


@pytest.mark.skipif(gpu_available(), reason="a GPU is present: the cupy backend builds")
def test_cupy_without_a_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="backend: 'cupy' needs a CUDA GPU"):
        create_backend("cupy")


@pytest.mark.skipif(not gpu_available(), reason=NO_GPU)
def test_each_node_local_rank_takes_its_gpu():
    import cupy
    count = cupy.cuda.runtime.getDeviceCount()
    backend = create_backend("cupy", local_rank=3, local_size=4)
    assert backend.device == 3 % count and cupy.cuda.Device().id == backend.device


@pytest.mark.parametrize("name", BACKENDS)
def test_every_copy_is_counted_with_its_bytes(name):
    backend = create_backend(name)
    host = np.arange(10, dtype=np.float32)
    device = backend.to_device(host.copy())
    assert counts(backend) == (1, 40, 0, 0)
    assert np.array_equal(backend.to_host(device * 2), host * 2)
    assert counts(backend) == (1, 40, 1, 40)
    pinned = backend.empty_pinned(10, np.float32)
    backend.copy_to_host(device, pinned)
    assert np.array_equal(pinned, host) and counts(backend) == (1, 40, 2, 80)
    backend.copy_to_device(pinned[::-1].copy(), device)
    assert np.array_equal(backend.to_host(device), host[::-1]) and counts(backend) == (2, 80, 3, 120)


def small_cnn():
    return [Conv2D(3, 3, padding="same"), BatchNorm(), ReLU(), MaxPool2D(2), Flatten(), Dense(8), ReLU(),
            Dropout(0.2), Dense(3)]


@pytest.mark.parametrize("name", BACKENDS)
def test_no_transfer_inside_training_steps_and_one_per_window(name):
    backend = create_backend(name)
    model = Sequential(small_cnn(), (1, 6, 6), "softmax_cross_entropy", backend.xp)
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(type="adam", lr=0.01, l2=1e-4), model.params, model.decay_mask)
    rng = np.random.default_rng(0)
    batches = [(backend.to_device(rng.normal(size=(8, 1, 6, 6)).astype(np.float32)),
                backend.to_device(rng.integers(0, 3, size=8).astype(np.int32))) for _ in range(5)]
    window, before = Window(), counts(backend)
    for step, (x, y) in enumerate(batches):
        loss, correct = model.train_batch(x, y, key=(0, 0, 0, step))
        model.params += updater.delta(model.grads, model.params)
        assert not isinstance(loss, float) and not isinstance(correct, int)  # still arrays on the device
        window.add(step, loss, correct, len(y), 0.01, Traffic(), 0.0, 0.0)
    assert counts(backend) == before, "a training step copied between host and device"
    totals = window.totals(backend)
    assert counts(backend)[:2] == before[:2] and counts(backend)[2] == before[2] + 1  # the window's one read
    assert totals.steps == 5 and totals.samples == 40 and 0 <= totals.correct <= 40
    assert totals.first_bad_step == -1 and np.isfinite(totals.loss_sum) and totals.loss_sum > 0


def test_a_window_finds_the_first_step_whose_loss_is_not_finite():
    backend = create_backend("numpy")
    window = Window()
    for step, loss in enumerate([0.5, 0.4, np.inf, np.nan], start=7):
        window.add(step, np.float32(loss), np.int64(3), 4, 0.1, Traffic(), 0.0, 0.0)
    totals = window.totals(backend)
    assert totals.first_bad_step == 9 and totals.correct == 12 and totals.samples == 16


def test_keyed_bits_are_uniform_and_follow_the_key_alone():
    bits = keyed_bits(np, (3, 1, 0, 7), (400, 50))
    assert bits.shape == (400, 50) and bits.dtype == np.uint64 and bits.max() < 2**KEYED_BITS
    assert abs(bits.mean() / 2**KEYED_BITS - 0.5) < 0.01
    assert abs((bits < 2**KEYED_BITS // 4).mean() - 0.25) < 0.01
    np.testing.assert_array_equal(keyed_bits(np, (3, 1, 0, 7), (400, 50)), bits)
    assert (keyed_bits(np, (3, 1, 0, 8), (400, 50)) != bits).mean() > 0.99
