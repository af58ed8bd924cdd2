"""Exact evaluation metrics by target kind, equal to scikit-learn's, and their distributed form (issue 28, part 5).

    target_metrics(kind, labels, scores) -> dict       # one rank's full arrays; every metric of the kind
    curves(kind, labels, scores) -> dict | list         # ROC and precision-recall points, for plots
    decisions(kind, scores) -> array                    # the predicted class or 0/1 labels (regression: the values)
    gather_predictions(comm, labels, scores)            # a collective: every rank's rows on rank 0
    distributed_metrics(comm, kind, labels, scores)     # a collective: gathered, scored on rank 0, broadcast
    root_metrics(comm, kind, labels, scores)            # a collective: rank 0's gathered arrays scored, broadcast

Kinds and their arrays (n rows):

    class       labels int (n,) in 0..K-1          scores: class probabilities (n, K)
    binary      labels 0/1 (n,) or (n, 1)          scores: probability of 1 (n,) or (n, 1)
    multilabel  labels 0/1 (n, k)                  scores: per-label probabilities (n, k)
    regression  targets float (n,) or (n, k)       predictions, the same shape

Keys by kind (every value a Python float, int, None or a list of them: JSON as it is):

    class       rows, accuracy, log_loss, precision, recall, f1 (lists, one per class), precision_macro,
                recall_macro, f1_macro, auc, average_precision (lists, one-vs-rest), auc_macro,
                average_precision_macro
    binary      rows, accuracy, log_loss, precision, recall, f1 (of class 1), auc, average_precision
    multilabel  rows, accuracy (exact match), log_loss, auc, average_precision (lists, one per label),
                auc_macro, average_precision_macro
    regression  rows, mse, rmse, mae, r2, and mse_per_output, rmse_per_output, mae_per_output, r2_per_output

How each figure relates to scikit-learn's (tests/unit/training/test_scores.py checks every one):

- Predicted classes: class, the first largest probability (argmax); binary and multilabel, probability > 0.5
  (what a logistic model's `predict` does: 0.5 itself is class 0).
- `log_loss`: sklearn's `log_loss` (>= 1.5): probabilities clipped to [eps, 1 - eps], eps the machine epsilon of
  the scores' dtype (float32 scores: float32's), not renormalized; the mean of -log(p of the true class). Computed
  in float64 (sklearn in the scores' dtype: float32 scores agree to float32 precision). Binary: with 1 - p for
  label 0, as sklearn's two-column form. Multilabel: the mean binary cross-entropy over all n x k entries, which
  is the mean over labels of sklearn's `log_loss(labels[:, j], scores[:, j], labels=[0, 1])`.
- `precision`, `recall`, `f1`: `precision_recall_fscore_support(labels=range(K), zero_division=0)`: every class
  0..K-1 has an entry, 0.0 where undefined, and the macro means are over all K.
- `auc`: `roc_auc_score` on one column (ties count one half: Mann-Whitney with average ranks). Computed from one
  sort as an integer ratio 2U / (2 P N), so the float returned is that rational number correctly rounded
  (sklearn's sum of trapezoids in floating point agrees to 1e-12, as the tests check). Exact in int64 far
  beyond `MAX_EXACT_ROWS`; 10^7 binary rows take 2.5 s on one core (the sort), class targets one sort per class.
- `average_precision`: `average_precision_score` (step-wise, tied scores one threshold).
- AUC and average precision of a column whose labels are all one value (a class absent, or every row of it) are
  None: undefined (sklearn: nan for AUC, 0.0 with a warning for average precision). The macro means are over
  the columns where they are defined (None if there is none), so a class missing from a split does not pull
  them down; for class targets, `auc_macro` then equals `roc_auc_score(multi_class="ovr")`, which requires
  every class present.
- Multilabel `accuracy`: the exact-match ratio, `accuracy_score` on the 0/1 matrices.
- Regression: `mean_squared_error`, `root_mean_squared_error` (the mean over outputs of each output's root),
  `mean_absolute_error`, `r2_score` (multioutput="uniform_average"; a constant target column scores 1.0 if
  predicted exactly, else 0.0, as sklearn's force_finite; r2 is None below 2 rows), in float64.

One sort per scored column gives its AUC, average precision and curves; one bincount gives the confusion counts
behind accuracy, precision, recall and F1.
"""
from __future__ import annotations

import numpy as np

from mpitrain.errors import MpitrainError

KINDS = ("class", "binary", "multilabel", "regression")

MAX_EXACT_ROWS = 50_000_000
"""The most rows `gather_predictions` brings to rank 0: exact metrics hold every prediction there (see it)."""


# ---------------------------------------------------------------------------------------------- one rank's arrays

def target_metrics(kind: str, labels: np.ndarray, scores: np.ndarray) -> dict:
    """Every metric of `kind` on these labels and scores (one rank's full arrays; see the module docstring)."""
    labels, scores = _checked(kind, labels, scores)
    if kind == "class":
        return _class_metrics(labels, scores)
    if kind == "binary":
        return _binary_metrics(labels, scores)
    if kind == "multilabel":
        return _multilabel_metrics(labels, scores)
    return _regression_metrics(labels, scores)


def decisions(kind: str, scores: np.ndarray) -> np.ndarray:
    """What the model predicts from its `scores` (see the module docstring's first point): class targets the first
    largest probability, int32 (n,); binary and multilabel targets 1 where the probability is above 0.5, int32 of the
    scores' shape; regression targets the values themselves."""
    if kind == "class":
        return scores.argmax(axis=1).astype(np.int32)
    if kind in ("binary", "multilabel"):
        return (scores > 0.5).astype(np.int32)
    return scores


def curves(kind: str, labels: np.ndarray, scores: np.ndarray):
    """ROC and precision-recall curve points, as sklearn's `roc_curve` (drop_intermediate=True) and
    `precision_recall_curve` (drop_intermediate=False) give them: for binary targets one dict, for multilabel
    targets a list of one per label, for class targets a list of one per class (one-vs-rest).

    Each dict: {"roc": {"fpr", "tpr", "thresholds"}, "pr": {"precision", "recall", "thresholds"}}, float64
    arrays; the first ROC threshold is inf, and a column without negatives (positives) has a nan fpr (tpr).
    """
    labels, scores = _checked(kind, labels, scores)
    if kind == "binary":
        return _Ranking(labels == 1, scores).curves()
    if kind == "multilabel":
        return [_Ranking(labels[:, j] == 1, scores[:, j]).curves() for j in range(scores.shape[1])]
    if kind == "class":
        return [_Ranking(labels == c, scores[:, c]).curves() for c in range(scores.shape[1])]
    raise MpitrainError("curves are for class, binary and multilabel targets, not regression")


class _Ranking:
    """One column's rows sorted by score, decreasing, grouped by tied score: at each distinct score (a threshold),
    the positives (`tps`) and negatives (`fps`) scoring at least that (sklearn's `confusion_matrix_at_thresholds`)."""

    def __init__(self, positive: np.ndarray, score: np.ndarray):
        order = np.argsort(score)[::-1]
        ranked = score[order]
        ends = np.r_[np.flatnonzero(np.diff(ranked)), ranked.size - 1]
        self.tps = np.cumsum(positive[order], dtype=np.int64)[ends]
        self.fps = ends + 1 - self.tps
        self.thresholds = ranked[ends].astype(np.float64)
        self.positives, self.negatives = int(self.tps[-1]), int(self.fps[-1])

    @property
    def defined(self) -> bool:
        return self.positives > 0 and self.negatives > 0

    def auc(self) -> float | None:
        """The area under the ROC curve, 2U / (2 P N) with U the Mann-Whitney count (ties one half), from integers."""
        if not self.defined:
            return None
        previous_tps = np.r_[0, self.tps[:-1]]
        twice_u = int(np.dot(np.diff(self.fps, prepend=0), self.tps + previous_tps))
        return twice_u / (2 * self.positives * self.negatives)

    def average_precision(self) -> float | None:
        """The sum over thresholds of (recall gained) x (precision there)."""
        if not self.defined:
            return None
        precision = self.tps / (self.tps + self.fps)
        return float(np.dot(np.diff(self.tps, prepend=0), precision) / self.positives)

    def curves(self) -> dict:
        tps, fps, thresholds = self.tps, self.fps, self.thresholds
        if tps.size > 2:  # roc_curve's drop_intermediate: points on a straight line go
            keep = np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True]
            tps, fps, thresholds = tps[keep], fps[keep], thresholds[keep]
        tps, fps = np.r_[0, tps], np.r_[0, fps]
        roc = {"fpr": fps / self.negatives if self.negatives else np.full(fps.shape, np.nan),
               "tpr": tps / self.positives if self.positives else np.full(tps.shape, np.nan),
               "thresholds": np.r_[np.inf, thresholds]}
        precision = self.tps / (self.tps + self.fps)
        recall = self.tps / self.positives if self.positives else np.ones(self.tps.shape)
        pr = {"precision": np.r_[precision[::-1], 1.0], "recall": np.r_[recall[::-1], 0.0],
              "thresholds": self.thresholds[::-1]}
        return {"roc": roc, "pr": pr}


def _class_metrics(labels: np.ndarray, scores: np.ndarray) -> dict:
    n, classes = scores.shape
    predicted = decisions("class", scores)
    confusion = np.bincount(labels * classes + predicted, minlength=classes * classes).reshape(classes, classes)
    hits, true_counts, predicted_counts = np.diag(confusion), confusion.sum(axis=1), confusion.sum(axis=0)
    precision = _ratios(hits, predicted_counts)
    recall = _ratios(hits, true_counts)
    f1 = _ratios(2 * hits, true_counts + predicted_counts)
    rankings = [_Ranking(labels == c, scores[:, c]) for c in range(classes)]
    auc = [r.auc() for r in rankings]
    average_precision = [r.average_precision() for r in rankings]
    return {
        "rows": n, "accuracy": float(hits.sum() / n),
        "log_loss": _mean_log(_clipped(scores[np.arange(n), labels], scores.dtype)),
        "precision": precision, "recall": recall, "f1": f1,
        "precision_macro": float(np.mean(precision)), "recall_macro": float(np.mean(recall)),
        "f1_macro": float(np.mean(f1)),
        "auc": auc, "auc_macro": _mean_defined(auc),
        "average_precision": average_precision, "average_precision_macro": _mean_defined(average_precision),
    }


def _binary_metrics(labels: np.ndarray, scores: np.ndarray) -> dict:
    positive, predicted = labels == 1, decisions("binary", scores) == 1
    hits = int(np.count_nonzero(positive & predicted))
    ranking = _Ranking(positive, scores)
    return {
        "rows": int(labels.size), "accuracy": float(np.count_nonzero(positive == predicted) / labels.size),
        "log_loss": _mean_log(_binary_probability(positive, scores)),
        "precision": _ratio(hits, int(np.count_nonzero(predicted))),
        "recall": _ratio(hits, int(np.count_nonzero(positive))),
        "f1": _ratio(2 * hits, int(np.count_nonzero(predicted)) + int(np.count_nonzero(positive))),
        "auc": ranking.auc(), "average_precision": ranking.average_precision(),
    }


def _multilabel_metrics(labels: np.ndarray, scores: np.ndarray) -> dict:
    positive = labels == 1
    rankings = [_Ranking(positive[:, j], scores[:, j]) for j in range(scores.shape[1])]
    auc = [r.auc() for r in rankings]
    average_precision = [r.average_precision() for r in rankings]
    return {
        "rows": int(labels.shape[0]),
        "accuracy": float(np.count_nonzero((positive == (decisions("multilabel", scores) == 1)).all(axis=1))
                          / labels.shape[0]),
        "log_loss": _mean_log(_binary_probability(positive, scores)),
        "auc": auc, "auc_macro": _mean_defined(auc),
        "average_precision": average_precision, "average_precision_macro": _mean_defined(average_precision),
    }


def _regression_metrics(targets: np.ndarray, predictions: np.ndarray) -> dict:
    targets, predictions = targets.astype(np.float64), predictions.astype(np.float64)
    errors = targets - predictions
    mse = np.mean(errors ** 2, axis=0)
    rmse = np.sqrt(mse)
    mae = np.mean(np.abs(errors), axis=0)
    result = {"rows": int(targets.shape[0]), "mse": float(np.mean(mse)), "rmse": float(np.mean(rmse)),
              "mae": float(np.mean(mae)), "r2": None,
              "mse_per_output": mse.tolist(), "rmse_per_output": rmse.tolist(), "mae_per_output": mae.tolist(),
              "r2_per_output": [None] * targets.shape[1]}
    if targets.shape[0] >= 2:
        residual = np.sum(errors ** 2, axis=0)
        spread = np.sum((targets - np.mean(targets, axis=0)) ** 2, axis=0)
        r2 = np.where(residual == 0, 1.0, 0.0)  # sklearn's force_finite where the spread is 0
        varied = spread != 0
        r2[varied] = 1 - residual[varied] / spread[varied]
        result["r2"], result["r2_per_output"] = float(np.mean(r2)), r2.tolist()
    return result


def _binary_probability(positive: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The clipped probability given to each entry's true value: p for 1, 1 - p (in the scores' dtype) for 0."""
    return _clipped(np.where(positive, scores, 1 - scores), scores.dtype)


def _clipped(probabilities: np.ndarray, dtype) -> np.ndarray:
    eps = float(np.finfo(dtype).eps)
    return np.clip(probabilities.astype(np.float64), eps, 1 - eps)


def _mean_log(probabilities: np.ndarray) -> float:
    return float(-np.mean(np.log(probabilities)))


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def _ratios(numerators: np.ndarray, denominators: np.ndarray) -> list:
    return [_ratio(int(a), int(b)) for a, b in zip(numerators, denominators)]


def _mean_defined(values: list) -> float | None:
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


def _checked(kind: str, labels, scores) -> tuple[np.ndarray, np.ndarray]:
    """The arrays in the shapes the metrics use (binary: (n,); multilabel, regression: (n, k)), or a one-line error."""
    if kind not in KINDS:
        raise MpitrainError(f"unknown target kind {kind!r}: expected one of {', '.join(KINDS)}")
    labels, scores = np.asarray(labels), np.asarray(scores)
    if scores.dtype.kind != "f":
        scores = scores.astype(np.float64)
    if labels.shape[:1] != scores.shape[:1]:
        raise MpitrainError(f"{labels.shape[0] if labels.ndim else 0} labels but {scores.shape[0]} rows of scores")
    if labels.shape[0] == 0:
        raise MpitrainError("no rows to score")
    if not np.isfinite(scores).all():
        raise MpitrainError(f"the {'predictions' if kind == 'regression' else 'scores'} are not all finite (nan or inf)")
    if kind == "class":
        if labels.ndim != 1 or scores.ndim != 2:
            raise MpitrainError(f"class targets: labels (n,) and scores (n, K), not {labels.shape} and {scores.shape}")
        if labels.dtype.kind == "f" and not np.array_equal(labels, np.round(labels)):
            raise MpitrainError("class labels must be whole numbers")
        labels = labels.astype(np.int64)
        if labels.min() < 0 or labels.max() >= scores.shape[1]:
            raise MpitrainError(f"class labels must lie in 0..{scores.shape[1] - 1}, "
                                f"found {labels.min()}..{labels.max()}")
    elif kind == "binary":
        if labels.size != labels.shape[0] or scores.size != scores.shape[0]:
            raise MpitrainError(f"binary targets: labels and scores (n,) or (n, 1), not {labels.shape} and "
                                f"{scores.shape}")
        labels, scores = labels.reshape(-1), scores.reshape(-1)
    else:
        labels = labels.reshape(labels.shape[0], -1)
        scores = scores.reshape(scores.shape[0], -1)
        if labels.shape != scores.shape:
            raise MpitrainError(f"{kind} targets: labels and {'predictions' if kind == 'regression' else 'scores'} "
                                f"of one shape, not {labels.shape} and {scores.shape}")
    if kind in ("binary", "multilabel") and not np.isin(labels, (0, 1)).all():
        raise MpitrainError(f"{kind} labels must be 0 or 1")
    return labels, scores


# ---------------------------------------------------------------------------------------------- over the ranks

def gather_predictions(comm, labels: np.ndarray, scores: np.ndarray, max_rows: int | None = None):
    """Every rank's labels and scores concatenated in rank order on rank 0, as (labels, scores); (None, None)
    elsewhere. A collective: every rank calls it (a rank without rows passes empty arrays of its shape).

    Exact metrics need every prediction on one rank: n x (k + k) values, the labels and the scores (float64:
    at 10^7 rows and k = 1, 160 MB on rank 0, plus the pickled copies the object gather makes). Above `max_rows`
    rows in all (default `MAX_EXACT_ROWS`, 5 x 10^7) every rank raises an error instead, before anything is
    sent: score a sample of the split, or fewer rows. There is no approximate (histogram) mode in this round.

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
                f"{limit} (mpitrain.training.scores.MAX_EXACT_ROWS): score a sample of the split")
    return None


def distributed_metrics(comm, kind: str, labels: np.ndarray, scores: np.ndarray,
                        max_rows: int | None = None) -> dict:
    """`target_metrics` of every rank's rows together, the same dict on every rank. A collective: the rows are
    gathered on rank 0 (`gather_predictions`, with its memory cost and limit), scored there, and the result
    broadcast (`root_metrics`)."""
    return root_metrics(comm, kind, *gather_predictions(comm, labels, scores, max_rows))


def root_metrics(comm, kind: str, labels: np.ndarray | None, scores: np.ndarray | None) -> dict:
    """`target_metrics` of rank 0's `labels` and `scores` (what `gather_predictions` gave it; other ranks pass None),
    the same dict on every rank. A collective: an error on rank 0 (bad labels on some rank) is raised on every rank."""
    result = None
    if comm.rank == 0:
        try:
            result = target_metrics(kind, labels, scores)
        except MpitrainError as e:
            result = e
    result = comm.bcast_obj(result if not isinstance(result, MpitrainError) else ("error", str(result)))
    if isinstance(result, tuple):
        raise MpitrainError(result[1])
    return result
