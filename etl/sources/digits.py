"""`digits:`: scikit-learn's bundled 8x8 digits (1797 rows); the job carves its test split."""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import ConfigError
from mpitrain.etl.records import checked_batch
from mpitrain.etl.sources.base import RangeSource


class DigitsSource(RangeSource):
    """scikit-learn's `load_digits` (1797 rows, values 0..16 scaled by 1/16); the job carves its test split."""

    splits = ("train",)
    scheme, usage, takes_path = "digits", "digits: (scikit-learn's bundled 8x8 digits)", False

    @classmethod
    def open(cls, spec, argument, options):
        return cls(spec)

    def __init__(self, spec: str):
        super().__init__(spec, (1, 8, 8), 1 / 16, 10)

    def known_rows(self) -> dict[str, int]:
        return {"train": len(_load_digits().target)}

    def read_range(self, split, start, stop):
        digits = _load_digits()
        x = digits.images[start:stop].astype(np.uint8).reshape(stop - start, *self.feature_shape)
        return checked_batch(x, digits.target[start:stop], self.num_classes, "sklearn load_digits",
                             lambda i: start + i)


def _load_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("--source digits: needs scikit-learn (pip install scikit-learn)") from None
    return load_digits()
