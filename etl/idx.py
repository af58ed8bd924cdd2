"""IDX files (the MNIST / Fashion-MNIST format), plain or gzipped.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the records. Only the uint8
types are read: images (0x00000803, count x rows x cols) and labels (0x00000801).
"""
from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from mpitrain.base.errors import DataError

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
# split name -> file name prefix; MNIST calls its test split "t10k"
SPLIT_PREFIXES = {"train": "train", "test": "t10k"}


@dataclass(frozen=True)
class IdxHeader:
    """One validated IDX file: `count` records of `row_shape` uint8 values from byte `offset`."""

    path: str
    count: int
    row_shape: tuple[int, ...]
    offset: int

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape)


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _data_size(path: str) -> int:
    """Size of the (decompressed) file in bytes; a gzip file is streamed, never held in memory."""
    if not path.endswith(".gz"):
        return os.path.getsize(path)
    size = 0
    with gzip.open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            size += len(block)
    return size


def read_header(path: str, magic: int) -> IdxHeader:
    """Read and validate the header of `path`, which must have `magic`, against the file size."""
    kind = "images" if magic == IMAGES_MAGIC else "labels"
    ndim = magic & 0xFF
    try:
        with _open(path) as f:
            head = f.read(4 + 4 * ndim)
        found = int.from_bytes(head[:4], "big") if len(head) >= 4 else None
        if found != magic:
            shown = "missing" if found is None else f"0x{found:08x}"
            raise DataError(f"{path}: magic number {shown}, expected 0x{magic:08x} (IDX uint8 {kind})")
        if len(head) < 4 + 4 * ndim:
            raise DataError(f"{path}: header ends early, expected {ndim} dimension sizes")
        dims = struct.unpack(f">{ndim}I", head[4:])
        if not all(dims):
            raise DataError(f"{path}: dimensions {list(dims)}, expected all > 0")
        header = IdxHeader(path, dims[0], tuple(dims[1:]), 4 + 4 * ndim)
        size = _data_size(path)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot read IDX {kind} ({e})") from None
    expected = header.offset + header.count * header.row_bytes
    if size != expected:
        raise DataError(f"{path}: {size} bytes, expected {expected} for {header.count} records "
                        f"of shape {list(header.row_shape)} (truncated or corrupt file)")
    return header


def read_records(header: IdxHeader, start: int, stop: int) -> np.ndarray:
    """Records [start, stop) as uint8 of shape (stop - start, *row_shape).

    A plain file is seeked; a gzip file is decompressed from the start and skipped.
    """
    if not 0 <= start <= stop <= header.count:
        raise ValueError(f"{header.path}: records [{start}, {stop}) outside [0, {header.count})")
    want = (stop - start) * header.row_bytes
    try:
        with _open(header.path) as f:
            f.seek(header.offset + start * header.row_bytes)
            data = f.read(want)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{header.path}: cannot read records [{start}, {stop}) ({e})") from None
    if len(data) != want:
        raise DataError(f"{header.path}: records [{start}, {stop}) end early; the file changed or is truncated")
    return np.frombuffer(data, np.uint8).reshape(stop - start, *header.row_shape)


def _find(folder: str, name: str) -> str:
    """The plain file if present, else the gzipped one."""
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    raise DataError(f"{folder}: no {name} or {name}.gz; expected an IDX folder "
                    f"({', '.join(p + '-images-idx3-ubyte[.gz]' for p in SPLIT_PREFIXES.values())} and labels)")


def find_splits(folder: str) -> dict[str, tuple[IdxHeader, IdxHeader]]:
    """Validated (images, labels) headers per split `train` and `test` of an IDX folder."""
    if not os.path.isdir(folder):
        raise DataError(f"{folder}: no such folder; expected a folder of IDX files")
    splits = {}
    for split, prefix in SPLIT_PREFIXES.items():
        images = read_header(_find(folder, f"{prefix}-images-idx3-ubyte"), IMAGES_MAGIC)
        labels = read_header(_find(folder, f"{prefix}-labels-idx1-ubyte"), LABELS_MAGIC)
        if images.count != labels.count:
            raise DataError(f"{labels.path}: {labels.count} labels, expected {images.count} "
                            f"like {os.path.basename(images.path)}")
        splits[split] = (images, labels)
    return splits
