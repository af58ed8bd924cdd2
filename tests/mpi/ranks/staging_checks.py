"""Under mpiexec -n N: collectives staged through host buffers equal unstaged ones and count their copies.

    staging_checks.py BACKEND CONFIG

With `numpy` the staging runs on host buffers (the same code the GPU path runs, forced);
with `cupy` device buffers are staged for real (needs a GPU). The reference is always plain
numpy collectives. Ends with two real `train` runs of CONFIG, one with every collective
staged: same parameters, and the staged copies in metrics.jsonl and summary.json.
Prints one OK line per check on rank 0.
"""
import functools
import json
import os
import sys
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from mpitrain.config.sections import OptimizerConfig, SyncConfig, load_config
from mpitrain.nn.layers import Dense, Tanh
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator, StagedCommunicator
from mpitrain.parallel.launch import cuda_aware_mpi
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.training.loop import train

import common

name, config_path = sys.argv[1:3]
plain = Communicator(MPI.COMM_WORLD.Dup())
backend = create_backend(name, plain.local_rank, plain.local_size)
staged = StagedCommunicator(MPI.COMM_WORLD.Dup(), backend)
xp, rank, size = backend.xp, plain.rank, plain.size
report = functools.partial(common.report, plain)
exact = name == "numpy"  # device GEMMs round differently: cupy training is compared within float32 tolerance


def copies(run):
    """Run `run()`; return (staged copies, staged bytes, device->host, host->device) it made."""
    before = (staged.staged_copies, staged.staged_bytes, backend.transfers.to_host, backend.transfers.to_device)
    run()
    after = (staged.staged_copies, staged.staged_bytes, backend.transfers.to_host, backend.transfers.to_device)
    return tuple(a - b for a, b in zip(after, before))


rng = np.random.default_rng(rank)
data = rng.normal(size=1001).astype(np.float32)
expected = data.copy()
plain.allreduce_(expected)
buf = backend.to_device(data)
made = copies(lambda: staged.allreduce_(buf))
report("allreduce equals the unstaged sum", np.array_equal(backend.to_host(buf), expected))
report("allreduce copies once each way", made == (2, 2 * data.nbytes, 1, 1))

data = (np.arange(37, dtype=np.int64) + 1000 * rank)
expected = data.copy()
plain.bcast_(expected, root=size - 1)
buf = backend.to_device(data)
made = copies(lambda: staged.bcast_(buf, root=size - 1))
report("bcast equals the unstaged one", np.array_equal(backend.to_host(buf), expected))
report("bcast copies out on the root, in elsewhere",
       made == ((1, data.nbytes, 1, 0) if rank == size - 1 else (1, data.nbytes, 0, 1)))

message = np.arange(rank + 3, dtype=np.int32) * (rank + 1)
expected = plain.allgatherv(message)
received = []
made = copies(lambda: received.extend(staged.allgatherv(backend.to_device(message))))
total = sum(len(m) for m in expected) * 4
report("allgatherv equals the unstaged exchange",
       len(received) == size and all(np.array_equal(backend.to_host(r), e) for r, e in zip(received, expected)))
# host->device: the upload of the message itself, then the staged copy of all messages
report("allgatherv copies the message out and all messages in", made == (2, message.nbytes + total, 1, 2))

parts = np.arange(rank * 100, rank * 100 + 4 * size, dtype=np.int32)  # 4 values for each rank
counts = np.full(size, 4)
expected = plain.alltoallv(parts, counts)
received = []
made = copies(lambda: received.extend(staged.alltoallv(backend.to_device(parts), counts)))
report("alltoallv equals the unstaged exchange",
       all(np.array_equal(backend.to_host(r), e) and np.array_equal(e, np.arange(4) + 100 * source + 4 * rank)
           for source, (r, e) in enumerate(zip(received, expected))))
report("alltoallv copies the parts out and the received parts in", made == (2, 2 * parts.nbytes, 1, 2))

partner = rank ^ 1 if rank ^ 1 < size else None  # pairs (0, 1), (2, 3), ..; a last odd rank sends to no one
message = np.arange(rank * 10, rank * 10 + 5 + rank, dtype=np.int32)
inbox = np.full(16, -1, np.int32)
expected = plain.sendrecv(message, partner, inbox, partner)
out = backend.to_device(np.full(16, -1, np.int32))
arrived = []
made = copies(lambda: arrived.append(staged.sendrecv(backend.to_device(message), partner, out, partner)))
report("sendrecv equals the unstaged exchange",
       partner is None or (np.array_equal(backend.to_host(arrived[0]), expected)
                           and np.array_equal(expected, np.arange(partner * 10, partner * 10 + 5 + partner))
                           and (backend.to_host(out)[expected.size:] == -1).all()))  # only what arrived is copied
# host->device: the upload of the message, then the staged copy of what arrived
report("sendrecv copies the message out and what arrived in",
       partner is None or made == (2, message.nbytes + expected.nbytes, 1, 2))

report("host buffers are not staged on the GPU path", staged.stages(buf) and
       StagedCommunicator(plain.mpi, SimpleNamespace(on_gpu=True)).stages(np.zeros(1)) is False)
for setting, aware in (("auto", cuda_aware_mpi()), (True, True), (False, False)):
    on_gpu = plain.for_backend(SimpleNamespace(on_gpu=True), setting)
    on_cpu = plain.for_backend(SimpleNamespace(on_gpu=False), setting)
    report(f"cuda_aware {setting}: device buffers staged only without CUDA-aware MPI",
           on_gpu.cuda_aware == aware and on_gpu.staged == (not aware) and not on_cpu.staged)


def replica(comm, array_backend, mode):
    model = Sequential([Dense(9), Tanh(), Dense(3)], (5,), "softmax_cross_entropy", array_backend.xp)
    model.init_params(seed=3, scheme="xavier")
    updater = create_updater(OptimizerConfig(type="sgd", lr=0.1, momentum=0.9), model.params, model.decay_mask)
    config = SyncConfig(**mode)
    config = config.validate("test")
    sync = create_synchronizer(config, comm)
    sync.start(model, updater)
    return model, updater, sync


host = create_backend("numpy")
modes = [{"mode": "allreduce"}, {"mode": "averaging", "frequency": 2, "average_updater": True}]
modes += [{"mode": "sharing", "threshold": 1e-2, "exchange": exchange} for exchange in ("allgather", "split",
                                                                                          "recursive") if exact]
for mode in modes:
    replicas = [(replica(plain, host, mode), host), (replica(staged, backend, mode), backend)]
    for step in range(6):
        x, y = rng.normal(size=(8, 5)).astype(np.float32), rng.integers(0, 3, size=8).astype(np.int32)
        for (model, updater, sync), array_backend in replicas:
            model.train_batch(array_backend.to_device(x), array_backend.to_device(y))
            sync.step(model, updater)
    (reference, *_), _ = replicas[0]
    (model, *_), _ = replicas[1]
    params = backend.to_host(model.params)
    same = np.array_equal(params, reference.params) if exact else np.allclose(params, reference.params, rtol=1e-4,
                                                                              atol=1e-6)
    label = " ".join(mode[key] for key in ("mode", "exchange") if key in mode)
    report(f"{label}: staged training equals unstaged", same)


class Staged(Communicator):
    """With `forced`, every collective is staged, as a GPU behind a non-CUDA-aware MPI stages them."""

    def __init__(self, mpi_comm, forced: bool):
        super().__init__(mpi_comm)
        self.forced = forced

    def for_backend(self, array_backend, cuda_aware="auto", device_collectives="auto"):
        if self.forced:
            return StagedCommunicator(self.mpi, array_backend, cuda_aware=False)
        return super().for_backend(array_backend, cuda_aware, device_collectives)


summaries = {}
for forced in (False, True):
    run_dir = os.path.join(os.path.dirname(config_path), f"run-{'staged' if forced else 'plain'}")
    config = load_config(config_path, [f"run_dir={run_dir}", f"backend={name}"])
    summaries[forced] = train(config, Staged(MPI.COMM_WORLD.Dup(), forced))
    if forced and plain.is_root:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            windows = [record for record in map(json.loads, f) if record["kind"] == "window"]
        with open(os.path.join(run_dir, "summary.json")) as f:
            written = json.load(f)
        n_bytes = 4 * written["n_params"]
        ok = all(w["staged_copies_per_step"] == 2 and w["staged_bytes_per_step"] == 2 * n_bytes for w in windows)
        ok &= written["host_staging"] and written["staged_copies_per_step"] == 2
        ok &= written["transfers"]["to_host"] > 0 and written["backend"] == name
        report_ok = bool(windows) and ok
    else:
        report_ok = True
    report(f"{'staged' if forced else 'plain'} train run finished", report_ok)
plain_summary, staged_summary = summaries[False], summaries[True]
plain_copies = 0 if exact or cuda_aware_mpi() else 2  # cupy behind a non-CUDA-aware MPI stages anyway
report("a staged train run counts its copies and ends where the plain one does",
       plain_summary["staged_copies_per_step"] == plain_copies and staged_summary["staged_copies_per_step"] == 2
       and (plain_summary["replica_hashes"] == staged_summary["replica_hashes"] if exact
            else abs(plain_summary["test_loss"] - staged_summary["test_loss"]) < 1e-3))
