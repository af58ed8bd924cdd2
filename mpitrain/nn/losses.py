"""Losses: the mean loss over the batch, the correct predictions and the gradient with respect to the logits,
from one fused kernel (`mpitrain.kernels.loss`, `mpitrain.kernels.elementwise_loss`) writing into the model's
workspace.

    loss, correct, grad = mse(logits, targets, ws)                 # every loss: (logits, targets, ws) -> 3 results
    loss_fn = loss_with_options("huber", {"delta": 0.5}, xp)       # a loss with its options bound, as a model holds it
    check_loss_fits("mse", manifest_target_kind, "data.path")      # a loss that does not fit the targets: ConfigError

Each loss fits one kind of target (`LOSS_TARGETS`), as the dataset's manifest gives them:
class: int32 labels (rows,); binary: float32 0/1 (rows, 1); multilabel: float32 0/1 (rows, k);
regression: float32 (rows, k). The "correct" count is the rows predicted right (class: argmax is
the label; binary and multilabel: every (logit > 0) is (target > 0.5)) and 0 for regression.
"""
from __future__ import annotations

import functools

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import ConfigError
from mpitrain.base.workspace import Workspace
from mpitrain.kernels import elementwise_loss
from mpitrain.kernels import loss as kernels


def _outputs(logits, ws):
    """The gradient (logits' shape and dtype) and the two float64 totals, arrays of the workspace part `ws`."""
    ws = ws or Workspace(array_module(logits)).part("loss")
    return ws("grad", logits.shape, logits.dtype), ws("totals", (2,), np.float64)


def _results(totals, grad):
    """(mean loss, correct) as 0-d float64 arrays of the logits' device (no host round trip), and the gradient."""
    return totals[0:1].reshape(()).copy(), totals[1:2].reshape(()).copy(), grad


def _check_targets(logits, targets) -> None:
    if targets.shape != logits.shape:
        raise ValueError(f"targets of shape {list(targets.shape)} for logits of shape {list(logits.shape)}; "
                         "expected the same shape")


def softmax_cross_entropy(logits, labels, ws=None, class_weights=None, label_smoothing=0.0):
    """(mean cross-entropy, correct predictions, gradient softmax(logits) - onehot(labels) over the batch).

    The loss and count are float64 numbers of the logits' device (no host round trip); the
    gradient is the workspace part `ws`'s array (a new one when `ws` is None), so a step
    allocates nothing. `class_weights` (one positive number per class; a float64 array of the
    logits' device allocates nothing) weigh each row by its label's weight: the mean is
    sum(w * loss) / sum(w), as PyTorch's CrossEntropyLoss with `weight`. `label_smoothing` eps trains towards
    (1 - eps) onehot + eps / classes, as PyTorch's `label_smoothing` (with weights, its form); evaluation's loss
    stays the plain cross-entropy.
    """
    grad, totals = _outputs(logits, ws)
    weights = None
    if class_weights is not None:
        weights = array_module(logits).asarray(class_weights, dtype=np.float64)
        if weights.shape != (logits.shape[1],):
            raise ValueError(f"{len(weights)} class weights for {logits.shape[1]} classes; expected one per class")
    if label_smoothing:
        kernels.smoothed_softmax_cross_entropy(logits, labels, weights, float(label_smoothing), grad, totals)
    elif weights is None:
        kernels.softmax_cross_entropy(logits, labels, grad, totals)
    else:
        kernels.weighted_softmax_cross_entropy(logits, labels, weights, grad, totals)
    return _results(totals, grad)


def binary_cross_entropy(logits, targets, ws=None, pos_weight=1.0):
    """(mean binary cross-entropy of sigmoid(logits), rows with (logit > 0) == (target > 0.5), gradient) for
    logits and 0/1 targets of shape (rows, 1); `pos_weight` multiplies the positive term (PyTorch's
    BCEWithLogitsLoss). Stable for any logit: log-sigmoids are softplus of exp(-|logit|)."""
    if logits.ndim != 2 or logits.shape[1] != 1:
        raise ValueError(f"binary cross-entropy of logits of shape {list(logits.shape)}; expected [rows, 1]")
    return multilabel_cross_entropy(logits, targets, ws, pos_weight)


def multilabel_cross_entropy(logits, targets, ws=None, pos_weight=1.0):
    """(mean over rows and labels of independent sigmoids' binary cross-entropy, rows whose every label is
    right, gradient) for logits and 0/1 targets of shape (rows, labels); `pos_weight` as binary_cross_entropy's."""
    _check_targets(logits, targets)
    grad, totals = _outputs(logits, ws)
    elementwise_loss.sigmoid_cross_entropy(logits, targets, pos_weight, grad, totals)
    return _results(totals, grad)


def _regression(kind, logits, targets, ws, delta=1.0):
    _check_targets(logits, targets)
    grad, totals = _outputs(logits, ws)
    elementwise_loss.regression(logits, targets, kind, delta, grad, totals)
    return _results(totals, grad)


def mse(logits, targets, ws=None):
    """(mean of (logit - target)**2 over rows and outputs, 0, gradient)."""
    return _regression(elementwise_loss.MSE, logits, targets, ws)


def l1(logits, targets, ws=None):
    """(mean of |logit - target| over rows and outputs, 0, gradient); the subgradient at 0 is 0."""
    return _regression(elementwise_loss.L1, logits, targets, ws)


def huber(logits, targets, ws=None, delta=1.0):
    """(mean Huber loss over rows and outputs, 0, gradient): 0.5 d**2 where |d| < delta, else delta * (|d| - delta /
    2), d = logit - target (PyTorch's HuberLoss)."""
    return _regression(elementwise_loss.HUBER, logits, targets, ws, delta)


def sigmoid(x):
    xp = array_module(x)
    return 1 / (1 + xp.exp(-x))


def softmax(logits):
    xp = array_module(logits)
    exp = xp.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


LOSSES = {"softmax_cross_entropy": softmax_cross_entropy, "binary_cross_entropy": binary_cross_entropy,
          "multilabel_cross_entropy": multilabel_cross_entropy, "mse": mse, "l1": l1, "huber": huber}

# The dataset's target kind (manifest `target`) each loss fits, and what that kind's targets are.
LOSS_TARGETS = {"softmax_cross_entropy": "class", "binary_cross_entropy": "binary",
                "multilabel_cross_entropy": "multilabel", "mse": "regression", "l1": "regression",
                "huber": "regression"}
TARGET_KINDS = {"class": "integer labels", "binary": "one column of 0/1 labels",
                "multilabel": "a column of 0/1 labels per label", "regression": "real values"}

# The losses of an autoencoder (`model.target: reconstruction`): its input's values, or their 0..1 intensities.
RECONSTRUCTION_LOSSES = ("mse", "binary_cross_entropy")

# The options (model.loss_options) each loss takes.
LOSS_OPTIONS = {"softmax_cross_entropy": ("class_weights", "label_smoothing"), "binary_cross_entropy": ("pos_weight",),
                "multilabel_cross_entropy": ("pos_weight",), "mse": (), "l1": (), "huber": ("delta",)}


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


# Every loss option, with the check its value must pass and what is expected.
OPTION_CHECKS = {
    "pos_weight": (_positive, "a positive number (the weight of the positive term)"),
    "delta": (_positive, "a positive number (where Huber's loss turns from quadratic to linear)"),
    "class_weights": (lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(map(_positive, v)),
                      "a list of positive numbers, one per class"),
    "label_smoothing": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1,
                        "a number in [0, 1) (the share of each row's target spread over the classes)"),
}


def check_loss_options(loss: str, options, key: str = "model.loss_options") -> dict:
    """`options` of loss `loss` as numbers (floats, a list of floats), or a ConfigError naming `key.OPTION` and
    the options `loss` takes."""
    if not isinstance(options, dict):
        raise ConfigError(f"{key} is {options!r}, expected a mapping of {loss}'s options {list(LOSS_OPTIONS[loss])}")
    checked = {}
    for name, value in options.items():
        if name not in LOSS_OPTIONS[loss]:
            takes = f"one of {list(LOSS_OPTIONS[loss])}" if LOSS_OPTIONS[loss] else "none"
            raise ConfigError(f"unknown key {key}.{name} for loss {loss}; expected {takes}")
        ok, expected = OPTION_CHECKS[name]
        if not ok(value):
            raise ConfigError(f"{key}.{name} is {value!r}, expected {expected}")
        checked[name] = [float(v) for v in value] if name == "class_weights" else float(value)
    return checked


def loss_with_options(loss: str, options: dict | None = None, xp=np):
    """Loss `loss` as (logits, targets, ws) -> (mean loss, correct, gradient) with its checked `options` bound
    (class weights as a float64 array of `xp`, made once)."""
    options = check_loss_options(loss, options or {})
    if "class_weights" in options:
        options["class_weights"] = xp.asarray(options["class_weights"], dtype=np.float64)
    return functools.partial(LOSSES[loss], **options) if options else LOSSES[loss]


def check_loss_fits(loss: str, target_kind: str, where: str) -> None:
    """A ConfigError (one line, naming `where`) unless loss `loss` fits targets of kind `target_kind`."""
    if target_kind not in TARGET_KINDS:
        raise ConfigError(f"{where}: the dataset's target is {target_kind!r}, expected one of {list(TARGET_KINDS)}")
    if loss not in LOSS_TARGETS:
        raise ConfigError(f"{where}: model.loss is {loss!r}, expected one of {list(LOSS_TARGETS)}")
    if LOSS_TARGETS[loss] != target_kind:
        fitting = [name for name, kind in LOSS_TARGETS.items() if kind == target_kind]
        raise ConfigError(f"{where}: model.loss is {loss}, but the dataset's target is {target_kind} "
                          f"({TARGET_KINDS[target_kind]}); expected {' or '.join(fitting)}")
