"""The data's units and the model's: what a model's outputs are in, and how they come back to the user's numbers.

    units = target_units(manifest, standardize_targets=True)   # a regression target: its train mean and std
    units = output_units(manifest, normalize, standardize_targets, reconstruction, loss)  # what outputs are in
    y_model = units.to_model(y)                                 # what the loss sees
    values = units.to_data(outputs)                             # what eval's metrics, predict and the export give

A regression target is trained standardized by default (`data.standardize_targets`, like scikit-learn's
TransformedTargetRegressor): a target in the hundreds no longer needs the output layer to climb there at the
learning rate's pace. The statistics are the train split's, per target column, from the manifest (`target_mean`,
`target_std`, which the ETL records). An autoencoder's reconstruction is the model's input, standardized when
`data.normalize` is on: `input_units` takes it back to the values as stored (after the manifest's scale and
offset), so its MSE is comparable with the data's own variance or with PCA on it. Every other target is its own
units (`IDENTITY`).

The map is affine per output column, data = model * std + mean, the same in the ONNX export (a Mul and an Add after
the values, `mpitrain.rundir.export`), so Spark scoring through the export gives data units too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpitrain.base.arrays import array_module


@dataclass(frozen=True)
class Units:
    """data = model * std + mean, per output column (numbers or arrays of the outputs' width); `None`: the identity."""

    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    @property
    def identity(self) -> bool:
        return self.mean is None

    def to_model(self, values, out=None):
        """`values` in data units as the model's: (values - mean) / std, into `out` when given (it may be `values`)."""
        if self.identity:
            if out is not None and out is not values:
                out[...] = values
            return values if out is None else out
        xp = array_module(values)
        out = xp.subtract(values, xp.asarray(self.mean, dtype=values.dtype), out=out)
        return xp.divide(out, xp.asarray(self.std, dtype=values.dtype), out=out)

    def to_data(self, values):
        """The model's `values` in data units (a new array; `values` itself for the identity)."""
        if self.identity:
            return values
        xp = array_module(values)
        return values * xp.asarray(self.std, dtype=values.dtype) + xp.asarray(self.mean, dtype=values.dtype)


IDENTITY = Units()


def target_units(manifest, standardize_targets: bool) -> Units:
    """A dataset's target units: its regression target's train mean and std when `standardize_targets` and the
    manifest records them, else the identity (class, binary and multilabel targets are labels, not numbers)."""
    if manifest.target != "regression" or not standardize_targets or not manifest.target_mean:
        return IDENTITY
    return Units(np.asarray(manifest.target_mean, np.float64), np.asarray(manifest.target_std, np.float64))


def input_units(manifest, normalize: bool) -> Units:
    """The units of a model's input back to the values as stored (after the manifest's scale and offset): its mean
    and std when `normalize` standardized them (as `mpitrain.data.reader.input_scaling` does); the identity for a
    table's rows (they go in as stored) and without `normalize`."""
    if not normalize or manifest.columns:
        return IDENTITY
    return Units(np.float64(manifest.mean), np.float64(manifest.std))


def output_units(manifest, normalize: bool, standardize_targets: bool, reconstruction: bool = False,
                 loss: str = "") -> Units:
    """The units a model's outputs are scored, predicted and exported in: an autoencoder's (`reconstruction`) its
    input's as stored (under binary_cross_entropy its outputs are probabilities of inputs in [0, 1], kept as they
    are), else its target's."""
    if reconstruction:
        return IDENTITY if loss == "binary_cross_entropy" else input_units(manifest, normalize)
    return target_units(manifest, standardize_targets)
