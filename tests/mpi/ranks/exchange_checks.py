"""Under mpiexec -n N: sharing's `split` and `recursive` exchanges against `allgather`, and `auto`'s choice, checked
on every rank.

(sharing_checks.py checks each exchange's own promises: identical replicas, nothing lost, resume.)
Each rank feeds the synchronizer its own updates (seeded by rank, some ranks dense enough for
a bitmap), so all exchanges see the same messages and differ only in how they add them:
- split and recursive agree with allgather to float tolerance, send the same elements and keep the
  same tau, on an odd size and on one with empty blocks; their replicas are bit-identical every step;
- their bytes per step, measured and as the cost model predicts them, stay within a dense
  ring Allreduce's 2(N-1)/N x 4n plus headers, also when every element is sent;
- recursive sends 2 log2 P' messages per rank (P' the largest power of two of N), 2 more on the
  ranks that fold into it and back, and none on the folded ranks beyond those 2;
- a NaN on one rank stops every rank with the same error, naming that rank;
- auto keeps allgather (bit for bit) with the default network, and with a slow link and dense
  sparse messages takes the exchange the cost model calls fastest (recursive: its counts are the
  fewest bytes), bit for bit the same as that exchange, alike on every rank.
Prints one OK line per check on rank 0.
"""
import numpy as np
from mpi4py import MPI

from mpitrain.base.errors import MpitrainError
from mpitrain.kernels.threshold import threshold_encode
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.costmodel import Network, recursive_exchange, split_exchange, split_header_bytes
from mpitrain.parallel.sync import check_replicas

from common import Fed, flat_model, report, sharing


class Counted(Communicator):
    """Counts the point-to-point messages this rank sends."""

    sends = 0

    def sendrecv(self, message, dest, out, source):
        self.sends += dest is not None
        return super().sendrecv(message, dest, out, source)


comm = Counted(MPI.COMM_WORLD.Dup())
DENSITY = [0.002, 0.3, 0.05, 1.0]  # of updates beyond tau, by rank: rank 1 and 3 send bitmaps under auto
TAU = 0.05
SUMMED = ("split", "recursive")  # the exchanges that sum on the way, against allgather


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


# 1: split and recursive against allgather on the same messages: odd n, float64, and n = 40 (blocks of 16, 16, 8
# and empty ones from 4 ranks)
for n, dtype in ((1001, np.float32), (1001, np.float64), (40, np.float32)):
    deltas = updates(n, 30, dtype)
    allgather, allgather_model, allgather_steps = run("allgather", deltas)
    for exchange in SUMMED if dtype == np.float32 else ("recursive",):
        summed, summed_model, summed_steps = run(exchange, deltas)
        same_messages = all(s["sent"] == a["sent"] > 0 and s["tau"] == a["tau"]
                            for (s, *_), (a, *_) in zip(summed_steps, allgather_steps))
        label = f"n={n}" + ("" if dtype == np.float32 else ", float64")
        report(comm, f"{exchange} and allgather agree to float tolerance ({label})",
               same_messages and summed.tau == allgather.tau and np.array_equal(summed.residual, allgather.residual)
               and np.allclose(summed_model.params, allgather_model.params, rtol=1e-5, atol=1e-6))
        report(comm, f"{exchange} keeps the replicas identical after every step ({label})",
               all(identical and m["exchange"] == exchange and m[f"{exchange}_steps"] == 1
                   for m, _, identical in summed_steps))

# 2: bytes per step within a dense ring Allreduce plus headers: sparse, bitmaps, every element as a sparse index
n = 5003
CASES = (("1% sparse", 0.01, "auto"), ("bitmaps", 0.5, "auto"), ("every element", 1.0, "sparse"))
MODELS = {"split": lambda network, sizes: split_exchange(network, sizes, n, 4),
          "recursive": lambda network, sizes: recursive_exchange(network, sizes, n)}
for name, density, encoding in CASES:
    deltas = updates(n, 5, density=density)
    if density == 1.0:  # every element beyond tau, every step
        deltas = [np.where(delta >= 0, 2 * TAU, -2 * TAU).astype(np.float32) for delta in deltas]
    first = threshold_encode(deltas[0].copy(), TAU, encoding)
    sizes = comm.allgather_counts(first.size) * 4
    for exchange in SUMMED:
        *_, steps = run(exchange, deltas, encoding=encoding, adaptive=False)
        predicted = MODELS[exchange](Network.of(1.0, 100.0), sizes)[1]
        report(comm, f"{exchange} sends no more than a ring allreduce plus headers ({name})",
               max(sent for _, sent, _ in steps) <= ring_bound(n) and predicted <= ring_bound(n))

# 3: recursive's messages per rank grow as log2 N: 2 log2 P' on the core ranks, 2 more where ranks fold in
core = 1 << (comm.size.bit_length() - 1)
extra = comm.size - core
folded, folding = comm.rank < 2 * extra and comm.rank % 2 == 0, comm.rank < 2 * extra and comm.rank % 2 == 1
before = comm.sends
*_, steps = run("recursive", updates(1001, 3))
expected = 1 if folded else 2 * (core.bit_length() - 1) + folding
report(comm, "recursive sends 2 log2 P' messages per rank per step (+1 folding, 1 when folded)",
       comm.sends - before == 3 * expected)

# 4: a NaN on the last rank stops every rank, in the same step, naming it
for exchange in ("split", "recursive", "auto"):
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

# 5: auto with the default network keeps allgather, bit for bit; a slow link and dense sparse messages make it take
# the exchange of the fewest bytes, recursive (its counts: 1 byte per element on up to 127 ranks)
deltas = updates(1001, 10)
(_, auto_model, auto_steps), (_, allgather_model, _) = run("auto", deltas), run("allgather", deltas)
report(comm, "auto keeps allgather with the default network, bit for bit",
       all(m["exchange"] == "allgather" and m["allgather_steps"] == 1 and m["split_steps"] == 0
           and m["recursive_steps"] == 0 for m, *_ in auto_steps)
       and np.array_equal(auto_model.params, allgather_model.params))
dense = updates(1001, 10, density=1.0)
slow = {"encoding": "sparse", "link_gbps": 0.001}
expected = "recursive" if comm.size >= 2 else "allgather"
(_, auto_model, auto_steps), (_, forced_model, _) = run("auto", dense, **slow), run(expected, dense, **slow)
choices = [m["exchange"] for m, *_ in auto_steps]
report(comm, "auto leaves allgather on a slow link with dense messages, alike on every rank",
       choices == [expected] * 10 and len(set(map(tuple, comm.allgather_obj(choices)))) == 1
       and all(m[f"{expected}_steps"] == 1 for m, *_ in auto_steps)
       and np.array_equal(auto_model.params, forced_model.params))
comm.barrier()
