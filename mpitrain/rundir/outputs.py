"""What `mpitrain eval` and `predict` leave behind, written by rank 0 (`mpitrain.training.trained` calls these):
the evaluation as JSON with its confusion-matrix picture, and predictions as HDF5. Each file is complete or
absent (`mpitrain.files.write_file`)."""
from __future__ import annotations

import json

import h5py
import numpy as np

from mpitrain.files import os_errors, write_file
from mpitrain.rundir.report import class_names, write_confusion_png


def write_evaluation(json_path: str, picture: str, result: dict, provenance: dict, manifest, title: str) -> None:
    """`result` (Evaluation.to_dict()) and its `provenance` as JSON at `json_path`; for class targets the confusion
    matrix, its classes named as the manifest names them, as a picture at `picture` titled `title`."""
    write_file(json_path, lambda f: json.dump({**provenance, **result}, f, indent=2))
    if "confusion" not in result:  # binary, multilabel, regression: their figures are in the JSON
        return
    with os_errors(picture, "drawing the confusion matrix"):
        write_confusion_png(np.array(result["confusion"]), names_of(manifest), picture, title)


def names_of(manifest) -> list[str]:
    """The class names of a dataset: the manifest's, or those its source is known to have."""
    return manifest.class_names or class_names(manifest.source, manifest.num_classes)


def write_predictions(path: str, predicted: np.ndarray, probabilities: np.ndarray, labels: np.ndarray,
                      provenance: dict) -> None:
    """Predicted classes, class probabilities and true labels of every row, with their provenance as attributes."""
    def write(f):
        with h5py.File(f, "w") as h5:
            h5.create_dataset("predicted", data=predicted)
            h5.create_dataset("probabilities", data=probabilities)
            h5.create_dataset("label", data=labels)
            h5.attrs.update(provenance)
    write_file(path, write, binary=True)
