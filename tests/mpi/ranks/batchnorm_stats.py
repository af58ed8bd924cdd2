"""Under mpiexec -n N: batch-norm running statistics differ per rank while training on each
rank's own rows, and every mode that keeps one model makes them the ranks' mean (identical
on all ranks) at the epoch end; averaging does so at each parameter averaging too.
Prints one OK line per mode on rank 0.
"""
import numpy as np
from mpi4py import MPI

from mpitrain.config.sections import OptimizerConfig, SyncConfig
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import Conv2D
from mpitrain.nn.layers import Dense, Flatten
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer, parameter_hash

comm = Communicator()


def check(name, ok):
    ok = bool(comm.mpi.allreduce(int(bool(ok)), op=MPI.MIN))
    assert ok, name
    if comm.is_root:
        print("OK", name, comm.size, flush=True)


for mode, options in [("allreduce", {}), ("averaging", {"frequency": 2}), ("sharing", {"threshold": 1e-3})]:
    config = SyncConfig(mode=mode, **options)
    config = config.validate("test")
    model = Sequential([Conv2D(3, 3), BatchNorm(), Flatten(), Dense(2)], (1, 5, 5), "softmax_cross_entropy", np)
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(lr=0.01), model.params, model.decay_mask)
    sync = create_synchronizer(config, comm)
    sync.start(model, updater)
    rng = np.random.default_rng(comm.rank)  # each rank its own rows
    for step in range(3):  # averaging (frequency 2) averages after step 2, then one more local step
        x = rng.normal(comm.rank, 1, size=(8, 1, 5, 5)).astype(np.float32)
        model.train_batch(x, rng.integers(0, 2, size=8), key=(0, comm.rank, 0, step))
        sync.step(model, updater)
    local = model.stats.copy()
    stats = comm.allgather_obj(local)
    check(f"{mode}: statistics differ per rank before the epoch end", len({s.tobytes() for s in stats}) == comm.size)
    sync.end_epoch(model, updater)
    check(f"{mode}: statistics are the ranks' mean after it", np.allclose(model.stats, np.mean(stats, axis=0),
                                                                             rtol=1e-6))
    check(f"{mode}: identical on every rank", len(set(comm.allgather_obj(parameter_hash(model.stats)))) == 1)
