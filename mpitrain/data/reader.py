"""Each rank's rows of a split: which rows, reading them from the shards, and batches.

    reader = DatasetReader("data/fashion", comm)        # the manifest; this rank's rows on demand
    rows = reader.rows("train", training=True)

The global row space of a split is its shards in manifest order. For training it is cut
into `world_size` equal contiguous ranges (the remainder is dropped and logged), so every
rank runs the same number of steps and no collective waits for a rank that has finished.
For evaluation every row counts, so the ranges may differ in length by one.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import h5py
import numpy as np

from mpitrain.data.augment import augment_images
from mpitrain.errors import DataError, describe
from mpitrain.kernels.rows import gather_scaled, scaled, sort_in_place
from mpitrain.nn.workspace import Workspace, WorkspacePart
from mpitrain.data.shards import MANIFEST_NAME, Manifest, check_shard, read_manifest, sha256_file

log = logging.getLogger(__name__)


def rows_for_rank(n_rows: int, rank: int, size: int) -> range:
    """Equal contiguous training rows of `rank`; the last n_rows % size rows go to nobody."""
    per_rank = n_rows // size
    return range(rank * per_rank, (rank + 1) * per_rank)


def eval_rows_for_rank(n_rows: int, rank: int, size: int) -> range:
    """Contiguous evaluation rows of `rank`, covering all rows (lengths differ by at most one)."""
    return range(rank * n_rows // size, (rank + 1) * n_rows // size)


@dataclass
class RankRows:
    """One rank's rows of a split, in host memory: stored features and int32 labels."""

    x: np.ndarray
    y: np.ndarray
    rows: range


class DatasetReader:
    """A dataset folder as one rank reads it: its manifest, the manifest's sha256 (the dataset's
    identity, recorded in checkpoints), and this rank's rows of a split.

    Not a collective: each rank reads its own rows (build it in `comm.agreed_errors()` where
    every rank must fail alike). `comm` gives the rank and the number of ranks.
    """

    def __init__(self, path: str, comm, *, verify_checksums: bool = True, max_rows: int = 0):
        self.path = os.path.abspath(path)
        self.rank, self.size = comm.rank, comm.size
        self.verify_checksums, self.max_rows = verify_checksums, max_rows
        self.manifest = read_manifest(self.path)
        self.manifest_sha256 = sha256_file(os.path.join(self.path, MANIFEST_NAME))

    def rows(self, split: str, training: bool) -> RankRows:
        """This rank's rows of `split`: equal ranges for training, all rows for evaluation."""
        return load_rank_rows(self.path, self.manifest, split, self.rank, self.size, training=training,
                              max_rows=self.max_rows, verify_checksums=self.verify_checksums)


def load_rank_rows(dataset_dir: str, manifest: Manifest, split: str, rank: int, size: int, *,
                   training: bool, max_rows: int = 0, verify_checksums: bool = True) -> RankRows:
    """Read this rank's rows of `split` (all rows, or the first `max_rows`)."""
    n = manifest.rows(split)
    n = min(n, max_rows) if max_rows else n
    if n == 0:
        raise DataError(f"{dataset_dir}: split {split!r} has no rows")
    if n < size:
        raise DataError(f"{dataset_dir}: split {split!r} has {n} rows, fewer than the {size} ranks")
    rows = (rows_for_rank if training else eval_rows_for_rank)(n, rank, size)
    if training and n % size and rank == 0:
        log.info("split %r: %d rows over %d ranks; the last %d rows are not used", split, n, size, n % size)
    return read_rows(dataset_dir, manifest, split, rows, verify_checksums)


def read_rows(dataset_dir: str, manifest: Manifest, split: str, rows: range, verify_checksums: bool) -> RankRows:
    """Read rows [rows.start, rows.stop) of `split` from the shards they lie in, validating each shard."""
    x = np.empty((len(rows), *manifest.feature_shape), dtype=manifest.feature_dtype)
    y = np.empty(len(rows), dtype=np.int32)
    start = 0
    for shard in manifest.shards(split):
        stop = start + shard.rows
        lo, hi = max(start, rows.start), min(stop, rows.stop)
        if lo < hi:
            path = check_shard(dataset_dir, manifest, shard, verify_checksums)
            try:
                with h5py.File(path, "r") as f:
                    f["x"].read_direct(x, np.s_[lo - start:hi - start], np.s_[lo - rows.start:hi - rows.start])
                    f["y"].read_direct(y, np.s_[lo - start:hi - start], np.s_[lo - rows.start:hi - rows.start])
            except OSError as e:
                raise DataError(f"{path}: {describe(e)} while reading rows {lo - start}..{hi - start - 1}; expected "
                                "a readable shard") from None
            _check_values(path, x[lo - rows.start:hi - rows.start], y[lo - rows.start:hi - rows.start],
                          manifest.num_classes)
        start = stop
    return RankRows(x, y, rows)


def _check_values(path: str, x: np.ndarray, y: np.ndarray, num_classes: int) -> None:
    bad = (y < 0) | (y >= num_classes)
    if bad.any():
        raise DataError(f"{path}: label {int(y[bad][0])} out of range; expected 0..{num_classes - 1}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise DataError(f"{path}: features contain NaN or Inf; expected finite values")


def input_scaling(manifest: Manifest, normalize: bool) -> tuple[float, float]:
    """(scale, shift) taking stored features to model input, `stored * scale + shift`: the manifest's
    scale and offset, then standardized by its mean and std when `normalize` (`data.normalize`)."""
    std = manifest.std if normalize else 1.0
    mean = manifest.mean if normalize else 0.0
    return manifest.scale / std, (manifest.offset - mean) / std


class Batches:
    """Per-epoch shuffled batches of one rank's rows, normalized to float on the backend.

    The shuffle is seeded by (seed, epoch, rank), so a run is reproducible and a resumed
    run sees the same batches. The last incomplete batch is dropped, so all ranks run
    `steps_per_epoch` steps. The next batch is prepared in a thread while this one trains.
    `augment` ({flip, shift}, or False) flips and shifts image rows (`mpitrain.data.augment`).

    No step allocates: a batch is gathered, scaled and shifted in one pass
    (`mpitrain.kernels.rows`) into one of two fixed host buffers of the workspace part `ws`
    (the model's, `Run.batches`), alternating by step, and on a GPU copied into one of two
    device buffers. So a batch `epoch` yields stays valid while the next one is prepared and
    is overwritten two steps later: copy what must be kept longer. (Augmentation, off in the
    shipped configs, makes new arrays per batch.)
    """

    def __init__(self, data: RankRows, manifest: Manifest, batch_size: int, backend, dtype,
                 seed: int, rank: int, shuffle: bool = True, normalize: bool = True, prefetch: bool = True,
                 augment: dict | bool = False, ws: WorkspacePart | None = None):
        self.data, self.batch_size, self.backend, self.dtype = data, batch_size, backend, np.dtype(dtype)
        self.seed, self.rank, self.shuffle, self.prefetch = seed, rank, shuffle, prefetch
        self.augment = augment
        self.scale, self.shift = input_scaling(manifest, normalize)
        self.steps_per_epoch = len(data.y) // batch_size
        self.ws = ws or Workspace(backend.xp).part("batches")

    def epoch(self, epoch: int, start_step: int = 0):
        """Yield (x, y) for steps start_step.. of `epoch` (workspace buffers: see the class docstring)."""
        order = np.arange(len(self.data.y))
        if self.shuffle:
            np.random.default_rng([self.seed, epoch, self.rank]).shuffle(order)
        steps = range(start_step, self.steps_per_epoch)
        if self.prefetch:
            yield from _prefetched(lambda step: self._batch(order, epoch, step), steps)
        else:
            yield from (self._batch(order, epoch, step) for step in steps)

    def _batch(self, order: np.ndarray, epoch: int, step: int):
        """Step `step`'s rows (ascending within the batch) into buffer pair `step % 2`."""
        slot, shape = step % 2, (self.batch_size, *self.data.x.shape[1:])
        index = self.ws(f"index{slot}", (self.batch_size,), np.int64, host=True)
        index[...] = order[step * self.batch_size:(step + 1) * self.batch_size]
        sort_in_place(index)
        x, y = self.ws(f"x{slot}", shape, self.dtype, host=True), self.ws(f"y{slot}", shape[:1], np.int32, host=True)
        if self.augment:
            stored = augment_images(self.data.x[index], (self.seed, epoch, self.rank, step),
                                    **self.augment)
            scaled(stored, self.scale, self.shift, x)
            y[...] = self.data.y[index]
        else:
            gather_scaled(self.data.x, self.data.y, index, self.scale, self.shift, x, y)
        return self._on_device(x, f"x{slot}"), self._on_device(y, f"y{slot}")

    def to_model_input(self, stored: np.ndarray, out=None):
        """Stored features (uint8 or float32) as normalized floats on the backend: in `out` (a backend array of
        the right shape) when given, else a new array."""
        if out is None:
            out = self.backend.xp.empty(stored.shape, dtype=self.dtype)
        if not self.backend.on_gpu:
            scaled(stored, self.scale, self.shift, out)
            self.backend.transfers.count("to_device", out.nbytes)
            return out
        host = self.ws("input", stored.shape, self.dtype, host=True)
        scaled(stored, self.scale, self.shift, host)
        self.backend.copy_to_device(host, out)
        return out

    def _on_device(self, host: np.ndarray, name: str):
        """`host` itself on the CPU; on a GPU, the device buffer `name` it is copied into."""
        if not self.backend.on_gpu:
            self.backend.transfers.count("to_device", host.nbytes)
            return host
        with self.backend.xp.cuda.Device(self.backend.device):  # the prefetch thread's current GPU is GPU 0
            device = self.ws(name, host.shape, host.dtype)
        self.backend.copy_to_device(host, device)
        return device


def _prefetched(make_batch, steps: range):
    """Yield `make_batch(step)` for `steps`, each made by one worker thread while the one before is in use.

    The worker runs at most one batch ahead of the batch in use, so it never overwrites the
    buffers of a batch being trained on; two semaphores keep that, allocating next to nothing
    per step (an executor's future per batch made more Python objects than the whole step).
    An exception in the worker is raised here; closing the generator early ends the worker.
    """
    ahead, ready, stopping = threading.Semaphore(2), threading.Semaphore(0), threading.Event()
    made = [None, None]  # the batch (or the worker's exception) of steps of each parity

    def work():
        for step in steps:
            ahead.acquire()
            if stopping.is_set():
                return
            try:
                made[step % 2] = make_batch(step)
            except BaseException as e:  # noqa: B036  (handed to the consumer, who raises it)
                made[step % 2] = e
                ready.release()
                return
            ready.release()

    worker = threading.Thread(target=work, name="mpitrain-batches", daemon=True)
    worker.start()
    try:
        for step in steps:
            ready.acquire()
            batch = made[step % 2]
            if isinstance(batch, BaseException):
                raise batch
            yield batch
            ahead.release()  # this batch is done with: the worker may make the one after the next
    finally:
        stopping.set()
        ahead.release()
        worker.join()
