"""The losses: float64 gradients against central differences, values against plain formulas and scikit-learn,
stability at extreme logits, no allocation after the first call, the loss/target-kind check and the options."""

import numpy as np
import pytest
from sklearn.metrics import log_loss, mean_absolute_error, mean_squared_error

from mpitrain.base.errors import ConfigError
from mpitrain.base.workspace import Workspace
from mpitrain.config.sections import ModelConfig, load_config
from mpitrain.nn.layers import Dense
from mpitrain.nn.losses import (
    LOSS_TARGETS,
    LOSSES,
    binary_cross_entropy,
    check_loss_fits,
    check_loss_options,
    huber,
    l1,
    loss_with_options,
    mse,
    multilabel_cross_entropy,
    softmax_cross_entropy,
)
from mpitrain.nn.model import Sequential, build_model
from mpitrain.testing.gradients import numeric_grad
from mpitrain.testing.traced import allocated_bytes


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def targets_for(kind, rng, n, k, dtype=np.float64):
    """Targets of a target kind as the dataset gives them (class: int32 labels, else float rows of k columns)."""
    if kind == "class":
        return rng.integers(0, k, size=n).astype(np.int32)
    if kind in ("binary", "multilabel"):
        return rng.integers(0, 2, size=(n, k)).astype(dtype)
    return rng.normal(size=(n, k)).astype(dtype)


# (loss, its options, columns of logits)
CASES = [("softmax_cross_entropy", {}, 4), ("softmax_cross_entropy", {"class_weights": [0.5, 2.0, 1.0, 3.0]}, 4),
         ("softmax_cross_entropy", {"label_smoothing": 0.1}, 4),
         ("softmax_cross_entropy", {"class_weights": [0.5, 2.0, 1.0, 3.0], "label_smoothing": 0.2}, 4),
         ("binary_cross_entropy", {}, 1), ("binary_cross_entropy", {"pos_weight": 3.0}, 1),
         ("multilabel_cross_entropy", {}, 3), ("multilabel_cross_entropy", {"pos_weight": 0.25}, 3),
         ("mse", {}, 2), ("l1", {}, 2), ("huber", {}, 2), ("huber", {"delta": 0.3}, 2)]
IDS = [f"{loss}-{'-'.join(options) or 'plain'}" for loss, options, _ in CASES]


@pytest.mark.parametrize("loss, options, k", CASES, ids=IDS)
def test_gradient_is_the_mean_loss_derivative_in_float64(loss, options, k):
    rng = np.random.default_rng(len(loss) + k)
    logits = rng.normal(size=(6, k)) * 2
    targets = targets_for(LOSS_TARGETS[loss], rng, 6, k)
    if LOSS_TARGETS[loss] == "regression":  # keep clear of l1's and huber's kinks at 0 and +-delta
        d = logits - targets
        logits[np.abs(d) < 0.01] += 0.05
        logits[np.abs(np.abs(d) - options.get("delta", 1.0)) < 0.01] += 0.05
    loss_fn = loss_with_options(loss, options)
    _, _, grad = loss_fn(logits, targets, None)
    assert grad.dtype == np.float64
    np.testing.assert_allclose(grad, numeric_grad(lambda: loss_fn(logits, targets, None)[0], logits),
                               rtol=1e-6, atol=1e-9)


def test_values_equal_the_formulas_and_scikit_learn():
    rng = np.random.default_rng(0)
    n, c = 40, 5
    logits = rng.normal(size=(n, c)) * 2
    labels = targets_for("class", rng, n, c)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    loss, correct, _ = softmax_cross_entropy(logits, labels)
    assert loss == pytest.approx(-np.log(p[np.arange(n), labels]).mean(), rel=1e-12)
    assert loss == pytest.approx(log_loss(labels, p, labels=range(c)), rel=1e-12)
    assert correct == (logits.argmax(axis=1) == labels).sum()
    w = rng.uniform(0.2, 3, size=c)
    loss, correct, _ = softmax_cross_entropy(logits, labels, class_weights=w)
    row = -np.log(p[np.arange(n), labels])
    assert loss == pytest.approx((w[labels] * row).sum() / w[labels].sum(), rel=1e-12)
    assert loss == pytest.approx(log_loss(labels, p, sample_weight=w[labels], labels=range(c)), rel=1e-12)
    assert correct == (logits.argmax(axis=1) == labels).sum()

    x, t = logits[:, :1], targets_for("binary", rng, n, 1)
    loss, correct, _ = binary_cross_entropy(x, t)
    assert loss == pytest.approx(log_loss(t[:, 0], sigmoid(x[:, 0]), labels=[0, 1]), rel=1e-12)
    assert correct == ((x > 0) == (t > 0.5)).sum()
    loss, _, _ = binary_cross_entropy(x, t, pos_weight=2.5)
    expected = -(2.5 * t * np.log(sigmoid(x)) + (1 - t) * np.log(1 - sigmoid(x))).mean()
    assert loss == pytest.approx(expected, rel=1e-12)

    t = targets_for("multilabel", rng, n, c)
    loss, correct, _ = multilabel_cross_entropy(logits, t)
    per_label = [log_loss(t[:, j], sigmoid(logits[:, j]), labels=[0, 1]) for j in range(c)]
    assert loss == pytest.approx(np.mean(per_label), rel=1e-12)
    assert loss == pytest.approx(-(t * np.log(sigmoid(logits)) + (1 - t) * np.log(1 - sigmoid(logits))).mean(),
                                 rel=1e-12)
    assert correct == ((logits > 0) == (t > 0.5)).all(axis=1).sum()

    t = targets_for("regression", rng, n, c)
    d = logits - t
    for fn, expected in ((mse, mean_squared_error(t, logits)), (l1, mean_absolute_error(t, logits))):
        loss, correct, _ = fn(logits, t)
        assert loss == pytest.approx(expected, rel=1e-12) and correct == 0
    assert mse(logits, t)[0] == pytest.approx((d ** 2).mean(), rel=1e-12)
    assert l1(logits, t)[0] == pytest.approx(np.abs(d).mean(), rel=1e-12)
    for delta in (1.0, 0.4):
        expected = np.where(np.abs(d) < delta, 0.5 * d ** 2, delta * (np.abs(d) - 0.5 * delta)).mean()
        loss, correct, _ = huber(logits, t, delta=delta)
        assert loss == pytest.approx(expected, rel=1e-12) and correct == 0


def test_l1_and_huber_subgradient_is_zero_where_the_prediction_is_the_target():
    t = np.array([[1.5, -2.0]])
    for fn in (l1, huber):
        np.testing.assert_array_equal(fn(t.copy(), t)[2], 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("loss, options, k", CASES, ids=IDS)
def test_logits_of_a_thousand_give_finite_losses_and_gradients(loss, options, k, dtype):
    rng = np.random.default_rng(3)
    logits = np.where(rng.random((8, k)) < 0.5, -1000.0, 1000.0).astype(dtype)
    targets = targets_for(LOSS_TARGETS[loss], rng, 8, k, dtype)
    value, correct, grad = loss_with_options(loss, options)(logits, targets, None)
    assert np.isfinite(value) and np.isfinite(correct) and np.isfinite(grad).all() and grad.dtype == dtype


def test_sigmoid_cross_entropy_at_a_thousand_is_the_logit():
    x, t = np.array([[1000.0], [-1000.0], [1000.0]]), np.array([[0.0], [1.0], [1.0]])
    loss, correct, grad = binary_cross_entropy(x, t, pos_weight=2.0)
    assert loss == pytest.approx((1000 + 2 * 1000 + 0) / 3) and correct == 1
    np.testing.assert_allclose(grad, [[1 / 3], [-2 / 3], [0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weights_of_one_give_the_unweighted_softmax_bit_for_bit(dtype):
    rng = np.random.default_rng(5)
    logits, labels = (rng.normal(size=(33, 7)) * 4).astype(dtype), targets_for("class", rng, 33, 7)
    loss, correct, grad = softmax_cross_entropy(logits, labels)
    weighted = softmax_cross_entropy(logits, labels, class_weights=np.ones(7))
    assert weighted[0].tobytes() == loss.tobytes() and weighted[1] == correct
    assert weighted[2].tobytes() == grad.tobytes()


@pytest.mark.parametrize("loss, options, k", CASES, ids=IDS)
def test_a_call_allocates_nothing_after_the_first(loss, options, k):
    """The gradient (256 x k float32: 1 KB and more) is the workspace's: the same array, no new traced bytes."""
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(256, k)).astype(np.float32)
    targets = targets_for(LOSS_TARGETS[loss], rng, 256, k, np.float32)
    workspace = Workspace(np)
    loss_fn, ws = loss_with_options(loss, options), workspace.part("loss")
    first = loss_fn(logits, targets, ws)[2]
    arrays = dict(workspace.arrays)
    allocated = allocated_bytes(lambda: loss_fn(logits, targets, ws))
    second = loss_fn(logits, targets, ws)[2]
    assert second is first and workspace.arrays == arrays
    assert allocated <= 1024, f"{allocated} bytes allocated by one call"


def test_check_loss_fits_names_the_loss_the_target_and_what_fits():
    for loss, kind in LOSS_TARGETS.items():
        check_loss_fits(loss, kind, "d/manifest.json")
    assert set(LOSS_TARGETS) == set(LOSSES)
    with pytest.raises(ConfigError, match=r"^d/manifest.json: model.loss is mse, but the dataset's target is class "
                                          r"\(integer labels\); expected softmax_cross_entropy$"):
        check_loss_fits("mse", "class", "d/manifest.json")
    with pytest.raises(ConfigError, match=r"target is regression \(real values\); expected mse or l1 or huber$"):
        check_loss_fits("binary_cross_entropy", "regression", "d")
    with pytest.raises(ConfigError, match=r"expected multilabel_cross_entropy$"):
        check_loss_fits("binary_cross_entropy", "multilabel", "d")
    with pytest.raises(ConfigError, match=r"the dataset's target is 'ordinal', expected one of"):
        check_loss_fits("mse", "ordinal", "d")


@pytest.mark.parametrize("loss, options, message", [
    ("mse", {"delta": 1.0}, r"unknown key model.loss_options.delta for loss mse; expected none"),
    ("huber", {"pos_weight": 2}, r"unknown key model.loss_options.pos_weight for loss huber; expected one of "
                                 r"\['delta'\]"),
    ("binary_cross_entropy", {"class_weights": [1, 2]},
     r"unknown key model.loss_options.class_weights .* \['pos_weight'\]"),
    ("binary_cross_entropy", {"pos_weight": 0}, r"model.loss_options.pos_weight is 0, expected a positive number"),
    ("binary_cross_entropy", {"pos_weight": True}, r"model.loss_options.pos_weight is True"),
    ("huber", {"delta": -1}, r"model.loss_options.delta is -1, expected a positive number"),
    ("softmax_cross_entropy", {"class_weights": [1, 0]},
     r"model.loss_options.class_weights is \[1, 0\], expected a list of positive numbers"),
    ("softmax_cross_entropy", {"class_weights": []},
     r"model.loss_options.class_weights is \[\], expected a list of positive numbers"),
    ("softmax_cross_entropy", {"class_weights": 2},
     r"model.loss_options.class_weights is 2, expected a list of positive numbers"),
])
def test_config_refuses_loss_options_a_loss_does_not_take_or_out_of_their_domain(loss, options, message):
    with pytest.raises(ConfigError, match=r"^exp.yaml: " + message):
        ModelConfig(loss=loss, loss_options=options).validate("exp.yaml")


def test_config_normalizes_loss_options_and_the_model_binds_them():
    config = ModelConfig(layers=[{"type": "dense", "units": 3}], loss="softmax_cross_entropy",
                         loss_options={"class_weights": [1, 2, 0.5]}).validate("exp.yaml")
    assert config.loss_options == {"class_weights": [1.0, 2.0, 0.5]}
    assert check_loss_options("huber", {"delta": 2}) == {"delta": 2.0}
    model = build_model(config, (4,), 3, np)
    assert model.loss_options == {"class_weights": [1.0, 2.0, 0.5]}
    rng = np.random.default_rng(8)
    logits, labels = rng.normal(size=(5, 3)), targets_for("class", rng, 5, 3)
    assert model.loss_fn(logits, labels, None)[0] == softmax_cross_entropy(logits, labels,
                                                                           class_weights=[1, 2, 0.5])[0]
    with pytest.raises(ConfigError, match=r"model.loss_options.class_weights has 3 weights, expected 4"):
        build_model(ModelConfig(layers=[{"type": "dense", "units": 4}], loss_options={"class_weights": [1, 2, 3]}),
                    (4,), 4, np)


def test_loss_options_load_from_yaml_and_set_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("data: {path: d}\nmodel: {layers: [{type: dense, units: 1}], loss: binary_cross_entropy}\n")
    config = load_config(str(path), ["model.loss_options.pos_weight=3"])
    assert config.model.loss_options == {"pos_weight": 3.0}
    assert load_config(str(path)).model.loss_options == {}


def test_a_model_trains_on_regression_targets_with_its_loss_options():
    model = Sequential([Dense(2)], (3,), "huber", np, "float64", loss_options={"delta": 0.5})
    assert Sequential([Dense(2)], (3,), "mse").loss_options == {}
    model.init_params(0, "xavier")
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(4, 3)), rng.normal(size=(4, 2)) * 3
    loss, correct = model.train_batch(x, y)
    assert loss == huber(model.forward(x), y, delta=0.5)[0] and correct == 0
    with pytest.raises(ConfigError, match=r"unknown key model.loss_options.pos_weight for loss huber"):
        Sequential([Dense(2)], (3,), "huber", loss_options={"pos_weight": 2.0})


def test_targets_of_another_shape_than_the_logits_are_refused():
    with pytest.raises(ValueError, match=r"targets of shape \[4\] for logits of shape \[4, 1\]"):
        mse(np.zeros((4, 1)), np.zeros(4))
    with pytest.raises(ValueError, match=r"logits of shape \[4, 2\]; expected \[rows, 1\]"):
        binary_cross_entropy(np.zeros((4, 2)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"2 class weights for 3 classes"):
        softmax_cross_entropy(np.zeros((4, 3)), np.zeros(4, np.int32), class_weights=[1.0, 2.0])


@pytest.mark.parametrize("weights", [None, [0.5, 2.0, 1.0, 3.0, 0.7]], ids=["plain", "class-weights"])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_gives_pytorchs_loss_and_gradient(eps, weights):
    import torch

    from mpitrain.kernels import loss as kernels

    rng = np.random.default_rng(7)
    logits = rng.normal(size=(9, 5)) * 3
    labels = targets_for("class", rng, 9, 5)
    options = {"label_smoothing": eps, **({"class_weights": weights} if weights else {})}
    loss, correct, grad = loss_with_options("softmax_cross_entropy", options)(logits, labels, None)
    z = torch.tensor(logits, requires_grad=True)
    theirs = torch.nn.functional.cross_entropy(z, torch.tensor(labels, dtype=torch.long), label_smoothing=eps,
                                               weight=None if weights is None else torch.tensor(weights, dtype=torch.float64))
    theirs.backward()
    assert float(loss) == pytest.approx(theirs.item(), rel=1e-12)
    np.testing.assert_allclose(grad, z.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert int(correct) == int((logits.argmax(axis=1) == labels).sum())
    if eps:  # the cupy path's reference gives the kernel's numbers
        w = None if weights is None else np.asarray(weights)
        grad_ref, totals = np.empty_like(logits), np.zeros(2)
        kernels.smoothed_softmax_cross_entropy_reference(logits, labels, w, eps, grad_ref, totals)
        assert totals[0] == pytest.approx(float(loss), rel=1e-12) and totals[1] == int(correct)
        np.testing.assert_allclose(grad_ref, grad, rtol=1e-12, atol=1e-15)
