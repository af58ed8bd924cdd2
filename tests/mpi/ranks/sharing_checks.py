"""Under mpiexec -n N: the `sharing` synchronizer's promises, checked on every rank.

    sharing_checks.py [EXCHANGE...]     # sync.exchange: allgather (the default), split, recursive or auto

- replicas bit-identical after every step;
- with a fixed tau and no clipping, sum over ranks of raw updates == sent + residuals
  (the parameters move by the mean of what was sent, so sent = N * applied);
- adaptive tau falls when too sparse and rises when too dense;
- one rank sparse and another bitmap in the same step decode to the exact expected sum;
- a checkpoint's merged residual is the ranks' mean, so the pending total is kept, and taking it
  leaves every rank's state alone; a resumed synchronizer starts every rank from it, or, on as
  many ranks, from each rank's own residual.
Prints one OK line per check and exchange on rank 0: `OK CHECK [EXCHANGE] N`.
"""
import functools
import sys

import numpy as np

from mpitrain.config.sections import OptimizerConfig
from mpitrain.nn.layers import Dense, Tanh
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import check_replicas, parameter_hash

import common

comm = Communicator()
summed = functools.partial(common.summed, comm)


class Recorded:
    """An updater whose deltas are summed on the side (the raw updates of this rank)."""

    def __init__(self, updater):
        self.updater, self.state, self.total = updater, updater.state, 0.0
        self.clip_norm = updater.clip_norm

    def delta(self, grads, params):
        delta = self.updater.delta(grads, params)
        self.total = self.total + delta
        return delta


def checks(exchange: str) -> None:
    """Every check with sync.exchange `exchange`, each reported as `OK CHECK [EXCHANGE] N`."""
    rng = np.random.default_rng(comm.rank)
    sharing = functools.partial(common.sharing, comm, exchange=exchange)

    def report(name, ok):
        common.report(comm, f"{name} [{exchange}]", ok)

    # 1 + 2: identical replicas after every step, and nothing lost with a fixed tau (float64 bookkeeping)
    model = Sequential([Dense(12), Tanh(), Dense(3)], (5,), "softmax_cross_entropy", np, "float64")
    model.init_params(seed=3, scheme="xavier")
    updater = Recorded(create_updater(OptimizerConfig(type="sgd", lr=0.2, momentum=0.5), model.params,
                                      model.decay_mask))
    sync = sharing(threshold=2.0 ** -8, adaptive=False, residual_clip=False)
    sync.start(model, updater)
    start = model.params.copy()
    identical, sent = True, 0
    for step in range(40):
        model.train_batch(rng.normal(size=(8, 5)), rng.integers(0, 3, size=8))
        sync.step(model, updater)
        sent += sync.metrics()["sent"]
        identical &= len(set(check_replicas(comm, model.params))) == 1
    report("replicas identical after every step", identical and sent > 0)
    applied = model.params - start
    report("nothing lost with a fixed tau",
           np.allclose(summed(updater.total), comm.size * applied + summed(sync.residual), rtol=0, atol=1e-12)
           and np.abs(sync.residual).max() > 0)  # some of it really was delayed

    # 2b: a checkpoint's merged residual keeps the pending total, as the ranks' mean, and changes no rank's state
    before = {name: array.copy() for name, array in sync.local_arrays(model, updater).items()}
    pending = summed(sync.residual)
    merged = sync.merged("sync/residual", sync.residual)
    report("the merged residual keeps the pending updates and every rank's state",
           all(np.array_equal(array, before[name]) for name, array in sync.local_arrays(model, updater).items())
           and merged is not sync.residual and len(set(check_replicas(comm, merged))) == 1
           and np.allclose(comm.size * merged, pending, rtol=0, atol=1e-15)
           and (comm.size == 1 or len(set(comm.allgather_obj(parameter_hash(sync.residual)))) > 1))  # own ones differ
    resumed = sharing(threshold=2.0 ** -8, adaptive=False, residual_clip=False)
    resumed.start(model, updater)
    saved = {"residual": merged.copy()} if comm.is_root else {}  # as rank 0 reads a checkpoint
    resumed.load_state({"tau": sync.tau, "steps": sync.steps}, saved)
    report("a resumed synchronizer starts every rank from the saved residual, tau and step count",
           np.array_equal(resumed.residual, merged) and np.abs(resumed.residual).max() > 0
           and (resumed.tau, resumed.steps) == (sync.tau, sync.steps))
    own = comm.gather_host(sync.residual)  # as a checkpoint keeps each rank's own (rank 0)
    resumed.load_rank_arrays(model, updater, {"sync/residual": own} if comm.is_root else {})
    report("on as many ranks each rank gets its own residual back", np.array_equal(resumed.residual, sync.residual))

    # 3: adaptive tau falls below the sparsity band, rises above it, stays inside it
    def one_step(delta, tau):
        flat = common.flat_model(np.zeros(delta.size, np.float32))
        sync = sharing(threshold=tau)
        updater = common.Fed([delta])
        sync.start(flat, updater)
        sync.step(flat, updater)
        return sync, flat


    decay = 0.965936
    in_band = np.zeros(1000, np.float32)
    in_band[:5] = 2.0
    report("adaptive tau falls when too sparse", one_step(np.full(1000, 1e-6, np.float32), 1.0)[0].tau == 1.0 * decay)
    report("adaptive tau rises when too dense", one_step(np.full(1000, 10.0, np.float32), 1.0)[0].tau == 1.0 / decay)
    sync, _ = one_step(in_band, 1.0)
    report("adaptive tau stays inside the band", sync.tau == 1.0 and sync.metrics()["sparsity"] == 0.005)


    # 4: mixed encodings in one step: even ranks send 3 elements (sparse), odd ranks all 64 (bitmap)
    def delta_of(rank, n=64, tau=0.5):
        delta = np.zeros(n, np.float32)
        if rank % 2 == 0:
            delta[[1, 17, 63]] = [1.5 * tau, -1.5 * tau, 0.75 * tau]
        else:
            delta[:] = np.where(np.arange(n) % 3 == 0, -1.25 * tau, 1.25 * tau)
        return delta


    mine = delta_of(comm.rank)
    sync, flat = one_step(mine, 0.5)
    expected = sum(np.where(np.abs(d) >= 0.5, np.sign(d) * 0.5, 0) for d in map(delta_of, range(comm.size))) / comm.size
    report("mixed sparse and bitmap messages decode exactly",
           np.array_equal(flat.params, expected.astype(np.float32))
           and np.array_equal(sync.residual, mine - np.where(np.abs(mine) >= 0.5, np.sign(mine) * 0.5, 0))
           and (comm.size == 1 or sync.metrics()["sent"] == sum(np.count_nonzero(np.abs(delta_of(r)) >= 0.5) for r in range(comm.size))))


for each in sys.argv[1:] or ["allgather"]:
    checks(each)
