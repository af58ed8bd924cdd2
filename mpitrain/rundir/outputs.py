"""What `mpitrain eval` and `predict` leave behind, written by rank 0 (`mpitrain.training.trained` calls these):
the evaluation as JSON with its picture, and predictions as HDF5. Each file is complete or absent
(`mpitrain.base.files.write_file`).

Predictions by target kind (n rows; k the manifest's `outputs`; attributes: the provenance, `target`, and for
other targets than class `target_names`, the names of the k columns):

    class       predicted int32 (n,) the class     probabilities float32 (n, K)    label int32 (n,)
    binary      predicted int32 (n, 1) 0/1         probabilities float32 (n, 1)    label float32 (n, 1)
    multilabel  predicted int32 (n, k) 0/1         probabilities float32 (n, k)    label float32 (n, k)
    regression  predicted float32 (n, k) values                                    label float32 (n, k)
    reconstruction  predicted float32 (n, f) the reconstructed input               label float32 (n, f) the input

An autoencoder's (`model.target: reconstruction`) f columns are the input's features, flattened, as the model reads
them (after `data.normalize`); its `target_names` are `feature J`.

New raw records (`mpitrain predict RUN --records PATH`) have no `label`; `row` int64 (n,) holds each prediction's
record index among the records instead (records that could not be encoded are left out).

`predicted` is `mpitrain.training.scores.decisions` of the probabilities (binary and multilabel: probability
above 0.5); regression's values are in the target's own units.
"""
from __future__ import annotations

import json

import numpy as np

from mpitrain.base.files import os_errors, write_file, write_hdf5
from mpitrain.rundir.report import class_names, write_confusion_png, write_curves_png, write_scatter_png


def write_evaluation(json_path: str, picture: str, result: dict, provenance: dict, manifest, title: str,
                     curves: list[dict] | None = None, values: tuple | None = None,
                     names: list[str] | None = None) -> None:
    """`result` (Evaluation.to_dict()) and its `provenance` as JSON at `json_path`, and its picture at `picture`
    titled `title`: for class targets the confusion matrix, its classes named as the manifest names them; for
    binary and multilabel targets ROC and precision-recall `curves` (`mpitrain.training.scores.curves`, one per
    column); for regression the (labels, predictions) `values` drawn against each other, their columns `names`
    (default: `target_names`)."""
    write_file(json_path, lambda f: json.dump({**provenance, **result}, f, indent=2))
    with os_errors(picture, "drawing the evaluation's picture"):
        if "confusion" in result:
            write_confusion_png(np.array(result["confusion"]), names_of(manifest), picture, title)
        elif curves is not None:
            write_curves_png(curves, target_names(manifest), result, picture, title)
        elif values is not None:
            write_scatter_png(*values, names or target_names(manifest), result, picture, title)


def names_of(manifest) -> list[str]:
    """The class names of a dataset: the manifest's, or those its source is known to have."""
    return manifest.class_names or class_names(manifest.source, manifest.num_classes)


def target_names(manifest) -> list[str]:
    """The names of the columns of a target other than class: the manifest's `target_names`, else `output J`
    (binary: `positive`)."""
    return list(manifest.target_names) or (["positive"] if manifest.target == "binary" else
                                           [f"output {j}" for j in range(manifest.outputs)])


def output_names(manifest, target: str) -> list[str]:
    """The names of a prediction's columns for a target kind other than class: `target_names`, or an autoencoder's
    (`reconstruction`) `feature J`, one per input feature."""
    if target == "reconstruction":
        return [f"feature {j}" for j in range(int(np.prod(manifest.feature_shape)))]
    return target_names(manifest)


def write_predictions(path: str, target: str, predicted: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None,
                      provenance: dict, names: list[str] | None = None, per_step: bool = False,
                      rows: np.ndarray | None = None) -> None:
    """Every row's prediction, the model's outputs and the true labels (see the module docstring for each target
    kind; None: new records without labels), with their provenance, the target kind and the target's column `names`
    as attributes; `rows`, where given, each prediction's record index (dataset `row`). A model with a class per step
    (`per_step`, attribute `per_step`) has one row per valid step, in row order then step order."""
    def fill(h5):
        h5.create_dataset("predicted", data=predicted)
        if target not in ("regression", "reconstruction"):
            h5.create_dataset("probabilities", data=outputs)
        if labels is not None:
            h5.create_dataset("label", data=labels)
        if rows is not None:
            h5.create_dataset("row", data=rows)
        h5.attrs.update(provenance)
        h5.attrs["target"] = target
        h5.attrs["per_step"] = per_step
        if target != "class":
            h5.attrs["target_names"] = names
    write_hdf5(path, fill)
