"""Under mpiexec -n N: `distributed_metrics` in the histogram mode (forced by max_rows=0) against the exact mode, on
every target kind, the rows cut unevenly over the ranks and rank 1 without any (from 3 ranks on):
- every figure but AUC and average precision equals the exact mode's (to 1e-12, relative or absolute: the sums
  differ in their rounding), on every rank alike;
- each AUC lies within the bound the result reports and within the module docstring's measured 1e-6 of the exact;
- a bad label on the last rank is the same error on every rank, and none is left waiting.
Prints one OK line per check on rank 0.
"""
import numpy as np
from mpi4py import MPI

from mpitrain.base.errors import MpitrainError
from mpitrain.parallel.comm import Communicator
from mpitrain.testing.score_distributions import noisy_click_model
from mpitrain.training.distributed_scores import distributed_metrics

from common import report

comm = Communicator(MPI.COMM_WORLD.Dup())
N = 200_000
HISTOGRAM_KEYS = {"auc", "auc_macro", "average_precision", "average_precision_macro", "auc_mode", "auc_bins",
                  "auc_error_bound"}


def data(kind: str):
    """The same rows of `kind` on every rank: click-through scores with ties (binary, multilabel), class
    probabilities rounded to 3 decimals, regression targets with a large mean."""
    rng = np.random.default_rng(7)
    if kind == "regression":
        targets = rng.normal(size=(N, 2)) * [100.0, 1.0] + [1e4, 0.0]
        return targets, targets + rng.normal(size=targets.shape)
    if kind == "class":
        labels = rng.choice(4, size=N, p=[0.7, 0.2, 0.09, 0.01])
        weights = rng.gamma(1 + 3 * np.eye(4)[labels])  # Dirichlet rows leaning to the true class
        return labels, np.round(weights / weights.sum(axis=1, keepdims=True), 3)
    drawn = [noisy_click_model(rng, N) for _ in range(2 if kind == "multilabel" else 1)]
    labels = np.stack([d[0] for d in drawn], axis=1)
    scores = np.round(np.stack([d[1] for d in drawn], axis=1), 6)  # ties, and several distinct scores in a bin
    return (labels[:, 0], scores[:, 0]) if kind == "binary" else (labels, scores)


def mine(array):
    """This rank's rows: uneven cuts, none for rank 1 when there are 3 ranks or more."""
    cuts = np.linspace(0, N, comm.size + 1).astype(int)
    cuts[1:] = np.maximum(cuts[1:], int(0.1 * N))
    if comm.size >= 3:
        cuts[2] = cuts[1]
    return array[cuts[comm.rank]:cuts[comm.rank + 1]]


def agreed(value) -> bool:
    """Whether every rank holds the same `value` (compared on its repr)."""
    return len({repr(v) for v in comm.allgather_obj(value)}) == 1


for kind in ("class", "binary", "multilabel", "regression"):
    labels, scores = data(kind)
    exact = distributed_metrics(comm, kind, mine(labels), mine(scores))
    histogram = distributed_metrics(comm, kind, mine(labels), mine(scores), max_rows=0)
    same = all(np.allclose(np.array(histogram[key], dtype=float), np.array(exact[key], dtype=float),
                           rtol=1e-12, atol=1e-12) for key in set(exact) - HISTOGRAM_KEYS)
    report(comm, f"{kind}: the histogram mode's other figures are the exact mode's",
           same and histogram["rows"] == N and agreed(histogram) and exact.get("auc_mode", "exact") == "exact")
    if kind != "regression":
        auc, bound = (np.atleast_1d(np.array(m, dtype=float)) for m in (histogram["auc"], histogram["auc_error_bound"]))
        error = np.abs(auc - np.atleast_1d(np.array(exact["auc"], dtype=float)))
        report(comm, f"{kind}: each AUC within its bound and 1e-6 of the exact",
               histogram["auc_mode"] == "histogram" and (error <= np.minimum(bound, 1e-6)).all())

labels, scores = data("binary")
try:
    distributed_metrics(comm, "binary", mine(labels) + 2 * (comm.rank == comm.size - 1), mine(scores), max_rows=0)
    message = None
except MpitrainError as e:
    message = str(e)
report(comm, "a bad label on the last rank is one error on every rank",
       message is not None and f"(seen on rank {comm.size - 1})" in message and agreed(message))
comm.barrier()
