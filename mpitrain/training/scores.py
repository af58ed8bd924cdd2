"""Exact evaluation metrics by target kind, equal to scikit-learn's (issue 28, part 5).

    target_metrics(kind, labels, scores) -> dict       # one rank's full arrays; every metric of the kind
    curves(kind, labels, scores) -> dict | list         # ROC and precision-recall points, for plots
    decisions(kind, scores) -> array                    # the predicted class or 0/1 labels (regression: the values)

Over every rank's rows (collectives): `mpitrain.training.distributed_scores`, exact up to `MAX_EXACT_ROWS` rows,
in its histogram mode above. Both modes compute every figure from the parts below: `checked` arrays, their
`row_sums` (counts, summed log losses and errors), and per ranked column (`ranked_columns`) a `Ranking` of its
positives and negatives by score; `figures` and `regression_figures` turn those into the dict.

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

Over the ranks (`distributed_scores`, so in `mpitrain eval`'s eval-SPLIT.json) the kinds with an AUC also say how
it and average precision were computed: `auc_mode` "exact", or "histogram" with `auc_bins` and `auc_error_bound`.
Regression has no rank-based figure: every one is a sum over rows, exact in both modes.

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
  (sklearn's sum of trapezoids in floating point agrees to 1e-12, as the tests check). Exact in int64 (Python's
  integers past it); 10^7 binary rows take 2.5 s on one core (the sort), class targets one sort per class.
- `average_precision`: `average_precision_score` (step-wise, tied scores one threshold).
- AUC and average precision of a column whose labels are all one value (a class absent, or every row of it) are
  None: undefined (sklearn: nan for AUC, 0.0 with a warning for average precision). The macro means are over
  the columns where they are defined (None if there is none), so a class missing from a split does not pull
  them down; for class targets, `auc_macro` then equals `roc_auc_score(multi_class="ovr")`, which requires
  every class present.
- Multilabel `accuracy`: the exact-match ratio, `accuracy_score` on the 0/1 matrices.
- Regression: `mean_squared_error`, `root_mean_squared_error` (the mean over outputs of each output's root),
  `mean_absolute_error`, `r2_score` (multioutput="uniform_average"; a constant target column scores 1.0 if
  predicted exactly, else 0.0, as sklearn's force_finite; r2 is None below 2 rows), in float64. Like sklearn,
  "constant" means a spread, the sum of squared distances to the computed mean, of exactly 0: where the mean is
  off by rounding (0.1 three times) both give the same huge negative r2.

One sort per scored column gives its AUC, average precision and curves; one bincount gives the confusion counts
behind accuracy, precision, recall and F1.
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import MpitrainError

KINDS = ("class", "binary", "multilabel", "regression")

MAX_EXACT_ROWS = 50_000_000
"""The most rows the exact mode brings to rank 0 (`mpitrain.training.distributed_scores.gather_predictions`): it holds
every prediction there. Above it `distributed_metrics` and `mpitrain eval` score in the histogram mode."""


# ---------------------------------------------------------------------------------------------- one rank's arrays

def target_metrics(kind: str, labels: np.ndarray, scores: np.ndarray) -> dict:
    """Every metric of `kind` on these labels and scores (one rank's full arrays; see the module docstring)."""
    labels, scores = checked(kind, labels, scores)
    if kind == "regression":
        labels, scores = labels.astype(np.float64), scores.astype(np.float64)
        spread = np.sum((labels - np.mean(labels, axis=0)) ** 2, axis=0)  # as sklearn computes it
        return regression_figures(row_sums(kind, labels, scores), spread)
    positive, columns = ranked_columns(kind, labels, scores)
    rankings = [Ranking.of_scores(positive[:, j], columns[:, j]) for j in range(columns.shape[1])]
    return figures(kind, row_sums(kind, labels, scores), rankings)


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
    labels, scores = checked(kind, labels, scores)
    if kind == "regression":
        raise MpitrainError("curves are for class, binary and multilabel targets, not regression")
    positive, columns = ranked_columns(kind, labels, scores)
    found = [Ranking.of_scores(positive[:, j], columns[:, j]).curves() for j in range(columns.shape[1])]
    return found[0] if kind == "binary" else found


def ranked_columns(kind: str, labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ranked columns of checked arrays: which rows are positive, (n, k) bools, and their scores (n, k); class
    targets one column per class (one-vs-rest)."""
    if kind == "class":
        return labels[:, None] == np.arange(scores.shape[1]), scores
    if kind == "binary":
        return labels[:, None] == 1, scores[:, None]
    return labels == 1, scores


class Ranking:
    """One column's rows grouped by tied score, the largest first: at each distinct score (a threshold), the positives
    (`tps`) and negatives (`fps`) scoring at least that (sklearn's `confusion_matrix_at_thresholds`). In the histogram
    mode a group is a bin, its threshold the bin's lower edge."""

    def __init__(self, tps: np.ndarray, fps: np.ndarray, thresholds: np.ndarray):
        self.tps, self.fps, self.thresholds = tps, fps, thresholds
        self.positives, self.negatives = (int(tps[-1]), int(fps[-1])) if tps.size else (0, 0)

    @classmethod
    def of_scores(cls, positive: np.ndarray, score: np.ndarray) -> Ranking:
        """One sort of the column's rows by score."""
        order = np.argsort(score)[::-1]
        ranked = score[order]
        ends = np.r_[np.flatnonzero(np.diff(ranked)), ranked.size - 1]
        tps = np.cumsum(positive[order], dtype=np.int64)[ends]
        return cls(tps, ends + 1 - tps, ranked[ends].astype(np.float64))

    @classmethod
    def of_histogram(cls, positives: np.ndarray, negatives: np.ndarray, edges: np.ndarray) -> Ranking:
        """The column's positives and negatives per bin (counts, float64 or integers; bins in increasing order of
        score) and the bins' lower `edges`."""
        filled = np.flatnonzero(positives + negatives)[::-1]
        return cls(np.cumsum(positives[filled]).astype(np.int64), np.cumsum(negatives[filled]).astype(np.int64),
                   edges[filled])

    @property
    def defined(self) -> bool:
        return self.positives > 0 and self.negatives > 0

    def auc(self) -> float | None:
        """The area under the ROC curve, 2U / (2 P N) with U the Mann-Whitney count (ties one half), from integers."""
        if not self.defined:
            return None
        previous_tps = np.r_[0, self.tps[:-1]]
        exact = np.int64 if 2 * self.positives * self.negatives < 2 ** 63 else object  # Python's integers past int64
        twice_u = int(np.dot(np.diff(self.fps, prepend=0).astype(exact), (self.tps + previous_tps).astype(exact)))
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


def row_sums(kind: str, labels: np.ndarray, scores: np.ndarray) -> dict:
    """The sums over checked arrays' rows behind every figure but AUC, average precision and regression's r2 (whose
    spread needs the mean): counts and summed log losses or errors, from one pass over the rows; none is a must.
    The histogram mode adds them up over the ranks."""
    rows = labels.shape[0]
    if kind == "regression":
        errors = labels - scores
        return {"rows": rows, "squared": np.sum(errors ** 2, axis=0), "absolute": np.sum(np.abs(errors), axis=0)}
    if kind == "class":
        classes = scores.shape[1]
        return {"rows": rows,
                "confusion": np.bincount(labels * classes + decisions(kind, scores), minlength=classes * classes),
                "log_loss": _log_sum(_clipped(scores[np.arange(rows), labels], scores.dtype))}
    positive, predicted = labels == 1, decisions(kind, scores) == 1
    sums = {"rows": rows, "log_loss": _log_sum(_binary_probability(positive, scores))}
    if kind == "multilabel":
        return {**sums, "correct": np.count_nonzero((positive == predicted).all(axis=1))}
    return {**sums, "correct": np.count_nonzero(positive == predicted), "hits": np.count_nonzero(positive & predicted),
            "predicted": np.count_nonzero(predicted), "positives": np.count_nonzero(positive)}


def figures(kind: str, sums: dict, rankings: list[Ranking]) -> dict:
    """Every figure of a class, binary or multilabel target from its `row_sums` and its columns' rankings."""
    n = int(sums["rows"])
    auc = [r.auc() for r in rankings]
    average_precision = [r.average_precision() for r in rankings]
    if kind == "binary":
        hits, predicted, positives = (int(sums[key]) for key in ("hits", "predicted", "positives"))
        return {"rows": n, "accuracy": float(sums["correct"]) / n, "log_loss": float(sums["log_loss"]) / n,
                "precision": _ratio(hits, predicted), "recall": _ratio(hits, positives),
                "f1": _ratio(2 * hits, predicted + positives), "auc": auc[0], "average_precision": average_precision[0]}
    ranked = {"auc": auc, "auc_macro": _mean_defined(auc), "average_precision": average_precision,
              "average_precision_macro": _mean_defined(average_precision)}
    if kind == "multilabel":
        return {"rows": n, "accuracy": float(sums["correct"]) / n,
                "log_loss": float(sums["log_loss"]) / (n * len(rankings)), **ranked}
    classes = len(rankings)
    confusion = np.asarray(sums["confusion"]).astype(np.int64).reshape(classes, classes)
    hits, true_counts, predicted_counts = np.diag(confusion), confusion.sum(axis=1), confusion.sum(axis=0)
    precision, recall = _ratios(hits, predicted_counts), _ratios(hits, true_counts)
    f1 = _ratios(2 * hits, true_counts + predicted_counts)
    return {"rows": n, "accuracy": float(hits.sum() / n), "log_loss": float(sums["log_loss"]) / n,
            "precision": precision, "recall": recall, "f1": f1, "precision_macro": float(np.mean(precision)),
            "recall_macro": float(np.mean(recall)), "f1_macro": float(np.mean(f1)), **ranked}


def regression_figures(sums: dict, spread: np.ndarray) -> dict:
    """Every figure of a regression target from its `row_sums` and each output's spread (the sum of squared distances
    to the mean; 0: a constant column)."""
    n, residual = int(sums["rows"]), np.asarray(sums["squared"])
    mse, mae = residual / n, np.asarray(sums["absolute"]) / n
    rmse = np.sqrt(mse)
    result = {"rows": n, "mse": float(np.mean(mse)), "rmse": float(np.mean(rmse)), "mae": float(np.mean(mae)),
              "r2": None, "mse_per_output": mse.tolist(), "rmse_per_output": rmse.tolist(),
              "mae_per_output": mae.tolist(), "r2_per_output": [None] * mse.size}
    if n >= 2:
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


def _log_sum(probabilities: np.ndarray) -> float:
    """The summed log loss, -sum(log p)."""
    return float(-np.sum(np.log(probabilities)))


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def _ratios(numerators: np.ndarray, denominators: np.ndarray) -> list:
    return [_ratio(int(a), int(b)) for a, b in zip(numerators, denominators)]


def _mean_defined(values: list) -> float | None:
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


def checked(kind: str, labels, scores) -> tuple[np.ndarray, np.ndarray]:
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
