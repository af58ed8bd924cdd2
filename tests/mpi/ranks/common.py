"""What the check scripts under mpiexec share: a check every rank agrees on, sums over ranks, a sharing
synchronizer, and a bare flat model to drive one with."""
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from mpitrain.base.workspace import Workspace
from mpitrain.config.sections import SyncConfig
from mpitrain.parallel.sync import create_synchronizer


def report(comm, name, ok):
    """All ranks agree whether `ok` holds everywhere (so a failing rank leaves none waiting); rank 0 prints OK."""
    ok = bool(comm.mpi.allreduce(int(bool(ok)), op=MPI.MIN))
    assert ok, name
    if comm.is_root:
        print("OK", name, comm.size, flush=True)


def summed(comm, array):
    """The ranks' `array` summed in float64, on every rank."""
    total = np.array(array, dtype=np.float64)
    comm.allreduce_(total)
    return total


def sharing(comm, **options):
    """A `sharing` synchronizer of these options (validated) on `comm`."""
    config = SyncConfig(mode="sharing", **options)
    config = config.validate("test")
    return create_synchronizer(config, comm)


def flat_model(params):
    """The flat-buffer contract and nothing else: `params`, zero gradients, no running statistics, no sharded
    tables, a workspace."""
    return SimpleNamespace(params=params, grads=np.zeros_like(params), xp=np, n_params=params.size,
                           stats=np.zeros(0, params.dtype), sharded_tables=[], workspace=Workspace(np))


class Fed:
    """An updater without state that returns the given updates in turn (clipping none: `clip_norm` 0)."""

    clip_norm = 0.0

    def __init__(self, deltas):
        self.deltas, self.state = iter(deltas), np.zeros(0)

    def delta(self, grads, params):
        return next(self.deltas)
