"""Under mpiexec -n N: allreduce with batch b per rank equals one process with batch N*b.

Each rank takes its slice of the same global batch; a serial model on COMM_SELF trains on
the whole global batch. Prints `OK N CASE` on rank 0 for each case whose parameters all ranks agree match.
Arguments: the cases, each an optimizer type, or TYPE:CLIP with a `train.clip_norm` (default 0): with one, both
clip, and they agree only if allreduce clips the averaged gradient (the whole batch's), not each rank's.

    mpiexec -n N python allreduce_equivalence.py sgd adam sgd:0.05
"""
import sys

import numpy as np
from mpi4py import MPI

from mpitrain.config.sections import OptimizerConfig, SyncConfig
from mpitrain.nn.layers import Dense, ReLU
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer

world, alone = Communicator(), Communicator(MPI.COMM_SELF)
b, steps, classes = 8, 12, 4


def replica(comm, mode, optimizer, clip_norm):
    model = Sequential([Dense(10), ReLU(), Dense(classes)], (6,), "softmax_cross_entropy", np, "float64")
    model.init_params(seed=5, scheme="xavier")
    updater = create_updater(OptimizerConfig(type=optimizer, lr=0.05, momentum=0.9, l2=1e-3), model.params,
                             model.decay_mask, clip_norm)
    sync = create_synchronizer(SyncConfig(mode=mode), comm)
    sync.start(model, updater)
    return model, updater, sync


def check(optimizer: str, clip_norm: float) -> bool:
    """Whether allreduce on every rank ended where the serial model on the whole batch did (and moved)."""
    parallel, serial = (replica(world, "allreduce", optimizer, clip_norm),
                        replica(alone, "none", optimizer, clip_norm))
    rng = np.random.default_rng(0)
    clipped = True  # every step's whole-batch gradient was above clip_norm (always, without one)
    for _ in range(steps):
        x = rng.normal(size=(world.size * b, 6))
        y = rng.integers(0, classes, size=world.size * b)
        mine = slice(world.rank * b, (world.rank + 1) * b)
        for (model, updater, sync), (xs, ys) in ((parallel, (x[mine], y[mine])), (serial, (x, y))):
            model.train_batch(xs, ys)
            clipped &= model is parallel[0] or np.linalg.norm(model.grads) > clip_norm
            sync.step(model, updater)
    ok = clipped and np.allclose(parallel[0].params, serial[0].params, rtol=1e-9, atol=1e-12)
    return ok and not np.allclose(parallel[0].params, replica(alone, "none", optimizer, clip_norm)[0].params)


for case in sys.argv[1:]:
    optimizer, _, clip = case.partition(":")
    if world.mpi.allreduce(int(check(optimizer, float(clip or 0.0))), op=MPI.MIN) and world.is_root:
        print("OK", world.size, case, flush=True)
