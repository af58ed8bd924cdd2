"""Under mpiexec -n N: allreduce with batch b per rank equals one process with batch N*b.

Each rank takes its slice of the same global batch; a serial model on COMM_SELF trains on
the whole global batch. Prints OK on rank 0 when all ranks agree the parameters match.
Arguments: the optimizer type, and a `train.clip_norm` (default 0): with one, both clip, and
they agree only if allreduce clips the averaged gradient (the whole batch's), not each rank's.
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

optimizer = sys.argv[1] if len(sys.argv) > 1 else "sgd"
clip_norm = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
world, alone = Communicator(), Communicator(MPI.COMM_SELF)
b, steps, classes = 8, 12, 4


def replica(comm, mode):
    model = Sequential([Dense(10), ReLU(), Dense(classes)], (6,), "softmax_cross_entropy", np, "float64")
    model.init_params(seed=5, scheme="xavier")
    updater = create_updater(OptimizerConfig(type=optimizer, lr=0.05, momentum=0.9, l2=1e-3), model.params,
                             model.decay_mask, clip_norm)
    sync = create_synchronizer(SyncConfig(mode=mode), comm)
    sync.start(model, updater)
    return model, updater, sync


parallel, serial = replica(world, "allreduce"), replica(alone, "none")
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
moved = not np.allclose(parallel[0].params, replica(alone, "none")[0].params)
if world.mpi.allreduce(int(ok and moved), op=MPI.MIN) and world.is_root:
    print("OK", world.size, optimizer, *sys.argv[2:])
