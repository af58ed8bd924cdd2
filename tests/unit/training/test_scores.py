"""mpitrain.training.scores: every metric of every target kind equals scikit-learn's on the same arrays (ties,
imbalance, a class absent, probabilities of exactly 0 and 1), AUC exactly. (Over the ranks:
test_distributed_scores.py.)"""
import time
import warnings
from fractions import Fraction

import numpy as np
import pytest
from sklearn import metrics as sk

from mpitrain.base.errors import MpitrainError
from mpitrain.training.scores import curves, target_metrics

RTOL = 1e-12


@pytest.fixture(autouse=True)
def quiet_sklearn():
    with warnings.catch_warnings():  # sklearn warns of undefined metrics and of rounded probabilities
        warnings.simplefilter("ignore")
        yield


def close(ours, theirs, rtol=RTOL):
    assert ours == pytest.approx(float(theirs), rel=rtol, abs=1e-15), (ours, theirs)


def exact_auc(positive: np.ndarray, score: np.ndarray) -> Fraction:
    """The Mann-Whitney statistic by its definition: over every (positive, negative) pair, 1 if the positive scores
    higher, 1/2 if tied (quadratic: small arrays only)."""
    pos, neg = score[positive], score[~positive]
    twice = 2 * (pos[:, None] > neg[None, :]).sum() + (pos[:, None] == neg[None, :]).sum()
    return Fraction(int(twice), 2 * pos.size * neg.size)


def class_data(rng, n=3000, classes=5, absent=3):
    """Imbalanced labels without class `absent`, probabilities rounded to 2 decimals (ties), some exactly 0 or 1."""
    weights = np.array([0.6, 0.25, 0.1, 0.0, 0.05])[:classes]
    weights[absent] = 0
    labels = rng.choice(classes, size=n, p=weights / weights.sum())
    scores = np.round(rng.dirichlet(np.ones(classes) * 0.7, size=n), 2)
    scores[:20] = 0.0
    scores[np.arange(20), labels[:20]] = 1.0  # certain and right
    scores[20:40] = 0.0
    scores[np.arange(20, 40), (labels[20:40] + 1) % classes] = 1.0  # certain and wrong: log loss clipped
    return labels, scores


def test_class_metrics_equal_sklearns():
    labels, scores = class_data(np.random.default_rng(0))
    m = target_metrics("class", labels, scores)
    classes = list(range(scores.shape[1]))
    predicted = scores.argmax(axis=1)
    assert m["rows"] == labels.size
    close(m["accuracy"], sk.accuracy_score(labels, predicted))
    close(m["log_loss"], sk.log_loss(labels, scores, labels=classes))
    precision, recall, f1, _ = sk.precision_recall_fscore_support(labels, predicted, labels=classes, zero_division=0)
    for name, theirs in (("precision", precision), ("recall", recall), ("f1", f1)):
        assert len(m[name]) == 5
        for ours, expected in zip(m[name], theirs):
            close(ours, expected)
    for name, scorer in (("precision", sk.precision_score), ("recall", sk.recall_score), ("f1", sk.f1_score)):
        close(m[f"{name}_macro"], scorer(labels, predicted, labels=classes, average="macro", zero_division=0))
    present = [c for c in classes if c != 3]
    assert m["auc"][3] is None and m["average_precision"][3] is None
    for c in present:
        close(m["auc"][c], sk.roc_auc_score(labels == c, scores[:, c]))
        assert Fraction(m["auc"][c]) == Fraction(float(exact_auc(labels == c, scores[:, c])))
        close(m["average_precision"][c], sk.average_precision_score(labels == c, scores[:, c]))
    close(m["auc_macro"], np.mean([sk.roc_auc_score(labels == c, scores[:, c]) for c in present]))
    close(m["average_precision_macro"], sk.average_precision_score(
        np.eye(5)[labels][:, present], scores[:, present], average="macro"))


def test_class_auc_macro_is_sklearns_one_vs_rest_when_every_class_is_present():
    rng = np.random.default_rng(1)
    labels = rng.choice(3, size=2000, p=[0.7, 0.2, 0.1])
    scores = rng.dirichlet(np.ones(3), size=2000)
    close(target_metrics("class", labels, scores)["auc_macro"],
          sk.roc_auc_score(labels, scores, multi_class="ovr", average="macro"))


@pytest.mark.parametrize("shape", ["flat", "column"])
def test_binary_metrics_equal_sklearns(shape):
    rng = np.random.default_rng(2)
    n = 5000
    labels = (rng.random(n) < 0.15).astype(np.float32)  # imbalanced, float labels as a binary dataset stores them
    scores = np.round(np.clip(rng.normal(0.3 + 0.3 * labels, 0.2), 0, 1), 2)  # ties, and 0, 0.5, 1 exactly
    assert (scores == 0).any() and (scores == 1).any() and (scores == 0.5).any()
    m = target_metrics("binary", *((labels, scores) if shape == "flat" else (labels[:, None], scores[:, None])))
    y, predicted = labels.astype(int), (scores > 0.5).astype(int)
    close(m["accuracy"], sk.accuracy_score(y, predicted))
    close(m["log_loss"], sk.log_loss(y, scores))
    close(m["precision"], sk.precision_score(y, predicted, zero_division=0))
    close(m["recall"], sk.recall_score(y, predicted, zero_division=0))
    close(m["f1"], sk.f1_score(y, predicted, zero_division=0))
    close(m["auc"], sk.roc_auc_score(y, scores))
    assert m["auc"] == float(exact_auc(y == 1, scores))  # the rational number, correctly rounded
    close(m["average_precision"], sk.average_precision_score(y, scores))


def test_binary_metrics_of_float32_scores_clip_by_float32s_epsilon():
    labels = np.array([0, 1, 1, 0, 1])
    scores = np.array([0.0, 1.0, 0.0, 0.25, 0.75], np.float32)
    close(target_metrics("binary", labels, scores)["log_loss"], sk.log_loss(labels, scores), rtol=1e-6)


def test_binary_metrics_without_positives_leave_auc_and_average_precision_undefined():
    m = target_metrics("binary", np.zeros(4), np.array([0.1, 0.6, 0.2, 0.3]))
    assert m["auc"] is None and m["average_precision"] is None
    assert m["precision"] == 0.0 and m["recall"] == 0.0 and m["accuracy"] == 0.75


def test_multilabel_metrics_equal_sklearns():
    rng = np.random.default_rng(3)
    n, k = 4000, 4
    labels = (rng.random((n, k)) < [0.5, 0.1, 0.02, 0.0]).astype(np.int8)  # the last label never set
    scores = np.round(np.clip(rng.normal(0.35 + 0.3 * labels, 0.25), 0, 1), 2)
    m = target_metrics("multilabel", labels, scores)
    assert m["rows"] == n and m["auc"][3] is None and m["average_precision"][3] is None
    for j in range(3):
        close(m["auc"][j], sk.roc_auc_score(labels[:, j], scores[:, j]))
        assert m["auc"][j] == float(exact_auc(labels[:, j] == 1, scores[:, j]))
        close(m["average_precision"][j], sk.average_precision_score(labels[:, j], scores[:, j]))
    close(m["auc_macro"], sk.roc_auc_score(labels[:, :3], scores[:, :3], average="macro"))
    close(m["average_precision_macro"], sk.average_precision_score(labels[:, :3], scores[:, :3], average="macro"))
    close(m["accuracy"], sk.accuracy_score(labels, (scores > 0.5).astype(np.int8)))
    close(m["log_loss"], np.mean([sk.log_loss(labels[:, j], scores[:, j], labels=[0, 1]) for j in range(k)]))


@pytest.mark.parametrize("outputs", [1, 3])
def test_regression_metrics_equal_sklearns(outputs):
    rng = np.random.default_rng(4)
    targets = rng.normal(size=(1000, outputs)) * [10.0, 1.0, 0.1][:outputs]
    predictions = targets + rng.normal(size=targets.shape)
    if outputs == 3:
        targets[:, 2] = 0.1  # constant, predicted wrongly: its mean is off by rounding, and r2 -5e29 as sklearn's
    m = target_metrics("regression", targets, predictions)
    close(m["mse"], sk.mean_squared_error(targets, predictions))
    close(m["rmse"], sk.root_mean_squared_error(targets, predictions))
    close(m["mae"], sk.mean_absolute_error(targets, predictions))
    close(m["r2"], sk.r2_score(targets, predictions))
    for name, scorer in (("mse", sk.mean_squared_error), ("rmse", sk.root_mean_squared_error),
                         ("mae", sk.mean_absolute_error), ("r2", sk.r2_score)):
        for ours, theirs in zip(m[f"{name}_per_output"], scorer(targets, predictions, multioutput="raw_values")):
            close(ours, theirs)
    flat = target_metrics("regression", targets[:, 0], predictions[:, 0])
    close(flat["r2"], sk.r2_score(targets[:, 0], predictions[:, 0]))
    exact = target_metrics("regression", np.full((3, 1), 0.1), np.full((3, 1), 0.1))
    assert exact["r2"] == sk.r2_score(np.full(3, 0.1), np.full(3, 0.1)) == 1.0


def test_auc_of_a_million_rows_is_exact_and_fast():
    rng = np.random.default_rng(5)
    n = 1_000_000
    labels = rng.random(n) < 0.3
    scores = np.round(rng.random(n) * 0.5 + 0.3 * labels, 3)  # many ties
    start = time.perf_counter()
    m = target_metrics("binary", labels.astype(np.int8), scores)
    spent = time.perf_counter() - start
    assert spent < 5, f"{spent:.1f} s"
    close(m["auc"], sk.roc_auc_score(labels, scores))
    close(m["average_precision"], sk.average_precision_score(labels, scores))
    # the exact Mann-Whitney count by average ranks, independently of the sort by score groups
    values, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    twice_rank = (2 * np.cumsum(counts) - counts + 1)[inverse]  # 2 x the average 1-based rank of each row
    positives = int(labels.sum())
    twice_u = int(twice_rank[labels].sum()) - positives * (positives + 1)
    assert m["auc"] == twice_u / (2 * positives * (n - positives))


def test_curves_equal_sklearns():
    rng = np.random.default_rng(6)
    labels = (rng.random((500, 2)) < 0.3).astype(int)
    scores = np.round(np.clip(rng.normal(0.4 + 0.2 * labels, 0.2), 0, 1), 1)
    for got, j in [(curves("binary", labels[:, 0], scores[:, 0]), 0),
                   *zip(curves("multilabel", labels, scores), range(2))]:
        for ours, theirs in zip((got["roc"]["fpr"], got["roc"]["tpr"], got["roc"]["thresholds"]),
                                sk.roc_curve(labels[:, j], scores[:, j])):
            np.testing.assert_array_equal(ours, theirs)
        for ours, theirs in zip((got["pr"]["precision"], got["pr"]["recall"], got["pr"]["thresholds"]),
                                sk.precision_recall_curve(labels[:, j], scores[:, j])):
            np.testing.assert_allclose(ours, theirs, rtol=RTOL)
    class_labels, class_scores = class_data(rng, n=300)
    per_class = curves("class", class_labels, class_scores)
    fpr, tpr, _ = sk.roc_curve(class_labels == 1, class_scores[:, 1])
    np.testing.assert_array_equal(per_class[1]["roc"]["fpr"], fpr)
    np.testing.assert_array_equal(per_class[1]["roc"]["tpr"], tpr)


@pytest.mark.parametrize("kind, labels, scores, message", [
    ("class", [0, 3], [[0.5, 0.5], [0.5, 0.5]], "0..1"),
    ("class", [0, 1], [[0.5, np.nan], [0.5, 0.5]], "not all finite"),
    ("binary", [0, 2], [0.1, 0.2], "0 or 1"),
    ("binary", [0, 1], [0.1, 0.2, 0.3], "2 labels but 3"),
    ("multilabel", [[0, 1]], [[0.1, 0.2, 0.3]], "one shape"),
    ("regression", np.zeros((0, 1)), np.zeros((0, 1)), "no rows"),
    ("ranking", [0], [0.1], "unknown target kind"),
])
def test_bad_arrays_are_one_line_errors(kind, labels, scores, message):
    with pytest.raises(MpitrainError, match=message):
        target_metrics(kind, np.array(labels), np.array(scores))
