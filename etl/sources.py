"""ETL sources, chosen by the `--source` string (`idx:/folder`, `digits:`).

A source says how its features are stored (shape, uint8, scale/offset to floats) and
how many rows each split has; Spark tasks call `read(split, start, stop)` to load only
their own rows, so the driver never holds the dataset. Sources are pickled into tasks.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod

import numpy as np

from mpitrain.errors import ConfigError, DataError
from mpitrain.etl.idx import find_splits, read_records

KNOWN_SOURCES = ("idx:/folder (MNIST-format IDX files, plain or .gz)",
                 "digits: (scikit-learn's bundled 8x8 digits)")


class Source(ABC):
    """Features stored as uint8; `value * scale + offset` gives the float a model sees."""

    feature_dtype = "uint8"
    offset = 0.0

    def __init__(self, spec: str, feature_shape: tuple[int, ...], scale: float, num_classes: int):
        self.spec = spec
        self.feature_shape = feature_shape
        self.scale = scale
        self.num_classes = num_classes

    @abstractmethod
    def split_rows(self) -> dict[str, int]:
        """Rows per split, in manifest order."""

    @abstractmethod
    def read(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [start, stop) of `split`: features (rows, *feature_shape) uint8 and valid labels."""

    def _checked_labels(self, labels: np.ndarray, where: str, records: np.ndarray) -> np.ndarray:
        """`labels` if all are in [0, num_classes); `records` are their record numbers in `where`."""
        bad = np.flatnonzero((labels < 0) | (labels >= self.num_classes))
        if bad.size:
            raise DataError(f"{where}: label {labels[bad[0]]} at record {records[bad[0]]}, "
                            f"expected 0..{self.num_classes - 1}")
        return labels


class IdxSource(Source):
    """An IDX folder with splits `train` and `test`; images become [1, rows, cols] scaled by 1/255."""

    def __init__(self, spec: str, folder: str):
        self.headers = find_splits(folder)
        train_images = self.headers["train"][0]
        for images, _ in self.headers.values():
            if images.row_shape != train_images.row_shape:
                raise DataError(f"{images.path}: images of shape {list(images.row_shape)}, expected "
                                f"{list(train_images.row_shape)} like {train_images.path}")
        super().__init__(spec, (1, *train_images.row_shape), 1 / 255, 10)

    def split_rows(self) -> dict[str, int]:
        return {split: images.count for split, (images, _) in self.headers.items()}

    def read(self, split, start, stop):
        images, labels = self.headers[split]
        x = read_records(images, start, stop).reshape(stop - start, *self.feature_shape)
        return x, self._checked_labels(read_records(labels, start, stop), labels.path, np.arange(start, stop))


class DigitsSource(Source):
    """scikit-learn's `load_digits` (1797 rows, values 0..16 scaled by 1/16).

    It has no test split, so one is cut here: a `test_fraction` of the rows, drawn with `seed`.
    """

    def __init__(self, spec: str, seed: int, test_fraction: float):
        n = len(_load_digits().target)
        n_test = round(n * test_fraction) if 0 < test_fraction < 1 else 0
        if not 0 < n_test < n:
            raise ConfigError(f"--test-fraction {test_fraction}: gives {n_test} of {n} rows to the test "
                              "split, expected a fraction leaving both splits non-empty")
        order = np.random.default_rng(seed).permutation(n)
        self.indices = {"train": np.sort(order[n_test:]), "test": np.sort(order[:n_test])}
        super().__init__(spec, (1, 8, 8), 1 / 16, 10)

    def split_rows(self) -> dict[str, int]:
        return {split: len(indices) for split, indices in self.indices.items()}

    def read(self, split, start, stop):
        digits = _load_digits()
        rows = self.indices[split][start:stop]
        x = digits.images[rows].astype(np.uint8).reshape(len(rows), *self.feature_shape)
        return x, self._checked_labels(digits.target[rows], "sklearn load_digits", rows)


def _load_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("--source digits: needs scikit-learn (pip install scikit-learn)") from None
    return load_digits()


def open_source(spec: str, seed: int = 0, test_fraction: float = 0.2) -> Source:
    """Parse `--source` and open it (headers validated, no rows read)."""
    scheme, _, argument = spec.partition(":")
    if scheme == "idx" and argument:
        return IdxSource(spec, os.path.abspath(argument))  # tasks may run elsewhere, in another folder
    if scheme == "digits" and not argument:
        return DigitsSource(spec, seed, test_fraction)
    raise ConfigError(f"--source {spec!r}: expected one of: {'; '.join(KNOWN_SOURCES)}")
