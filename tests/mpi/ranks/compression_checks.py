"""Under mpiexec -n N: `sync.compression` (bf16, fp16) for `allreduce` and `averaging`.

The compressed mean of random buffers (sizes that do not divide by the ranks, one smaller than the ranks, values
over many scales) is the same on every rank and within the codec's rounding of the float64 mean; an MLP trained 6
steps under each codec keeps identical replicas, stays within the codec's rounding of the uncompressed run, and
sends fewer than 0.6 of its bytes; averaging (every 2 steps) keeps identical replicas after each averaging, near
the uncompressed one; overlapped by layer (every bucket posted during backward, also staged through host buffers)
bf16 equals its blocking run bit for bit, fp16 within 1e-3; powersgd of rank 1 and 2 keeps identical replicas on
fewer than half the bytes, and averages parameters too. Prints one OK line per check on rank 0.
"""
import numpy as np
from mpi4py import MPI

from mpitrain.config.sections import OptimizerConfig, SyncConfig
from mpitrain.nn.layers import Dense, Flatten
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator, StagedCommunicator
from mpitrain.parallel.sync import check_replicas, create_synchronizer
from mpitrain.parallel.sync.compression import COMPRESSIONS, compressed_mean_

from common import report as agreed

world = Communicator(MPI.COMM_WORLD.Dup())
ROUNDING = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -9}  # of the largest value: two roundings and the sum's


def report(check, ok):
    agreed(world, check, ok)


for name, codec in COMPRESSIONS.items():
    for size in (1, world.size + 3, 1001):
        rng = np.random.default_rng([size, world.rank])
        mine = (rng.normal(size=size) * 10.0 ** rng.integers(-6, 3, size)).astype(np.float32)
        everyone = np.array(world.mpi.allgather(mine), np.float64)
        buf = mine.copy()
        compressed_mean_(world, buf, codec())
        error = np.abs(buf - everyone.mean(axis=0)).max() / np.abs(everyone).max()
        check_replicas(world, buf)
        report(f"{name}: the compressed mean of {size} values is every rank's, within {ROUNDING[name]:g} of the "
               f"largest", error <= ROUNDING[name])


def trained(mode, compression, steps=6, comm=world, **options):
    model = Sequential([Flatten(), Dense(32, activation="relu"), Dense(16, activation="relu"), Dense(4)], (2, 5),
                       "softmax_cross_entropy", np)
    model.init_params(seed=3, scheme="he")
    updater = create_updater(OptimizerConfig(type="sgd", lr=0.05, momentum=0.9), model.params, model.decay_mask)
    sync = create_synchronizer(SyncConfig(mode=mode, compression=compression, **options).validate("test"), comm)
    sync.start(model, updater)
    rng = np.random.default_rng(world.rank)
    identical_after_averaging, posted_in_backward = True, True
    for step in range(steps):
        x, y = rng.normal(size=(8, 2, 5)).astype(np.float32), rng.integers(0, 4, 8).astype(np.int32)
        model.train_batch(x, y, key=(0, world.rank, 0, step), grads_ready=lambda start: sync.grads_ready(model, start))
        if mode == "allreduce" and sync.options.overlap:
            posted_in_backward &= len(sync.posted) == len(sync.buckets)
        sync.step(model, updater)
        if mode == "averaging" and sync.steps_since_average == 0:
            hashes = world.allgather_obj(model.params.tobytes())
            identical_after_averaging &= len(set(hashes)) == 1
    return model, comm.bytes_sent, identical_after_averaging, posted_in_backward


exact, exact_bytes, *_ = trained("allreduce", "none", overlap=False)
for name in COMPRESSIONS:
    world.bytes_sent = 0
    model, sent, *_ = trained("allreduce", name, overlap=False)
    check_replicas(world, model.params)
    drift = np.abs(model.params - exact.params).max() / np.abs(exact.params).max()
    report(f"allreduce {name}: replicas identical, parameters within 1e-2 of float32's ({drift:.1e})", drift < 1e-2)
    report(f"allreduce {name}: {sent / exact_bytes:.2f} of float32's bytes", sent < 0.6 * exact_bytes)
    staged = StagedCommunicator(MPI.COMM_WORLD.Dup(), create_backend("numpy"))
    for where, comm in (("", world), (", staged through host buffers", staged)):
        overlapped, _, _, posted = trained("allreduce", name, comm=comm, overlap=True, bucket_mb=0.0)
        check_replicas(world, overlapped.params)
        gap = np.abs(overlapped.params - model.params).max() / np.abs(model.params).max()
        same = gap == 0 if name == "bf16" else gap < 1e-3  # bf16 rounds each value alone; fp16 scales per message
        report(f"allreduce {name} overlapped by layer{where}: every bucket posted in backward, replicas identical, "
               f"{'equal to' if name == 'bf16' else 'within 1e-3 of'} blocking ({gap:.1e})", posted and same)
for rank in (1, 2):
    world.bytes_sent = 0
    model, sent, *_ = trained("allreduce", "powersgd", overlap=False, powersgd_rank=rank)
    check_replicas(world, model.params)
    drift = np.abs(model.params - exact.params).max() / np.abs(exact.params).max()
    report(f"allreduce powersgd rank {rank}: replicas identical, {sent / exact_bytes:.2f} of float32's bytes, "
           f"parameters within 0.2 of float32's ({drift:.1e})", sent < 0.5 * exact_bytes and drift < 0.2)
    overlapped, _, _, posted = trained("allreduce", "powersgd", overlap=True, bucket_mb=0.0, powersgd_rank=rank)
    check_replicas(world, overlapped.params)
    gap = np.abs(overlapped.params - model.params).max() / np.abs(model.params).max()
    same = gap == 0 if world.size == 2 else gap < 1e-5  # beyond 2 ranks MPI may sum a bucket in another order
    report(f"allreduce powersgd rank {rank} overlapped by layer: every bucket posted in backward, replicas "
           f"identical, {'equal to' if world.size == 2 else 'within 1e-5 of'} blocking ({gap:.1e})", posted and same)
averaged, *_ = trained("averaging", "none", frequency=2)
for name in (*COMPRESSIONS, "powersgd"):
    model, _, identical, _ = trained("averaging", name, frequency=2)
    drift = np.abs(model.params - averaged.params).max() / np.abs(averaged.params).max()
    bound = 0.2 if name == "powersgd" else 1e-2
    report(f"averaging {name}: replicas identical after every averaging, within {bound:g} of float32's "
           f"({drift:.1e})", identical and drift < bound)
