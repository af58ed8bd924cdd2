"""Under mpiexec -n N: sharing's `split` exchange against `allgather`, and `auto`'s choice, checked on every rank.

(sharing_checks.py split checks split's own promises: identical replicas, nothing lost, resume.)
Each rank feeds the synchronizer its own updates (seeded by rank, some ranks dense enough for
a bitmap), so both exchanges see the same messages and differ only in how they add them:
- split and allgather agree to float tolerance, send the same elements and keep the same tau,
  on an odd size and on one with empty blocks; split's replicas are bit-identical every step;
- split's bytes per step, measured and as the cost model predicts them, stay within a dense
  ring Allreduce's 2(N-1)/N x 4n plus headers, also when every element is sent;
- a NaN on one rank stops every rank with the same error, naming that rank;
- auto keeps allgather (bit for bit) with the default network, and with a slow link and dense
  sparse messages splits from 3 ranks on (bit for bit the same as split), alike on every rank.
Prints one OK line per check on rank 0.
"""
import numpy as np
from mpi4py import MPI

from common import Fed, flat_model, report, sharing
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.costmodel import Network, split_exchange, split_header_bytes
from mpitrain.errors import MpitrainError
from mpitrain.kernels.threshold import threshold_encode
from mpitrain.parallel.sync import check_replicas

comm = Communicator(MPI.COMM_WORLD.Dup())
DENSITY = [0.002, 0.3, 0.05, 1.0]  # of updates beyond tau, by rank: rank 1 and 3 send bitmaps under auto
TAU = 0.05


def updates(n, steps, dtype=np.float32, density=None, seed=0):
    """This rank's update for each step: about `density` of the elements beyond tau, the rest well inside."""
    rng = np.random.default_rng([seed, comm.rank])
    density = DENSITY[comm.rank % len(DENSITY)] if density is None else density
    return [np.where(rng.random(n) < density, rng.normal(0, 3 * TAU, n), rng.normal(0, 0.1 * TAU, n)).astype(dtype)
            for _ in range(steps)]


def run(exchange, deltas, **options):
    """sharing with `exchange`, fed `deltas` from the same start on every rank. Returns the synchronizer, the
    model, and per step: its metrics, the bytes sent and whether the replicas were identical after it."""
    model = flat_model(np.random.default_rng(7).normal(size=deltas[0].size).astype(deltas[0].dtype))
    sync, updater = sharing(comm, threshold=TAU, exchange=exchange, **options), Fed(deltas)
    sync.start(model, updater)
    steps = []
    for _ in deltas:
        before = comm.bytes_sent
        sync.step(model, updater)
        steps.append((sync.metrics(), comm.bytes_sent - before, len(set(check_replicas(comm, model.params))) == 1))
    return sync, model, steps


def ring_bound(n, itemsize=4):
    return 2 * (comm.size - 1) / comm.size * itemsize * n + split_header_bytes(comm.size)


# 1: split against allgather on the same messages: odd n, and n = 40 (blocks of 16, 16, 8 and empty ones from 4 ranks)
for n in (1001, 40):
    deltas = updates(n, 30)
    split, split_model, split_steps = run("split", deltas)
    allgather, allgather_model, allgather_steps = run("allgather", deltas)
    same_messages = all(s["sent"] == a["sent"] > 0 and s["tau"] == a["tau"]
                        for (s, *_), (a, *_) in zip(split_steps, allgather_steps))
    report(comm, f"split and allgather agree to float tolerance (n={n})",
           same_messages and split.tau == allgather.tau and np.array_equal(split.residual, allgather.residual)
           and np.allclose(split_model.params, allgather_model.params, rtol=1e-5, atol=1e-6))
    report(comm, f"split keeps the replicas identical after every step (n={n})",
           all(identical and m["exchange"] == "split" for m, _, identical in split_steps))

# 2: bytes per step within a dense ring Allreduce plus headers: sparse, bitmaps, every element as a sparse index
n = 5003
CASES = (("1% sparse", 0.01, "auto"), ("bitmaps", 0.5, "auto"), ("every element", 1.0, "sparse"))
for name, density, encoding in CASES:
    deltas = updates(n, 5, density=density)
    if density == 1.0:  # every element beyond tau, every step
        deltas = [np.where(delta >= 0, 2 * TAU, -2 * TAU).astype(np.float32) for delta in deltas]
    *_, steps = run("split", deltas, encoding=encoding, adaptive=False)
    first = threshold_encode(deltas[0].copy(), TAU, encoding)
    predicted = split_exchange(Network.of(1.0, 100.0), comm.allgather_counts(first.size) * 4, n, 4)[1]
    report(comm, f"split sends no more than a ring allreduce plus headers ({name})",
           max(sent for _, sent, _ in steps) <= ring_bound(n) and predicted <= ring_bound(n))

# 3: a NaN on the last rank stops every rank, in the same step, naming it
for exchange in ("split", "auto"):
    deltas = updates(300, 4)
    if comm.rank == comm.size - 1:
        deltas[2][17] = np.nan
    try:
        run(exchange, deltas)
        error = "no error"
    except MpitrainError as e:
        error = str(e)
    errors = comm.allgather_obj(error)
    report(comm, f"a NaN on one rank stops every rank ({exchange})",
           len(set(errors)) == 1 and f"the update of rank {comm.size - 1} holds NaN after 3 sharing steps" in error)

# 4: auto with the default network keeps allgather, bit for bit; a slow link and dense sparse messages make it split
deltas = updates(1001, 10)
(_, auto_model, auto_steps), (_, allgather_model, _) = run("auto", deltas), run("allgather", deltas)
report(comm, "auto keeps allgather with the default network, bit for bit",
       all(m["exchange"] == "allgather" and m["allgather_steps"] == 1 and m["split_steps"] == 0 for m, *_ in auto_steps)
       and np.array_equal(auto_model.params, allgather_model.params))
dense = updates(1001, 10, density=1.0)
slow = {"encoding": "sparse", "link_gbps": 0.001}
expected = "split" if comm.size >= 3 else "allgather"  # 2 ranks: allgather's bytes are never more than split's
(_, auto_model, auto_steps), (_, forced_model, _) = run("auto", dense, **slow), run(expected, dense, **slow)
choices = [m["exchange"] for m, *_ in auto_steps]
report(comm, "auto splits on a slow link with dense messages from 3 ranks on, alike on every rank",
       choices == [expected] * 10 and len(set(map(tuple, comm.allgather_obj(choices)))) == 1
       and all(m[f"{expected}_steps"] == 1 for m, *_ in auto_steps)
       and np.array_equal(auto_model.params, forced_model.params))
comm.barrier()
