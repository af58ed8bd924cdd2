"""mpitrain.training.distributed_scores over ranks simulated by threads in one process: the exact mode's gather and
metrics, and the histogram mode: its grid, its AUC and average precision those of the binned scores, its measured
error against scikit-learn on 10^6 rows of realistic scores (the figures its docstring gives), every other figure
equal to the exact mode's, a rank without rows, and errors raised on every rank. (Under mpiexec:
tests/mpi/test_scores.py.)"""
import threading
import warnings
from fractions import Fraction

import numpy as np
import pytest
from sklearn import metrics as sk

from mpitrain.base.errors import MpitrainError
from mpitrain.testing.score_distributions import DISTRIBUTIONS
from mpitrain.training.distributed_scores import (
    _BIN_EDGES,
    HISTOGRAM_BINS,
    distributed_metrics,
    gather_predictions,
    score_bins,
)
from mpitrain.training.scores import Ranking, target_metrics

AUC_ERROR, AVERAGE_PRECISION_ERROR = 1e-6, 1e-5  # the histogram mode's largest errors the module docstring states
HISTOGRAM_KEYS = ("auc", "auc_macro", "average_precision", "average_precision_macro", "auc_mode")


@pytest.fixture(autouse=True)
def quiet_sklearn():
    with warnings.catch_warnings():  # sklearn warns of undefined metrics
        warnings.simplefilter("ignore")
        yield


def kind_data(kind, rng, n=3000):
    """Labels and scores (or targets and predictions) of `kind`, with ties, a column of one label value, and
    continuous scores."""
    if kind == "class":
        labels = rng.choice(4, size=n, p=[0.6, 0.3, 0.1, 0.0])  # class 3 absent: its AUC and AP undefined
        weights = rng.gamma(1 + 2 * np.eye(4)[labels])  # Dirichlet rows leaning to the true class
        return labels, np.round(weights / weights.sum(axis=1, keepdims=True), 2)
    if kind == "regression":
        targets = rng.normal(size=(n, 2)) * [100.0, 0.01] + [1e4, 0.0]  # a large mean: the spread must not cancel
        return targets, targets + rng.normal(size=targets.shape) * [10.0, 0.01]
    labels = (rng.random((n, 3)) < [0.3, 0.02, 0.0]).astype(np.int8)
    scores = np.clip(rng.normal(0.35 + 0.3 * labels, 0.2), 0, 1)
    scores[:, 0] = np.round(scores[:, 0], 2)
    return (labels[:, 0], scores[:, 0]) if kind == "binary" else (labels, scores)


class ThreadWorld:
    """Ranks as threads of one process: the collectives the exact and the histogram mode use, through shared slots."""

    def __init__(self, size: int):
        self.size, self.slots = size, [None] * size
        self.barrier = threading.Barrier(size, timeout=20)

    def run(self, work):
        """work(comm) on every rank; the ranks' results, or their exceptions, in rank order."""
        results = [None] * self.size

        def rank_main(rank):
            try:
                results[rank] = work(ThreadComm(self, rank))
            except Exception as e:  # noqa: BLE001 - handed back to the test
                results[rank] = e
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results


class ThreadComm:
    def __init__(self, world: ThreadWorld, rank: int):
        self.world, self.rank, self.size = world, rank, world.size

    def gather_obj(self, value, root=0):
        self.world.slots[self.rank] = value
        self.world.barrier.wait()
        gathered = list(self.world.slots) if self.rank == root else None
        self.world.barrier.wait()
        return gathered

    def bcast_obj(self, value, root=0):
        if self.rank == root:
            self.world.slots[root] = value
        self.world.barrier.wait()
        value = self.world.slots[root]
        self.world.barrier.wait()
        return value

    def allgather_obj(self, value):
        self.world.slots[self.rank] = value
        self.world.barrier.wait()
        gathered = list(self.world.slots)
        self.world.barrier.wait()
        return gathered

    def allreduce_(self, buf):
        buf[...] = np.sum(self.allgather_obj(buf.copy()), axis=0)  # in rank order, alike on every rank


def test_gather_concatenates_the_ranks_rows_in_rank_order_on_rank_0():
    labels, scores = kind_data("class", np.random.default_rng(7), n=100)
    parts = [(0, 30), (30, 30), (30, 100)]  # rank 1 has no rows
    results = ThreadWorld(3).run(lambda comm: gather_predictions(
        comm, labels[slice(*parts[comm.rank])], scores[slice(*parts[comm.rank])]))
    np.testing.assert_array_equal(results[0][0], labels)
    np.testing.assert_array_equal(results[0][1], scores)
    assert results[1] == results[2] == (None, None)


def test_distributed_metrics_equal_one_ranks_and_every_rank_gets_them():
    labels, scores = kind_data("class", np.random.default_rng(8), n=1000)
    cuts = [0, 100, 600, 1000]
    results = ThreadWorld(3).run(lambda comm: distributed_metrics(
        comm, "class", labels[cuts[comm.rank]:cuts[comm.rank + 1]], scores[cuts[comm.rank]:cuts[comm.rank + 1]]))
    assert results[0] == results[1] == results[2] == {**target_metrics("class", labels, scores), "auc_mode": "exact"}


def test_every_rank_raises_the_same_error_instead_of_waiting():
    labels, scores = np.array([0, 1, 1]), np.array([0.2, 0.7, 0.9])

    def too_many(comm):
        return gather_predictions(comm, labels, scores, max_rows=5)
    results = ThreadWorld(2).run(too_many)
    assert all(isinstance(r, MpitrainError) and "6 rows are more than the limit of 5" in str(r) for r in results)

    def mismatched(comm):
        return distributed_metrics(comm, "binary", labels, scores[:2] if comm.rank == 1 else scores)
    results = ThreadWorld(2).run(mismatched)
    assert all(isinstance(r, MpitrainError) and "differ in length on rank 1" in str(r) for r in results)

    def bad_label(comm):
        return distributed_metrics(comm, "binary", labels + (comm.rank == 1), scores)
    results = ThreadWorld(2).run(bad_label)
    assert all(isinstance(r, MpitrainError) and "0 or 1" in str(r) for r in results)


def test_the_grid_is_nondecreasing_and_each_score_lies_between_its_bins_edges():
    rng = np.random.default_rng(10)
    near = 2.0 ** -rng.uniform(0, 70, 20000)
    p = np.sort(np.r_[0.0, 1.0, 0.5, np.nextafter(0.5, 0), np.nextafter(0.5, 1), 2.0 ** -6, 1 - 2.0 ** -6,
                      rng.random(20000), near, 1 - near, rng.random(1000).astype(np.float32)])
    bins = score_bins(p)
    assert (np.diff(bins) >= 0).all() and bins[0] == 0 and bins[-1] == HISTOGRAM_BINS - 1 == _BIN_EDGES.size - 1
    assert (_BIN_EDGES[bins] <= p).all() and (p <= np.r_[_BIN_EDGES[1:], 1.0][bins]).all()
    assert len({*score_bins(np.array([np.nextafter(0.5, 0), 0.5, np.nextafter(0.5, 1)]))}) == 3  # 0.5 alone
    widths = np.diff(_BIN_EDGES)
    middle = (_BIN_EDGES[:-1] >= 2.0 ** -6) & (_BIN_EDGES[1:] <= 1 - 2.0 ** -6)
    np.testing.assert_array_equal(widths[middle & (widths > 0)], 2.0 ** -16)
    assert (widths[1:] <= np.maximum(np.minimum(_BIN_EDGES[1:-1], 1 - _BIN_EDGES[2:]) * 2.0 ** -10, 2.0 ** -16)).all()


@pytest.mark.parametrize("kind", ["binary", "multilabel", "class"])
def test_histogram_auc_and_average_precision_are_the_exact_ones_of_the_binned_scores(kind):
    labels, scores = kind_data(kind, np.random.default_rng(11))
    m = ThreadWorld(2).run(lambda comm: distributed_metrics(comm, kind, labels[comm.rank::2], scores[comm.rank::2],
                                                            max_rows=0))[0]
    binned = score_bins(scores).astype(np.float64)  # the bin's number as the score: ties within a bin
    exact = target_metrics(kind, labels, binned)
    assert m["auc_mode"] == "histogram" and m["auc_bins"] == HISTOGRAM_BINS
    for key in ("auc", "average_precision", "auc_macro", "average_precision_macro"):
        np.testing.assert_allclose(np.array(m.get(key), dtype=float), np.array(exact.get(key), dtype=float),
                                   rtol=1e-12)
    positive = labels == 1 if kind == "binary" else labels[:, 0] == 1 if kind == "multilabel" else labels == 0
    column = scores if kind == "binary" else scores[:, 0]
    auc = m["auc"] if kind == "binary" else m["auc"][0]
    assert auc == pytest.approx(sk.roc_auc_score(positive, score_bins(column)), rel=1e-12)


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_histogram_error_on_a_million_rows_is_within_the_stated_bounds(name):
    labels, scores = DISTRIBUTIONS[name](np.random.default_rng([0, list(DISTRIBUTIONS).index(name)]), 1_000_000)
    m = ThreadWorld(1).run(lambda comm: distributed_metrics(comm, "binary", labels, scores, max_rows=0))[0]
    auc_error = abs(m["auc"] - sk.roc_auc_score(labels, scores))
    assert auc_error <= min(AUC_ERROR, m["auc_error_bound"]), (auc_error, m["auc_error_bound"])
    assert abs(m["average_precision"] - sk.average_precision_score(labels, scores)) <= AVERAGE_PRECISION_ERROR


@pytest.mark.parametrize("kind", ["class", "binary", "multilabel", "regression"])
def test_histogram_mode_gives_the_exact_modes_other_figures_on_every_rank_one_without_rows(kind):
    labels, scores = kind_data(kind, np.random.default_rng(12))
    cuts = [0, 1200, 1200, 3000]  # rank 1 has no rows

    def scored(comm):
        rows = slice(cuts[comm.rank], cuts[comm.rank + 1])
        return distributed_metrics(comm, kind, labels[rows], scores[rows], max_rows=2999)
    results = ThreadWorld(3).run(scored)
    assert results[0] == results[1] == results[2], results
    m, exact = results[0], target_metrics(kind, labels, scores)
    assert set(m) - set(exact) == ({"auc_mode", "auc_bins", "auc_error_bound"} if kind != "regression" else set())
    for key in set(exact) - set(HISTOGRAM_KEYS):
        if isinstance(exact[key], int):
            assert m[key] == exact[key], key
        else:
            np.testing.assert_allclose(np.array(m[key], dtype=float), np.array(exact[key], dtype=float),
                                       rtol=1e-12, atol=1e-15, err_msg=key)
    if kind != "regression":
        bounds = np.atleast_1d(np.array(m["auc_error_bound"], dtype=float))
        errors = np.abs(np.atleast_1d(np.array(m["auc"], dtype=float)) - np.atleast_1d(np.array(exact["auc"],
                                                                                                  dtype=float)))
        assert ((errors <= bounds) | np.isnan(errors)).all(), (errors, bounds)


def test_a_constant_regression_column_scores_r2_0_or_1_in_the_histogram_mode():
    targets = np.c_[np.full(1000, 0.1), np.arange(1000.0)]
    for predictions, expected in ((targets + 1, [0.0, 1 - 1000 / np.var(targets[:, 1]) / 1000]), (targets, [1.0, 1.0])):
        m = ThreadWorld(2).run(lambda comm: distributed_metrics(comm, "regression", targets[comm.rank::2],
                                                                predictions[comm.rank::2], max_rows=0))[0]
        np.testing.assert_allclose(m["r2_per_output"], expected, rtol=1e-12)


def test_the_histogram_modes_errors_are_raised_on_every_rank():
    labels, scores = np.array([0, 1, 1]), np.array([0.2, 0.7, 0.9])

    def run(work):
        results = ThreadWorld(2).run(work)
        assert all(isinstance(r, MpitrainError) for r in results), results
        assert len({str(r) for r in results}) == 1, results
        return str(results[0])
    assert "0 or 1 (seen on rank 1)" in run(lambda comm: distributed_metrics(
        comm, "binary", labels + (comm.rank == 1), scores, max_rows=0))
    assert "not [0, 1]" in run(lambda comm: distributed_metrics(comm, "binary", labels, scores * 2, max_rows=0))
    assert "differ in width: [2, 3]" in run(lambda comm: distributed_metrics(
        comm, "multilabel", np.zeros((3, 2 + comm.rank)), np.zeros((3, 2 + comm.rank)), max_rows=0))
    assert "no rows to score" in run(lambda comm: distributed_metrics(comm, "binary", [], [], max_rows=-1))


def test_auc_of_counts_past_int64_is_still_an_exact_ratio():
    positives, negatives = np.array([0, 3e9, 5e9]), np.array([6e9, 2e9, 0])  # 2 P N > 2^63
    ranking = Ranking.of_histogram(positives, negatives, np.array([0.0, 0.5, 0.75]))
    twice_u = 2 * 5e9 * 8e9 + 2 * 3e9 * 6e9 + 3e9 * 2e9  # a positive above a negative counts 2, a tie 1
    assert ranking.auc() == float(Fraction(int(twice_u), 2 * int(8e9) * int(8e9)))
