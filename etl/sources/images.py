"""`images:/folder`: one sub-folder per class (`CLASS_NAME/*.png|jpg`), read by Spark, decoded by Pillow.

Class indices follow the sorted class folder names (recorded in the manifest as `class_names`).
Every image is converted to grayscale or RGB and resized to `--image-size` (bilinear), giving
uint8 features of shape [channels, height, width] (NCHW), scaled by 1/255. A file Pillow cannot
decode, or an image outside the class folders, is a bad record.
"""
from __future__ import annotations

import io
import os

import numpy as np

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.etl.records import BadRecords, ReadBatch, checked_batch
from mpitrain.etl.sources.base import Source, SourceOptions, split_paths

EXTENSIONS = "*.{png,PNG,jpg,JPG,jpeg,JPEG}"
MODES = {"gray": ("L", 1), "rgb": ("RGB", 3)}


class ImageFolderSource(Source):
    """Class folders of PNG/JPEG images; `--test FOLDER` gives a test split with the same class folders."""

    keys = ("path",)
    scheme, usage = "images", "images:/folder (CLASS_NAME/*.png|jpg)"
    separate_test = unlabeled_records = True

    def __init__(self, spec: str, folder: str, options: SourceOptions):
        self.paths = split_paths(spec, folder, options)
        self.splits = tuple(self.paths)
        if options.color not in MODES:
            raise ConfigError(f"--color {options.color}: expected one of {tuple(MODES)}")
        if len(options.image_size) != 2 or min(options.image_size) < 1:
            raise ConfigError(f"--image-size {options.image_size}: expected HEIGHTxWIDTH, e.g. 28x28 "
                              "(every image is resized to it)")
        self.labeled = options.labeled
        self.class_names = list(options.class_names) or sorted(entry.name for entry in os.scandir(self.paths["train"])
                                                               if entry.is_dir())
        if len(self.class_names) < 2 and self.labeled:
            raise DataError(f"{self.paths['train']}: {len(self.class_names)} class folders, expected at least 2 "
                            "(CLASS_NAME/*.png|jpg)")
        self.mode, channels = MODES[options.color]
        super().__init__(spec, (channels, *options.image_size), 1 / 255, len(self.class_names))

    def frame(self, spark, split):
        return spark.read.format("binaryFile").option("pathGlobFilter", EXTENSIONS) \
            .option("recursiveFileLookup", "true").load(self.paths[split]).select("path", "content")

    def convert(self, split: str, batch) -> ReadBatch:
        """Decode each image; labelled by its class folder (unlabeled records: any folder)."""
        paths = batch.column(0).to_pylist()
        contents = batch.column(1)
        index = {name: i for i, name in enumerate(self.class_names)}
        x = np.empty((len(paths), *self.feature_shape), np.uint8)
        labels = np.full(len(paths), -1, np.int64)
        decoded = np.zeros(len(paths), bool)
        bad, problems = BadRecords(), {}
        for i, path in enumerate(paths):
            class_name = path.rstrip("/").split("/")[-2]
            if self.labeled and class_name not in index:
                problems[i] = f"{path}: in folder {class_name!r}, expected one of the class folders {self.class_names}"
                continue
            try:
                x[i] = self._decode(contents[i].as_py())
                labels[i], decoded[i] = index.get(class_name, -1), True
            except (OSError, ValueError, SyntaxError) as e:  # Pillow's errors for files it cannot decode
                problems[i] = f"{path}: cannot decode the image ({e})"
        failed = np.array(sorted(problems), np.int64)
        bad.add(failed, lambda i: problems[int(i)])
        positions = np.flatnonzero(decoded)
        batch = checked_batch(x[positions], labels[positions] if self.labeled else None, self.num_classes,
                              self.paths[split], lambda i: positions[i], bad, positions=positions)
        batch.seen = len(paths)
        return batch

    def _decode(self, data: bytes) -> np.ndarray:
        from PIL import Image
        with Image.open(io.BytesIO(data)) as image:
            height, width = self.feature_shape[1:]
            pixels = np.asarray(image.convert(self.mode).resize((width, height), Image.Resampling.BILINEAR))
        return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
