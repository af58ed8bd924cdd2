"""Reading a split's blocks (whole HDF5 chunks of its shards) from a folder or an object store, checked as they arrive.

    shards = ShardFiles(storage, manifest, "train", verify_checksums=True)
    shards.read(blocks, piece, x_out, y_out, ids_out)     # rows piece.lo..piece.hi of one block
    shards.rows_read, shards.bytes_read          # what came from storage: whole chunks

A shard is opened when a block of it is first needed and kept open (at most `OPEN_SHARDS`
of them, least recently used closed first), with HDF5's chunk cache off: a block is decoded
straight into the caller's array, and nothing is cached twice. Each read fetches and decodes
whole chunks (a piece of a block still costs its chunk): `rows_read` counts their rows and
`bytes_read` their stored (compressed) bytes, `x`, `y` and `ids` together; from a remote store
`bytes_fetched` counts every byte the responses carried (HDF5's metadata reads included).

Checks, as rows arrive: shards written with per-chunk Fletcher-32 checksums (the manifest
says `checksums: fletcher32`) are verified by HDF5 on every chunk read; for older shards
the whole file's sha256 is checked against the manifest when the shard is first opened
(`data.verify_checksums`). Shapes and dtypes are checked at open, labels, finite
features and ids within their columns after each read. A shard that is missing, fails its checksum or cannot be read is
one `DataError` naming the file and the rows.
"""
from __future__ import annotations

from collections import OrderedDict

import h5py
import numpy as np

from mpitrain.data.order import Blocks, Piece
from mpitrain.data.sequences import MAX_LENGTH, RaggedBuffer
from mpitrain.data.shards import MANIFEST_NAME, Manifest, check_structure, verify_sha256
from mpitrain.data.storage import Storage
from mpitrain.kernels.rows import all_finite
from mpitrain.base.errors import DataError, describe

OPEN_SHARDS = 16


class ShardFiles:
    """The shards of one split of a dataset, opened on demand, read by block. Not a collective; one thread at a
    time (the batch thread while training)."""

    def __init__(self, storage: Storage, manifest: Manifest, split: str, verify_checksums: bool = True):
        self.storage, self.manifest = storage, manifest
        self.shards = manifest.shards(split)
        self.verify_whole_file = verify_checksums and manifest.checksums != "fletcher32"
        # shard index -> (x, y, the stored bytes of their chunks starting at a row, h5py.File, raw file or None)
        self.open_files: OrderedDict[int, tuple] = OrderedDict()
        self.checked: set[int] = set()
        self.shortest = {c["name"]: 0 for c in manifest.sequences if c.get("bag")}  # a bag may be empty, no other
        self.rows_read, self.bytes_read = 0, 0
        self.bytes_fetched = 0  # a remote store: every byte its responses carried, HDF5's metadata included

    def read(self, blocks: Blocks, piece: Piece, x_out: np.ndarray, y_out: np.ndarray, ids_out: np.ndarray,
             sequences: dict[str, RaggedBuffer] | None = None, row: int = 0) -> None:
        """Rows [piece.lo, piece.hi) of block `piece.block` into x_out, y_out and ids_out (arrays of piece.hi -
        piece.lo rows; ids_out (rows, 0) without categorical columns) and, for a dataset of sequence columns, their
        sequences into `sequences` (one `RaggedBuffer` per column) as its rows `row`.. on."""
        index = int(blocks.shard[piece.block])
        start = int(blocks.start[piece.block])
        x, y, ids, chunk_bytes, stored_sequences = self._datasets(index)
        path = self.storage.path(self.shards[index].path)
        lo, hi = start + piece.lo, start + piece.hi
        try:
            if x_out.size:  # (rows, 0): a dataset of sequence or categorical columns without numbers
                x.read_direct(x_out, np.s_[lo:hi])
            if ids_out.size:
                ids.read_direct(ids_out, np.s_[lo:hi])
            y.read_direct(y_out, np.s_[lo:hi])
            self.bytes_read += chunk_bytes(start)
            for name, (values, offsets) in stored_sequences.items():
                bounds = offsets[lo:hi + 1]
                _check_offsets(path, name, bounds, lo, len(values), self.shortest.get(name, 1))
                out = sequences[name].space(row, bounds)
                if len(out):
                    values.read_direct(out, np.s_[bounds[0]:bounds[-1]])
                if out.dtype.kind == "f" and not all_finite(out):
                    raise DataError(f"{path}: sequence column {name!r} holds NaN or Inf in rows {lo}..{hi - 1}; "
                                    "expected finite values")
                self.bytes_read += out.nbytes + bounds.nbytes
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: rows {lo}..{hi - 1} could not be read ({describe(e) if isinstance(e, OSError) else e}); "
                            "the chunk fails its checksum or the shard is damaged or gone") from None
        self.rows_read += int(blocks.rows[piece.block])
        check_values(path, x_out, y_out, ids_out, self.manifest)

    def close(self) -> None:
        while self.open_files:
            self._close(next(iter(self.open_files)))

    def _datasets(self, index: int) -> tuple:
        """Shard `index`'s datasets x, y and ids (None without categorical columns), the stored bytes of their chunks
        (`_chunk_bytes`) and its sequence columns' (values, offsets) by name, opened and checked on first use (h5py
        objects kept: reading them again creates nothing)."""
        if index in self.open_files:
            self.open_files.move_to_end(index)
            return self.open_files[index][:5]
        shard = self.shards[index]
        path = self.storage.path(shard.path)
        if self.verify_whole_file and index not in self.checked:
            verify_sha256(self.storage, shard)
            self.checked.add(index)
        local = self.storage.local_path(shard.path)
        raw = None
        try:
            if local is not None:
                f = h5py.File(local, "r", rdcc_nbytes=0)
            else:
                raw = _Counted(self.storage.open(shard.path), self)
                f = h5py.File(raw, "r", rdcc_nbytes=0)
        except FileNotFoundError:
            raise DataError(f"{path}: shard listed in {MANIFEST_NAME} is missing") from None
        except OSError as e:
            if raw is not None:
                raw.close()
            raise DataError(f"{path}: not a readable shard ({describe(e)})") from None
        try:
            check_structure(f, path, self.manifest, shard)
        except DataError:
            f.close()
            raise
        sequences = {column["name"]: (f[f"sequences/{column['name']}/values"],
                                      f[f"sequences/{column['name']}/offsets"])
                     for column in self.manifest.stored_sequences}
        fixed = [f["x"], f["y"], f["ids"] if self.manifest.id_columns else None]
        self.open_files[index] = (*fixed, _chunk_bytes(*filter(None, fixed)), sequences, f, raw)
        if len(self.open_files) > OPEN_SHARDS:
            self._close(next(iter(self.open_files)))
        return self.open_files[index][:5]

    def _close(self, index: int) -> None:
        *_, f, raw = self.open_files.pop(index)
        f.close()
        if raw is not None:
            raw.close()


class _Counted:
    """A remote file object for h5py that adds the bytes read through it to `owner.bytes_fetched`."""

    def __init__(self, raw, owner: ShardFiles):
        self.raw, self.owner = raw, owner

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        self.owner.bytes_fetched += n
        return n

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.owner.bytes_fetched += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.raw.close()


def _chunk_bytes(*datasets):
    """A function of a row giving the stored bytes of the datasets' chunks that start at it (of the whole datasets
    when unchunked). What it asks of h5py is looked up once, here: each h5py property read makes objects."""
    parts = []
    for dataset in datasets:
        if dataset.chunks is None:
            parts.append((None, dataset.id.get_storage_size(), ()))
        else:
            parts.append((dataset.id, 0, (0,) * (dataset.ndim - 1)))

    def stored(first_row: int) -> int:
        return sum(size if dsid is None else int(dsid.get_chunk_info_by_coord((first_row, *tail)).size)
                   for dsid, size, tail in parts)
    return stored


def _check_offsets(path: str, name: str, offsets: np.ndarray, first_row: int, steps: int, shortest: int) -> None:
    """Offsets of a sequence column that ascend within its stored steps, with every sequence `shortest`..`MAX_LENGTH`
    long (shortest 0: a bag column's), or one DataError naming the shard, the column and the row."""
    lengths = np.diff(offsets)
    bad = (lengths < shortest) | (lengths > MAX_LENGTH)
    if offsets[0] < 0 or offsets[-1] > steps or bad.any():
        row = first_row + int(np.argmax(bad)) if bad.any() else first_row
        raise DataError(f"{path}: sequence column {name!r} has offsets out of order or range at row {row} "
                        f"(stored steps: {steps}); expected ascending offsets, each sequence {shortest}..{MAX_LENGTH} "
                        "steps")


def check_values(path: str, x: np.ndarray, y: np.ndarray, ids: np.ndarray, manifest: Manifest) -> None:
    """Labels that fit the target (class: 0..num_classes-1; binary and multilabel: 0 or 1; regression: finite),
    finite float features and each categorical column's ids in 0..ids-1, or one DataError naming the shard."""
    if manifest.target == "class":
        bad = (y < 0) | (y >= manifest.num_classes)
        expected = f"0..{manifest.num_classes - 1}"
    elif manifest.target in ("binary", "multilabel"):
        bad = (y != 0) & (y != 1)
        expected = "0 or 1"
    else:
        bad = ~np.isfinite(y)
        expected = "a finite number"
    if bad.any():
        raise DataError(f"{path}: label {y[bad][0]:g} out of range for a {manifest.target} target; expected {expected}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise DataError(f"{path}: features contain NaN or Inf; expected finite values")
    if ids.size:
        low, high = ids.min(axis=0), ids.max(axis=0)
        for j, column in enumerate(manifest.columns["categorical"]):
            if low[j] < 0 or high[j] >= column["ids"]:
                raise DataError(f"{path}: categorical column {column['name']!r} holds id "
                                f"{low[j] if low[j] < 0 else high[j]}, expected 0..{column['ids'] - 1} (its ids in "
                                f"{MANIFEST_NAME})")
