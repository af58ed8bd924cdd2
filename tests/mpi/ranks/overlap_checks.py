"""Under mpiexec -n N: overlapped `allreduce` (buckets posted during backward) equals blocking `allreduce`.

For each model (an MLP; a conv net with batch norm and dropout) and bucket cap (one bucket larger
than the buffer, one per layer, the default, one smaller than a layer), two replicas train on
the same batches, one overlapped and one blocking: their parameters must be bit-identical at
2 ranks (within float rounding beyond: MPI may add in another order), the replicas identical
across ranks, every bucket but the last posted before backward ended, and batch norm's running statistics,
averaged at the epoch's end, equal. The last check stages every bucket through host buffers
(the path a GPU behind a non-CUDA-aware MPI takes). Prints one OK line per check on rank 0.
"""
import numpy as np
from mpi4py import MPI

from mpitrain.config.sections import OptimizerConfig, SyncConfig
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import Conv2D, MaxPool2D
from mpitrain.nn.layers import Dense, Dropout, Flatten, ReLU
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator, StagedCommunicator
from mpitrain.parallel.sync import check_replicas, create_synchronizer

from common import report as agreed

world = Communicator(MPI.COMM_WORLD.Dup())
exact = world.size == 2


def report(check, ok):
    agreed(world, check, ok)


MODELS = {
    "mlp": (lambda: [Flatten(), Dense(40, activation="relu"), Dense(30, activation="relu"), Dense(4)], (2, 3, 3)),
    "bn-cnn": (lambda: [Conv2D(4, 3, padding="same"), BatchNorm(), ReLU(), MaxPool2D(2), Dropout(0.25), Flatten(),
                        Dense(4)], (1, 6, 6)),
}


def replica(comm, name, overlap, bucket_mb):
    layers, shape = MODELS[name]
    model = Sequential(layers(), shape, "softmax_cross_entropy", np)
    model.init_params(seed=7, scheme="he")
    updater = create_updater(OptimizerConfig(type="sgd", lr=0.05, momentum=0.9, l2=1e-3), model.params,
                             model.decay_mask)
    config = SyncConfig(mode="allreduce", overlap=overlap, bucket_mb=bucket_mb)
    config = config.validate("test")
    sync = create_synchronizer(config, comm)
    sync.start(model, updater)
    return model, updater, sync


def train(replicas, steps=5):
    """The same batches for every replica; returns, per replica, whether all buckets but the last (reduced by a
    blocking Allreduce in `step`) were posted in backward."""
    rng = np.random.default_rng(world.rank)
    posted_in_backward = [True] * len(replicas)
    for step in range(steps):
        shape = MODELS[replicas[0][3]][1]
        x = rng.normal(size=(6, *shape)).astype(np.float32)
        y = rng.integers(0, 4, size=6).astype(np.int32)
        for i, (model, updater, sync, _) in enumerate(replicas):
            model.train_batch(x, y, key=(0, world.rank, 0, step), grads_ready=lambda start, m=model, s=sync:
                              s.grads_ready(m, start))
            if sync.config.overlap:
                posted_in_backward[i] &= len(sync.posted) == len(sync.buckets) - 1
            sync.step(model, updater)
    for model, updater, sync, _ in replicas:
        sync.end_epoch(model, updater)
    return posted_in_backward


def same(a, b):
    return np.array_equal(a, b) if exact else np.allclose(a, b, rtol=1e-5, atol=1e-7)


for name in MODELS:
    n_params = replica(world, name, False, 1.0)[0].n_params
    caps = {"one bucket larger than the buffer": 1.0, "one bucket per layer": 0.0,
            "buckets smaller than a layer": 4 * n_params / 3 / 1e6}
    for what, cap in caps.items():
        blocking = (*replica(world, name, False, cap), name)
        overlapped = (*replica(world, name, True, cap), name)
        posted = train([blocking, overlapped])
        sync = overlapped[2]
        report(f"{name}, {what} ({len(sync.buckets)}): overlapped equals blocking",
               same(blocking[0].params, overlapped[0].params) and same(blocking[0].stats, overlapped[0].stats))
        report(f"{name}, {what}: every bucket but the last posted during backward", posted[1])
        check_replicas(world, overlapped[0].params, overlapped[0].stats)
        report(f"{name}, {what}: replicas identical", True)
    layer_sizes = [sum(p.size for p in layer.params.values()) for layer in overlapped[0].layers if layer.params]
    report(f"{name}: a cap beyond the buffer gives 1 bucket, 0 one per layer, and some layer exceeds the small cap",
           len(replica(world, name, True, 1.0)[2].buckets) == 1
           and len(replica(world, name, True, 0.0)[2].buckets) == len(layer_sizes)
           and max(layer_sizes) * 4 > caps["buckets smaller than a layer"] * 1e6)

staged = StagedCommunicator(MPI.COMM_WORLD.Dup(), create_backend("numpy"))
blocking = (*replica(world, "bn-cnn", False, 0.0), "bn-cnn")
overlapped = (*replica(staged, "bn-cnn", True, 0.0), "bn-cnn")
copies = staged.staged_copies
train([blocking, overlapped], steps=3)
report("staged buckets equal blocking, with two copies per bucket per step",
       same(blocking[0].params, overlapped[0].params) and staged.staged_copies - copies
       == 3 * 2 * len(overlapped[2].buckets) + 2 * (overlapped[0].stats.size > 0))
