"""An evaluation's pictures draw scikit-learn's points: ROC and precision-recall curves (binary, multilabel) and
predicted-vs-true values (regression), checked on the points and the figure's lines, not on pixels."""
import numpy as np
import sklearn.metrics as sk
from matplotlib.image import imread

from mpitrain.rundir.report import (
    MAX_CURVES,
    curve_points,
    curves_figure,
    scatter_figure,
    scatter_points,
    write_curves_png,
    write_scatter_png,
)
from mpitrain.training.scores import curves, target_metrics


def multilabel(n=400, k=3, seed=0):
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, k)) < 0.3).astype(np.float32)
    scores = np.round(np.clip(rng.normal(0.35 + 0.3 * labels, 0.2), 0, 1), 2)  # ties, as real scores have
    return labels, scores


def test_the_curves_drawn_are_sklearns_roc_and_precision_recall_points(tmp_path):
    labels, scores = multilabel()
    found = curves("multilabel", labels, scores)
    points = curve_points(found)
    metrics = target_metrics("multilabel", labels, scores)
    figure = curves_figure(points, ["a", "b", "c"], metrics, "title")
    roc, pr = figure.axes
    for j in range(3):
        fpr, tpr, _ = sk.roc_curve(labels[:, j], scores[:, j])
        precision, recall, _ = sk.precision_recall_curve(labels[:, j], scores[:, j])
        np.testing.assert_array_equal(points[j]["fpr"], fpr)
        np.testing.assert_array_equal(points[j]["tpr"], tpr)
        np.testing.assert_allclose(points[j]["recall"], recall, rtol=1e-12)
        np.testing.assert_allclose(points[j]["precision"], precision, rtol=1e-12)
        np.testing.assert_array_equal(roc.lines[j].get_xydata(), np.column_stack([fpr, tpr]))
        np.testing.assert_allclose(pr.lines[j].get_xydata(), np.column_stack([recall, precision]), rtol=1e-12)
        assert roc.lines[j].get_label() == f"{'abc'[j]} (AUC {sk.roc_auc_score(labels[:, j], scores[:, j]):.4f})"
    binary = curve_points([curves("binary", labels[:, :1], scores[:, :1])])
    np.testing.assert_array_equal(binary[0]["tpr"], points[0]["tpr"])
    write_curves_png(found, ["a", "b", "c"], metrics, str(tmp_path / "curves.png"), "title")
    assert imread(tmp_path / "curves.png").ndim == 3


def test_long_curves_are_thinned_to_a_subset_of_their_points_and_many_labels_to_the_first():
    labels, scores = multilabel(n=3000, k=MAX_CURVES + 2, seed=1)
    scores = scores + np.random.default_rng(2).normal(0, 1e-3, scores.shape)  # about one threshold per row
    found = curves("multilabel", labels, scores)
    points = curve_points(found, limit=50)
    assert len(points) == MAX_CURVES
    full = found[0]["pr"]
    assert len(full["recall"]) > 1000 and len(points[0]["recall"]) == 50
    kept = np.flatnonzero(np.isin(full["recall"], points[0]["recall"]) & np.isin(full["precision"],
                                                                                 points[0]["precision"]))
    assert kept[0] == 0 and kept[-1] == len(full["recall"]) - 1  # both ends, and only sklearn's points
    assert set(zip(points[0]["recall"], points[0]["precision"])) <= set(zip(full["recall"], full["precision"]))
    figure = curves_figure(points, [f"l{j}" for j in range(MAX_CURVES + 2)], target_metrics("multilabel", labels,
                                                                                           scores), "t")
    assert figure.axes[0].get_title() == f"ROC ({MAX_CURVES} of {MAX_CURVES + 2} labels)"


def test_the_scatter_draws_predicted_against_true_values(tmp_path):
    rng = np.random.default_rng(3)
    true = rng.normal(10, 3, (500, 2)).astype(np.float32)
    predicted = true + rng.normal(0, 1, true.shape).astype(np.float32)
    metrics = target_metrics("regression", true, predicted)
    figure = scatter_figure(true, predicted, ["price", "volume"], metrics, "title")
    for j, ax in enumerate(figure.axes):
        np.testing.assert_array_equal(ax.collections[0].get_offsets(), np.column_stack([true[:, j], predicted[:, j]]))
        assert ax.get_title() == f"{['price', 'volume'][j]}: R² {sk.r2_score(true[:, j], predicted[:, j]):.4f}"
    sampled_true, sampled_predicted = scatter_points(true, predicted, limit=100)
    assert len(sampled_true) == 100 and np.isin(sampled_true[:, 0], true[:, 0]).all()
    np.testing.assert_array_equal(sampled_predicted - sampled_true,
                                  (predicted - true)[np.isin(true[:, 0], sampled_true[:, 0])])
    write_scatter_png(true, predicted, ["price", "volume"], metrics, str(tmp_path / "scatter.png"), "title")
    assert imread(tmp_path / "scatter.png").ndim == 3
