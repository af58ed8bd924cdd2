"""`sync.deterministic`'s exact mean (mpitrain.parallel.sync.fixed_point) against a float64 reference: within
float32's rounding of each part's largest value, the same bits whatever the order the micro-batches came in, each
part at its own scale, a NaN kept to its part; the deterministic step on one rank (ghost batch norm: each
micro-batch from the step's running statistics, their mean kept); and what the config and the stepper refuse."""
import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import (
    Config,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    PretrainConfig,
    SyncConfig,
    TrainConfig,
)
from mpitrain.kernels.fixed_point import (
    column_maxima,
    column_maxima_reference,
    fixed_point_sum,
    fixed_point_sum_reference,
)
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.parallel.sync.deterministic import DeterministicSync
from mpitrain.parallel.sync.fixed_point import ExactMean
from mpitrain.training.steps import batch_stepper

LAYOUT = [("a/W", (30, 20)), ("a/b", (20,)), ("tiny", (50,))]


def one_rank():
    return Communicator(MPI.COMM_SELF).for_backend(create_backend("numpy"), False)


def micro_batches(k=7, seed=0):
    rng = np.random.default_rng(seed)
    return [np.concatenate([rng.normal(size=600) * 10.0 ** rng.integers(-3, 3, 600), rng.normal(size=20) * 1e3,
                            rng.normal(size=50) * 1e-9]).astype(np.float32) for _ in range(k)]


def exact_mean(batches, order=None):
    exact = ExactMean(one_rank(), LAYOUT, np)
    for i in order if order is not None else range(len(batches)):
        exact.add(batches[i][:600], batches[i][600:])  # two flat arrays that together follow the layout
    first, second = np.empty(600, np.float32), np.empty(70, np.float32)
    exact.mean_(first, second)
    return np.concatenate([first, second])


def test_the_exact_mean_is_within_float32_rounding_of_each_parts_largest_and_independent_of_order():
    batches = micro_batches()
    mean = exact_mean(batches)
    reference = np.mean(np.array(batches, np.float64), axis=0)
    for begin, end in ((0, 600), (600, 620), (620, 670)):  # each part against its own largest value
        largest = np.abs(np.array(batches)[:, begin:end]).max()
        assert np.abs(mean[begin:end] - reference[begin:end]).max() <= largest * 2.0 ** -24
    assert np.abs(mean[620:] - reference[620:]).max() <= np.abs(reference[620:]).max() * 2.0 ** -20  # its own scale
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(len(batches))
        assert exact_mean(batches, order).tobytes() == mean.tobytes()
    float_sums = {np.sum(np.array(batches)[order], axis=0, dtype=np.float32).tobytes()
                  for order in (range(7), range(6, -1, -1), [3, 0, 6, 1, 5, 2, 4])}
    assert len(float_sums) > 1  # a float32 sum of the same micro-batches depends on their order: what this replaces
    exact = ExactMean(one_rank(), LAYOUT, np)
    exact.add(batches[0][:600], batches[0][600:])
    out = np.empty(670, np.float32)
    exact.mean_(out)  # one micro-batch: its own values back, every float32 exactly
    np.testing.assert_array_equal(out[:620], batches[0][:620])


def test_a_nan_or_an_infinity_makes_its_part_nan_and_leaves_the_others_exact():
    batches = micro_batches(3)
    batches[1][605] = np.nan
    batches[2][650] = np.inf
    mean = exact_mean(batches)
    assert np.isnan(mean[600:]).all() and np.isfinite(mean[:600]).all()
    clean = micro_batches(3)
    np.testing.assert_array_equal(mean[:600], exact_mean(clean)[:600])


def test_a_deterministic_step_is_ghost_batch_norm_with_the_micro_batches_mean_statistics():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(24, 5)).astype(np.float32), rng.integers(0, 3, 24).astype(np.int32)

    def model():
        net = Sequential([Dense(6), BatchNorm(momentum=0.5), Dense(3)], (5,), "softmax_cross_entropy", np)
        net.init_params(seed=2, scheme="he")
        return net

    net, config = model(), SyncConfig(mode="allreduce", deterministic=True, deterministic_rows=8)
    sync = create_synchronizer(config, one_rank())
    assert isinstance(sync, DeterministicSync) and sync.micro_rows == 8
    updater = create_updater(OptimizerConfig(type="sgd", lr=0.1), net.params, net.decay_mask)
    sync.start(net, updater)
    stepper = batch_stepper(0, net, one_rank(), 1, sync, 24)
    assert stepper.micro_rows(24) == 8
    stepper.step(net, x, y, (0, 0, 0, 0), None, sync, updater)

    expected_grads, expected_stats = [], []  # by hand: each micro-batch of 8 from the starting statistics
    for k in range(3):
        alone = model()
        alone.train_batch(x[8 * k:8 * k + 8], y[8 * k:8 * k + 8], key=(0, k, 0, 0))
        expected_grads.append(alone.grads.astype(np.float64))
        expected_stats.append(alone.stats.astype(np.float64))
    start = model()
    np.testing.assert_allclose(net.params, start.params - 0.1 * np.mean(expected_grads, axis=0), rtol=0, atol=1e-6)
    np.testing.assert_allclose(net.stats, np.mean(expected_stats, axis=0), rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="sync.deterministic_rows is 8, but each of the 1 ranks trains on 20 rows "
                                          "per step .*; expected a divisor of 20"):
        batch_stepper(0, net, one_rank(), 1, sync, 20)


@pytest.mark.parametrize("sections, message", [
    ({"sync": SyncConfig(mode="averaging", deterministic=True)}, "sync.mode is 'averaging', expected allreduce"),
    ({"sync": SyncConfig(compression="bf16", deterministic=True)}, "sync.compression is 'bf16', expected none"),
    ({"sync": SyncConfig(deterministic=True), "train": TrainConfig(accumulate=2)}, "train.accumulate is 2"),
    ({"sync": SyncConfig(deterministic=True), "pretrain": PretrainConfig(layers=[8])}, "pretrain.layers is"),
    ({"pretrain": PretrainConfig(layers=[8], sync=SyncConfig(deterministic=True))},
     "pretrain.sync.deterministic is True, expected false"),
])
def test_what_deterministic_sums_cannot_serve_is_refused_with_the_config(sections, message):
    config = Config(data=DataConfig(path="/d"), model=ModelConfig(layers=[{"type": "dense", "units": 2}]),
                    **sections)
    with pytest.raises(ConfigError, match=message):
        config.validate("run.yaml")


def test_the_numba_kernels_equal_their_references():
    rng = np.random.default_rng(4)
    kept = (rng.normal(size=(5, 1000)) * 10.0 ** rng.integers(-4, 4, (5, 1000))).astype(np.float32)
    kept[2, 7], kept[4, 9], kept[0, 11] = np.nan, -np.inf, np.inf
    scales = np.ldexp(1.0, rng.integers(20, 40, 1000))
    for kernel, reference, out in ((column_maxima, column_maxima_reference, np.empty(1000, np.float32)),
                                   (fixed_point_sum, fixed_point_sum_reference, np.empty(1000, np.int64))):
        expected = out.copy()
        arguments = (kept,) if kernel is column_maxima else (kept, scales)
        kernel(*arguments, out)
        reference(*arguments, expected)
        np.testing.assert_array_equal(out, expected)
    column_maxima(kept, maxima := np.empty(1000, np.float32))
    assert np.isinf(maxima[[7, 9, 11]]).all() and np.isfinite(np.delete(maxima, [7, 9, 11])).all()
