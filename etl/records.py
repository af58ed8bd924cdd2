"""What a source's read task hands to the job: a batch of good rows, and its bad records counted.

A bad record (an unparsable line, a missing or non-finite value, a label that is not a class,
an image Pillow cannot decode) is dropped from the batch, counted, and the first few are kept
as one-line descriptions, so the job can print a sample and fail above `--max-bad-fraction`.
"""
from __future__ import annotations


from dataclasses import dataclass, field

import numpy as np

from mpitrain.kernels.rows import flat_rows

SAMPLES = 5  # bad records described per batch and in the job's message


@dataclass
class BadRecords:
    """How many records were bad, and descriptions of the first few."""

    count: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, rows, describe) -> None:
        """Count the bad `rows`; `describe(row)` is called for the first few only."""
        self.samples.extend(describe(row) for row in rows[:SAMPLES - len(self.samples)])
        self.count += len(rows)

    def merge(self, other: BadRecords) -> BadRecords:
        self.count += other.count
        self.samples.extend(other.samples[:SAMPLES - len(self.samples)])
        return self


@dataclass
class ReadBatch:
    """Good rows read by one task: features (rows, *feature_shape) and int32 labels (-1: unlabeled); `seen`
    counts bad ones too; `kept` are the good rows' positions in the record batch they came from (scoring
    copies their key columns)."""

    x: np.ndarray
    y: np.ndarray
    seen: int
    bad: BadRecords
    kept: np.ndarray | None = None


def checked_batch(x: np.ndarray, labels: np.ndarray | None, num_classes: int | None, where: str, record,
                  bad: BadRecords | None = None, feature_dtype: str | None = None,
                  positions: np.ndarray | None = None) -> ReadBatch:
    """Keep the rows whose label is a class index and whose features are finite (and fit `feature_dtype`).

    `record(i)` names row i in messages (a record number, the leading values); `bad` holds records
    the source already rejected. Features are converted to `feature_dtype` (default: unchanged).
    `labels` None: unlabeled rows (scoring), labelled -1. `positions`: each row's position in its
    record batch (default 0, 1, ...), kept for the good rows.
    """
    bad = bad or BadRecords()
    label_ok = np.ones(len(x), bool)
    if labels is not None:
        labels = np.asarray(labels)
        label_ok = np.isfinite(labels) if labels.dtype.kind == "f" else label_ok
        label_ok &= labels >= 0
        if labels.dtype.kind == "f":
            label_ok &= labels == np.floor(np.where(label_ok, labels, 0))
        if num_classes is not None:
            label_ok &= labels < num_classes
        expected = f"0..{num_classes - 1}" if num_classes is not None else "an integer >= 0"
        bad.add(np.flatnonzero(~label_ok),
                lambda i: f"{where}: label {labels[i]} at record {record(i)}, expected {expected}")
    features = flat_rows(x)
    feature_ok = np.ones(len(x), bool)
    if feature_dtype == "uint8" and features.dtype != np.uint8:  # NaN and Inf fail these comparisons too
        feature_ok = ((features >= 0) & (features <= 255) & (features == np.floor(features))).all(axis=1)
    elif features.dtype.kind == "f":
        feature_ok = np.isfinite(features).all(axis=1)
    wanted = "integers 0..255" if feature_dtype == "uint8" else "finite numbers"
    bad.add(np.flatnonzero(label_ok & ~feature_ok),
            lambda i: f"{where}: a missing or invalid feature at record {record(i)}, expected {wanted}")
    good = label_ok & feature_ok
    x = x[good] if not good.all() else x
    y = labels[good].astype(np.int32) if labels is not None else np.full(len(x), -1, np.int32)
    kept = np.flatnonzero(good) if positions is None else np.asarray(positions)[good]
    return ReadBatch(x.astype(feature_dtype or x.dtype, copy=False), y, len(good), bad, kept)
