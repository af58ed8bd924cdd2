"""`idx:/folder`: MNIST-format IDX files (plain or .gz), splits train and test (`mpitrain.etl.idx` reads them)."""
from __future__ import annotations

import os

from mpitrain.base.errors import DataError
from mpitrain.etl.idx import find_splits, read_records
from mpitrain.etl.records import checked_batch
from mpitrain.etl.sources.base import RangeSource


class IdxSource(RangeSource):
    """An IDX folder with splits `train` and `test`; images become [1, rows, cols] scaled by 1/255."""

    scheme, usage = "idx", "idx:/folder (MNIST-format IDX files, plain or .gz)"

    @classmethod
    def open(cls, spec, argument, options):
        return cls(spec, os.path.abspath(argument))  # tasks may run elsewhere, in another folder

    def __init__(self, spec: str, folder: str):
        self.headers = find_splits(folder)
        train_images = self.headers["train"][0]
        for images, _ in self.headers.values():
            if images.row_shape != train_images.row_shape:
                raise DataError(f"{images.path}: images of shape {list(images.row_shape)}, expected "
                                f"{list(train_images.row_shape)} like {train_images.path}")
        super().__init__(spec, (1, *train_images.row_shape), 1 / 255, 10)

    def known_rows(self) -> dict[str, int]:
        return {split: images.count for split, (images, _) in self.headers.items()}

    def read_range(self, split, start, stop):
        images, labels = self.headers[split]
        x = read_records(images, start, stop).reshape(stop - start, *self.feature_shape)
        return checked_batch(x, read_records(labels, start, stop), self.num_classes, labels.path,
                             lambda i: start + i)
