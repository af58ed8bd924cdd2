"""Metrics over every rank's rows: exact up to `MAX_EXACT_ROWS` rows in all, in the histogram mode above.

    distributed_metrics(comm, kind, labels, scores)   # the mode by the rows in all; the same dict on every rank
    histogram_scores(comm, kind, labels, scores)      # the histogram mode: that dict and the curves of its histograms
    gather_predictions(comm, labels, scores)          # the exact mode: every rank's rows on rank 0 ...
    root_metrics(comm, kind, labels, scores)          # ... scored there (`scores.target_metrics`), broadcast
    score_bins(p) -> array                            # the histogram mode's bin of each probability

Each function taking `comm` is a collective: every rank calls it, in the same order, a rank without rows too (with
empty arrays); an error in any rank's arrays (a bad label) is raised on every rank, none is left waiting. The keys
and the exact definitions are `mpitrain.training.scores`'. `mpitrain eval` chooses the mode the same way, from its
Allreduced row count (`--max-exact-rows N` sets the limit).

The exact mode (up to `max_rows` rows in all, default `MAX_EXACT_ROWS` = 5 x 10^7): every prediction is gathered
on rank 0 (two object gathers and a broadcast; 160 MB at 10^7 rows of one column), scored there, and the dict
broadcast. Every figure equals scikit-learn's on the gathered predictions, AUC exactly; `auc_mode`: "exact".

The histogram mode (above it): no row leaves its rank. A first collective, an allgather, carries each rank's
width and any error in its arrays (regression: its row count and its targets' sums, least and largest values);
then each rank makes one pass over its rows for every sum below, and one Allreduce (float64: counts exact below
2^53) adds them all up. Every rank computes the same dict from the same sums.

- Every figure that is a sum over rows stays exact: accuracy, log_loss, the confusion counts behind precision,
  recall and F1, and regression's mse, rmse, mae and r2 (the sums of squared and absolute errors, and of the
  targets' distances to their mean, which every rank knows from the allgather: the spread keeps its digits under
  a large mean). They equal the exact mode's up to float64 rounding (1e-12: tests/mpi/test_scores.py). A
  regression column is constant when its least and largest values agree: r2 1.0 or 0.0 (force_finite's intent,
  without the rounding of the mean the exact mode shares with sklearn).
- AUC and average precision come from histograms: each rank counts each ranked column's positives and negatives
  per bin of a fixed grid over [0, 1], and a `scores.Ranking` of the summed bins takes each bin for one tied score.
  They are then exactly the figures of the scores rounded to their bins, ties in a bin counting one half (the
  trapezoid): AUC errs by at most the positive-negative pairs that share a bin, sum_b P_b N_b / (2 P N), which
  the result gives as `auc_error_bound` (it counts exact ties too, which cost nothing: for rounded, float16 or
  saturated scores it lies far above the error). The result says `auc_mode`: "histogram" and `auc_bins`. The
  curves (for `mpitrain eval`'s picture) have a point per filled bin, thresholds at the bins' lower edges.
- The grid, `HISTOGRAM_BINS` = 182,273 bins: width 2^-16 (1.5e-5) between 1/64 and 63/64; nearer to 0 (to 1),
  1024 bins per halving of the distance to it, each at most 2^-10 of that distance, down to 2^-64 (what lies
  nearer shares the end bin); 0.5 alone in its bin. Why: models put most rows near one end (a click-through
  model's probabilities are 10^-4 to 10^-1), where a linear grid is coarse: in a trial on the distributions below
  (10^6 rows), 2^16 linear bins erred by 3.5e-6 in AUC on the 0.1% click-through scores and 2^20 (16 MB a column)
  still by 1.8e-6, while bins of one relative width alone (1024 per halving, 63,490 bins) erred by 5e-5 in
  average precision on the balanced ones, coarse in the middle. This grid is never coarser than either.
- Cost: 2 x 182,273 float64 counts per ranked column (2.9 MB; a class target has one column per class), sent by
  the one Allreduce; each rank's pass takes about 1 s per 10^7 rows and column on one core. Scores must be
  probabilities in [0, 1] (evaluation's sigmoids and softmaxes are): others are an error in this mode.

Measured error against scikit-learn's exact figures (binary; `python -m mpitrain.testing.score_distributions
--rows N`, whose nine distributions are realistic scores: balanced, calibrated click-through at 2% and 0.1%, a
noisy click-through model, confident, saturated float32 with exact 0s and 1s, rounded to 3 decimals, click-through
rounded, float16): the largest |AUC error| 7.3e-7 and |average precision error| 8.6e-6 at 10^6 rows (checked by
tests/unit/training/test_distributed_scores.py against 1e-6 and 1e-5), 1.3e-7 and 9.1e-6 at 10^7 rows (measured
once, on 2 shared cores). Exact ties alone cost nothing; average precision errs low by a few 10^-6 on continuous
scores (a bin's positives all count at the precision of its lower edge).
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import MpitrainError
from mpitrain.training.scores import (
    MAX_EXACT_ROWS,
    Ranking,
    checked,
    figures,
    ranked_columns,
    regression_figures,
    row_sums,
    target_metrics,
)

_LINEAR_WIDTH = 2.0 ** -16  # the bins' width between 1/64 and 63/64
_OCTAVE_BINS = 1024  # bins per halving of the distance to 0 (to 1) below 1/64 (above 63/64)
_OCTAVES = 58  # from 2^-64 to 2^-6: what lies nearer to 0 (to 1) than 2^-64 shares the end bin
_NEAR = _OCTAVES * _OCTAVE_BINS  # the bins below 1/64
_HALF = _NEAR + round((0.5 - 2.0 ** -6) / _LINEAR_WIDTH) + 1  # the bins of [0, 0.5]: 0.5 alone in the last
HISTOGRAM_BINS = 2 * _HALF - 1
"""The bins of the histogram mode's grid over [0, 1] (182,273): see the module docstring."""


def distributed_metrics(comm, kind: str, labels: np.ndarray, scores: np.ndarray,
                        max_rows: int | None = None) -> dict:
    """`target_metrics` of every rank's rows together, the same dict on every rank. A collective: an allgather of
    the ranks' row counts, then up to `max_rows` rows in all (default `MAX_EXACT_ROWS`) the exact mode: the rows
    gathered on rank 0 (`gather_predictions`, with its memory cost), scored there, and the result broadcast
    (`root_metrics`); above it the histogram mode (`histogram_scores`), which gathers no row."""
    limit = MAX_EXACT_ROWS if max_rows is None else max_rows
    if sum(comm.allgather_obj(np.shape(labels)[0] if np.ndim(labels) else 0)) > limit:
        return histogram_scores(comm, kind, labels, scores)[0]
    return root_metrics(comm, kind, *gather_predictions(comm, labels, scores, limit))


def gather_predictions(comm, labels: np.ndarray, scores: np.ndarray, max_rows: int | None = None):
    """Every rank's labels and scores concatenated in rank order on rank 0, as (labels, scores); (None, None)
    elsewhere. A collective: every rank calls it (a rank without rows passes empty arrays of its shape).

    Exact metrics need every prediction on one rank: n x (k + k) values, the labels and the scores (float64:
    at 10^7 rows and k = 1, 160 MB on rank 0, plus the pickled copies the object gather makes). Above `max_rows`
    rows in all (default `MAX_EXACT_ROWS`, 5 x 10^7) every rank raises an error instead, before anything is
    sent (`distributed_metrics` scores such rows in the histogram mode instead).

    The arrays travel by the communicator's pickled object gather (`gather_obj`): two gathers (the row counts,
    then the arrays) and one broadcast (whether to go on), so a rank whose arrays disagree in length, or a
    total over the limit, raises the same error on every rank instead of leaving the others waiting.
    """
    limit = MAX_EXACT_ROWS if max_rows is None else max_rows
    labels, scores = np.asarray(labels), np.asarray(scores)
    agrees = labels.ndim > 0 and scores.ndim > 0 and labels.shape[0] == scores.shape[0]
    shapes = comm.gather_obj((labels.shape, scores.shape) if agrees else None)
    problem = _gather_problem(shapes, limit) if comm.rank == 0 else None
    problem = comm.bcast_obj(problem)
    if problem is not None:
        raise MpitrainError(problem)
    parts = comm.gather_obj((labels, scores))
    if comm.rank != 0:
        return None, None
    parts = [p for p in parts if p[0].shape[0]] or parts[:1]  # a rank without rows may pass arrays of any width
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _gather_problem(shapes: list, limit: int) -> str | None:
    """Why the ranks' arrays (their shapes, None where labels and scores differ in length) cannot be gathered."""
    if None in shapes:
        return f"labels and scores differ in length on rank {shapes.index(None)}"
    widths = {(a[1:], b[1:]) for a, b in shapes if a[0]}
    if len(widths) > 1:
        return f"the ranks' labels and scores differ in shape: {[(a, b) for a, b in shapes]}"
    rows = sum(a[0] for a, _ in shapes)
    if rows > limit:
        return (f"exact metrics bring every prediction to rank 0, and {rows} rows are more than the limit of "
                f"{limit} (mpitrain.training.scores.MAX_EXACT_ROWS): score them in the histogram mode "
                f"(distributed_metrics), or a sample")
    return None


def root_metrics(comm, kind: str, labels: np.ndarray | None, scores: np.ndarray | None) -> dict:
    """`target_metrics` of rank 0's `labels` and `scores` (what `gather_predictions` gave it; other ranks pass None),
    with `auc_mode` "exact" where the kind has an AUC, the same dict on every rank. A collective: an error on rank 0
    (bad labels on some rank) is raised on every rank."""
    result = None
    if comm.rank == 0:
        try:
            result = target_metrics(kind, labels, scores)
            result.update({} if kind == "regression" else {"auc_mode": "exact"})
        except MpitrainError as e:
            result = e
    result = comm.bcast_obj(result if not isinstance(result, MpitrainError) else ("error", str(result)))
    if isinstance(result, tuple):
        raise MpitrainError(result[1])
    return result


def histogram_scores(comm, kind: str, labels: np.ndarray, scores: np.ndarray) -> tuple[dict, list | dict | None]:
    """The histogram mode (see the module docstring): every figure of `kind` over every rank's rows, the same dict on
    every rank, and the ROC and precision-recall curves of the histograms as `curves` gives them (None for
    regression). No row leaves its rank.

    A collective of two calls, which every rank makes in this order, a rank without rows too (it passes empty
    arrays): an allgather of each rank's width and any error in its arrays, so that all raise the first one
    (regression: with its row count and its targets' sums, least and largest values, for the mean); then one
    Allreduce of every sum and histogram (float64: counts exact below 2^53).
    """
    labels, scores, report = _own_rows(kind, labels, scores)
    width, mean, constant = _agreed(kind, comm.allgather_obj(report))
    if labels is None:  # no rows here: zeros of the others' shapes
        labels, scores = _empty(kind, width)
    parts = row_sums(kind, labels, scores)
    if kind == "regression":
        centered = labels - mean
        parts.update(centered=np.sum(centered, axis=0), centered_squared=np.sum(centered ** 2, axis=0))
    else:
        parts["histograms"] = _histograms(*ranked_columns(kind, labels, scores))
    summed = np.concatenate([np.ravel(value).astype(np.float64) for value in parts.values()])
    comm.allreduce_(summed)
    ends = np.cumsum([np.size(value) for value in parts.values()])
    sums = {key: summed[end - np.size(value):end].reshape(np.shape(value))
            for (key, value), end in zip(parts.items(), ends)}
    if kind == "regression":  # the spread from sums about the mean: no cancellation; a constant column's is 0
        spread = np.maximum(sums["centered_squared"] - sums["centered"] ** 2 / sums["rows"], 0.0)
        return regression_figures(sums, np.where(constant, 0.0, spread)), None
    rankings = [Ranking.of_histogram(positives, negatives, _BIN_EDGES) for negatives, positives in sums["histograms"]]
    bound = [float(h[0] @ h[1]) / (2 * r.positives * r.negatives) if r.defined else None
             for h, r in zip(sums["histograms"], rankings)]
    found = [r.curves() for r in rankings]
    mode = {"auc_mode": "histogram", "auc_bins": HISTOGRAM_BINS,
            "auc_error_bound": bound[0] if kind == "binary" else bound}
    return {**figures(kind, sums, rankings), **mode}, found[0] if kind == "binary" else found


def score_bins(p: np.ndarray) -> np.ndarray:
    """The bin of each probability of `p` (in [0, 1]) on the histogram mode's grid, 0..HISTOGRAM_BINS-1 and
    nondecreasing in p: width 2^-16 between 1/64 and 63/64; nearer to 0 (to 1), 1024 bins per halving of the
    distance to it, each at most 2^-10 of that distance, down to 2^-64."""
    q = np.minimum(p, 1 - p)  # 1 - p is exact for p in [0.5, 1]: the upper half mirrors the lower
    mantissa, exponent = np.frexp(np.maximum(q, 2.0 ** -(_OCTAVES + 6)))  # q = mantissa 2^exponent, in [0.5, 1)
    near = (exponent + _OCTAVES + 5) * _OCTAVE_BINS + ((2 * mantissa - 1) * _OCTAVE_BINS).astype(np.int64)
    far = _NEAR + (q / _LINEAR_WIDTH).astype(np.int64) - round(2.0 ** -6 / _LINEAR_WIDTH)  # 1/64: _NEAR
    lower = np.where(q < 2.0 ** -6, near, far)
    return np.where(p <= 0.5, lower, HISTOGRAM_BINS - 1 - lower)


def _bin_edges() -> np.ndarray:
    """Each bin's lower edge: the least score it holds (in the upper half, where bins are (edge, next edge], the
    scores above it), float64 (HISTOGRAM_BINS,)."""
    j = np.arange(_HALF + 1)
    lower = np.where(j < _NEAR, np.ldexp(1 + (j % _OCTAVE_BINS) / _OCTAVE_BINS, j // _OCTAVE_BINS - _OCTAVES - 6),
                     2.0 ** -6 + (j - _NEAR) * _LINEAR_WIDTH)
    lower[0] = 0.0
    return np.r_[lower[:_HALF], 1 - lower[_HALF - 1:0:-1]]


_BIN_EDGES = _bin_edges()


def _histograms(positive: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Each column's negatives and positives per bin, (k, 2, HISTOGRAM_BINS) counts, by one bincount."""
    index = score_bins(scores) + HISTOGRAM_BINS * (positive + 2 * np.arange(scores.shape[1]))
    return np.bincount(index.ravel(), minlength=2 * HISTOGRAM_BINS * scores.shape[1]).reshape(-1, 2, HISTOGRAM_BINS)


def _own_rows(kind: str, labels, scores) -> tuple:
    """This rank's checked arrays (None, None without rows) and its report for the others: (its error or None, its
    width, for regression (rows, the targets' sums, least and largest values per output))."""
    labels, scores = np.asarray(labels), np.asarray(scores)
    if labels.shape[:1] == scores.shape[:1] == (0,):
        return None, None, (None, None, None)
    try:
        labels, scores = checked(kind, labels, scores)
        if kind != "regression" and (scores.min() < 0 or scores.max() > 1):
            raise MpitrainError(f"the histogram mode bins probabilities, and the scores lie in "
                                f"[{scores.min()}, {scores.max()}], not [0, 1]")
    except MpitrainError as e:
        return None, None, (str(e), None, None)
    if kind != "regression":
        return labels, scores, (None, 1 if kind == "binary" else scores.shape[1], None)
    labels, scores = labels.astype(np.float64), scores.astype(np.float64)
    return labels, scores, (None, labels.shape[1], (labels.shape[0], labels.sum(axis=0), labels.min(axis=0),
                                                    labels.max(axis=0)))


def _agreed(kind: str, reports: list) -> tuple:
    """What the ranks' reports (`_own_rows`) agree on: the width, and for regression the targets' mean and which
    outputs are constant; or the first failing rank's error, raised on every rank."""
    for rank, (error, _, _) in enumerate(reports):
        if error is not None:
            raise MpitrainError(f"{error} (seen on rank {rank})")
    widths = sorted({width for _, width, _ in reports if width is not None})
    if len(widths) != 1:
        raise MpitrainError(f"the ranks' scores differ in width: {widths}" if widths else "no rows to score")
    if kind != "regression":
        return widths[0], None, None
    rows, sums, least, largest = zip(*(summary for _, _, summary in reports if summary is not None))
    return widths[0], np.sum(sums, axis=0) / sum(rows), np.min(least, axis=0) == np.max(largest, axis=0)


def _empty(kind: str, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Checked arrays of no rows and `width` columns: what a rank without rows adds up."""
    if kind == "class":
        return np.empty(0, np.int64), np.empty((0, width))
    if kind == "binary":
        return np.empty(0), np.empty(0)
    return np.empty((0, width)), np.empty((0, width))
