"""The synchronizers on one rank (COMM_SELF), where each must leave the model exactly as no synchronizer would,
and the overlapped allreduce's buckets. Across ranks: tests/mpi/test_mpi.py and tests/mpi/ranks/*_checks.py."""
import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.config.sections import OptimizerConfig, SyncConfig
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.parallel.sync.buckets import gradient_buckets, layer_ranges

LAYOUT = [("00_dense/W", (784, 500)), ("00_dense/b", (500,)), ("01_dense/W", (500, 10)), ("01_dense/b", (10,))]


def one_rank():
    return Communicator(MPI.COMM_SELF).for_backend(create_backend("numpy"), False)


def trained(sync_config: SyncConfig, steps: int = 6, sync=None, end_epoch: bool = True) -> np.ndarray:
    """The parameters of a small MLP after `steps` momentum steps on fixed batches, synchronized by `sync_config`
    (or by `sync`, a synchronizer built before); without `end_epoch`, a run that stopped mid-epoch."""
    model = Sequential([Dense(8, activation="relu"), Dense(3)], (5,))
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(lr=0.1, momentum=0.9), model.params, model.decay_mask)
    sync = sync or create_synchronizer(sync_config, one_rank())
    sync.start(model, updater)
    rng = np.random.default_rng(1)
    for step in range(steps):
        x, y = rng.normal(size=(16, 5)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32)
        model.train_batch(x, y, key=(0, 0, 0, step), grads_ready=lambda start: sync.grads_ready(model, start))
        sync.step(model, updater)
    if end_epoch:
        sync.end_epoch(model, updater)
    return model.params.copy()


@pytest.mark.parametrize("config", [SyncConfig(mode="allreduce", overlap=True, bucket_mb=0),
                                    SyncConfig(mode="allreduce", overlap=False),
                                    SyncConfig(mode="averaging", frequency=2, average_updater=True)],
                         ids=["allreduce overlapped", "allreduce blocking", "averaging"])
def test_one_rank_trains_exactly_as_without_a_synchronizer(config):
    alone = trained(SyncConfig(mode="none"))
    assert np.array_equal(trained(config), alone)


@pytest.mark.parametrize("config", [SyncConfig(mode="sharing", threshold=0.01),
                                    SyncConfig(mode="averaging", frequency=4)], ids=["sharing", "averaging"])
def test_a_synchronizer_given_to_a_second_run_starts_it_as_a_new_one(config):
    config = config.validate("test")
    sync, fresh = create_synchronizer(config, one_rank()), create_synchronizer(config, one_rank())
    trained(config, steps=3, sync=sync, end_epoch=False)  # a first run that stopped mid-epoch
    assert numbers(sync) != numbers(fresh)  # its state (tau, steps since an averaging): not the second run's
    second = trained(config, steps=6, sync=sync, end_epoch=False)
    assert np.array_equal(second, trained(config, steps=6, sync=fresh, end_epoch=False))
    assert numbers(sync) == numbers(fresh)


def numbers(sync) -> dict:
    """The numbers of a synchronizer's checkpoint state (sharing's tau and steps, averaging's steps since one)."""
    return {name: value for name, value in sync.state().items() if not hasattr(value, "shape")}


@pytest.mark.parametrize("cap", [0, 4 * 5010, 1e6, 1e9])
def test_buckets_cover_the_buffer_once_in_whole_layers_from_its_end(cap):
    buckets = gradient_buckets(LAYOUT, cap, itemsize=4)
    assert buckets[0][1] == 784 * 500 + 500 + 5010 and buckets[-1][0] == 0
    assert all(a[0] == b[1] for a, b in zip(buckets, buckets[1:]))  # contiguous, tail first
    layer_edges = {edge for r in layer_ranges(LAYOUT) for edge in r}
    assert all(start in layer_edges and stop in layer_edges for start, stop in buckets)
    assert all((stop - start) * 4 <= cap or start in {s for s, _ in layer_ranges(LAYOUT)} and
               sum(1 for s, t in layer_ranges(LAYOUT) if start <= s < stop) == 1 for start, stop in buckets)
    assert len(buckets) == {0: 2, 4 * 5010: 2, 1e6: 2, 1e9: 1}[cap]
