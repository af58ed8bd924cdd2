"""A dataset as one rank reads it: the manifest, this rank's streamed training rows, its evaluation rows, and batches.

    reader = DatasetReader("data/fashion", comm)                  # or "s3://bucket/fashion" (`mpitrain.data.storage`)
    rows = reader.train_rows("train", global_batch=128, buffer_mb=256, seed=0, shuffle=True)
    batches = Batches(rows, reader.manifest, backend, "float32", seed=0, rank=comm.rank)
    test = reader.eval_rows("test")                                # this rank's contiguous share of every row

Training rows stream from storage in bounded memory, in the epoch order of
`mpitrain.data.order` (a function of the seed, the epoch, the split's blocks, the window and
the global batch size, never of the rank count); `mpitrain.data.stream` reads each rank's
share of each window. Evaluation covers every row: rank r scores rows [r N/R, (r+1) N/R) in
order, block by block.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import threading

import numpy as np

from mpitrain.base.errors import ConfigError, DataError
from mpitrain.base.workspace import Workspace, WorkspacePart
from mpitrain.data.augment import augment_blocks
from mpitrain.data.chunks import ShardFiles
from mpitrain.data.order import Blocks, EpochPlan
from mpitrain.data.sequences import SequenceBatch, Inputs
from mpitrain.data.shards import Manifest, read_manifest_and_sha256
from mpitrain.data.storage import Storage
from mpitrain.data.stream import EvalRows, TrainRows, model_dtype, model_input, padded_rows
from mpitrain.data.units import Units, output_units, target_units
from mpitrain.kernels.rows import gather_scaled, scaled

log = logging.getLogger(__name__)
MB = 1 << 20


def eval_rows_for_rank(n_rows: int, rank: int, size: int) -> range:
    """Contiguous evaluation rows of `rank`, covering all rows (lengths differ by at most one)."""
    return range(rank * n_rows // size, (rank + 1) * n_rows // size)


def window_rows(buffer_mb: float, row_bytes: int, global_batch: int, chunk_rows: int, where: str = "data.buffer_mb") \
        -> int:
    """The rows of a shuffle window: two windows (the one in use, the next being read) of `row_bytes`-byte rows fit
    in `buffer_mb` (one rank alone holds whole windows), rounded down to a multiple of the global batch. A buffer
    that cannot hold two global batches and a chunk is a ConfigError saying how much it needs."""
    per_row = row_bytes + 4 + 4  # the stored row, its label, its place in a stratum's permutation
    rows = int(buffer_mb * MB) // (2 * per_row) // global_batch * global_batch
    needed = max(2 * global_batch, chunk_rows) * per_row
    if rows < global_batch or int(buffer_mb * MB) < needed:
        raise ConfigError(f"{where} is {buffer_mb:g}: it holds {int(buffer_mb * MB) // per_row} rows of "
                          f"{per_row} bytes, fewer than two global batches of {global_batch} rows or one chunk of "
                          f"{chunk_rows} rows; expected at least {math.ceil(needed / MB * 1000) / 1000:g} (MB)")
    return rows


class DatasetReader:
    """A dataset (a folder or an object store URL) as one rank reads it: its manifest, the manifest's sha256 (the
    dataset's identity, recorded in checkpoints), this rank's training and evaluation rows.

    Not a collective: each rank reads its own rows (build it in `comm.agreed_errors()` where every rank must fail
    alike). `comm` gives the rank and the number of ranks.
    """

    def __init__(self, path: str, comm, *, verify_checksums: bool = True, max_rows: int = 0,
                 storage_options: dict | None = None):
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"DatasetReader: path is {path!r}; expected the dataset's folder or URL (a str)")
        if not (isinstance(getattr(comm, "rank", None), int) and isinstance(getattr(comm, "size", None), int)):
            raise ConfigError(f"DatasetReader({str(path)!r}, comm): comm is {comm!r}; expected the Communicator that "
                              "mpitrain.init() returns (call comm = mpitrain.init() first, on every rank)")
        path = os.fspath(path)
        self.storage = Storage(path, storage_options)
        self.path = self.storage.root
        self.rank, self.size = comm.rank, comm.size
        self.verify_checksums, self.max_rows = verify_checksums, max_rows
        self.manifest, self.manifest_sha256 = read_manifest_and_sha256(path, self.storage)  # one read of the file
        self.opened: list[ShardFiles] = []

    def close(self) -> None:
        """Close every shard this reader opened (a remote file's connection among them). The reader and the rows it
        gave stay usable: a later run (`mpitrain.train` again with this reader) opens the shards it reads anew."""
        for shards in self.opened:
            shards.close()

    @property
    def row_bytes(self) -> int:
        """A stored row's bytes: its fixed features and categorical ids, and its sequences at their mean length over
        the train split (a window of longer ones grows its sequence buffers; `mpitrain.data.sequences.RaggedBuffer`)."""
        fixed = int(np.prod(self.manifest.feature_shape)) * np.dtype(self.manifest.feature_dtype).itemsize + \
            self.manifest.id_columns * self.manifest.ids_dtype.itemsize
        rows = max(1, self.manifest.rows("train")) if "train" in self.manifest.splits else 1
        return fixed + sum(4 * column["features"] * math.ceil(column.get("steps", {}).get("train", 0) / rows) + 16
                           for column in self.manifest.sequences)

    def blocks(self, split: str) -> Blocks:
        """The blocks (chunks) of `split`, its first `max_rows` rows only when max_rows is set; a DataError for an
        empty split or one with fewer rows than ranks."""
        blocks = Blocks.from_shards([s.rows for s in self.manifest.shards(split)], self.manifest.chunk_rows, self.max_rows)
        if blocks.total_rows == 0:
            raise DataError(f"{self.path}: split {split!r} has no rows")
        if blocks.total_rows < self.size:
            raise DataError(f"{self.path}: split {split!r} has {blocks.total_rows} rows, fewer than the {self.size} "
                            "ranks")
        return blocks

    def shard_files(self, split: str) -> ShardFiles:
        self.opened.append(ShardFiles(self.storage, self.manifest, split, self.verify_checksums))
        return self.opened[-1]

    def train_rows(self, split: str, global_batch: int, buffer_mb: float, seed: int, shuffle: bool,
                   window: int = 0) -> TrainRows:
        """This rank's training rows of `split` in the epoch order for `global_batch` (ranks divide it) and the window
        `buffer_mb` allows (or `window` rows, a resumed epoch's). A ConfigError when they do not fit."""
        blocks = self.blocks(split)
        if global_batch % self.size:
            raise ConfigError(f"the global batch size {global_batch} is not divisible by the {self.size} ranks; "
                              "expected train.global_batch_size a multiple of the number of ranks")
        if blocks.total_rows < global_batch:
            raise ConfigError(f"the global batch size is {global_batch}, but split {split!r} has only "
                              f"{blocks.total_rows} rows")
        window = window or window_rows(buffer_mb, self.row_bytes, global_batch, int(blocks.rows.max()))
        plan = EpochPlan(blocks, global_batch, window, seed, shuffle)
        return TrainRows(self.shard_files(split), plan, self.rank, self.size)

    def eval_rows(self, split: str) -> EvalRows:
        """This rank's contiguous share of every row of `split` (the first max_rows when set), read in order."""
        blocks = self.blocks(split)
        return EvalRows(self.shard_files(split), blocks, eval_rows_for_rank(blocks.total_rows, self.rank, self.size))


def input_scaling(manifest: Manifest, normalize: bool) -> tuple[float, float]:
    """(scale, shift) taking stored features to model input, `stored * scale + shift`: the manifest's
    scale and offset, then standardized by its mean and std when `normalize` (`data.normalize`). A table's row
    (a manifest with `columns`) goes in as stored: it holds ids, and its numeric columns are standardized per column
    by the ETL (`--standardize`), not by one mean and std."""
    if manifest.columns:
        return 1.0, 0.0
    std = manifest.std if normalize else 1.0
    mean = manifest.mean if normalize else 0.0
    return manifest.scale / std, (manifest.offset - mean) / std


class ModelInput:
    """Stored features (uint8 or float32) as normalized floats on the backend: `to_input(stored, out)`; with the
    units of the targets (`targets`: a regression target standardized under `standardize_targets`) and of a
    model's outputs (`output_units`), `mpitrain.data.units`."""

    def __init__(self, manifest: Manifest, backend, dtype, normalize: bool, ws: WorkspacePart,
                 standardize_targets: bool = True):
        self.backend, self.dtype, self.ws = backend, np.dtype(dtype), ws
        self.manifest, self.normalize, self.standardize_targets = manifest, normalize, standardize_targets
        self.scale, self.shift = input_scaling(manifest, normalize)
        self.targets = target_units(manifest, standardize_targets)

    def output_units(self, reconstruction: bool = False, loss: str = "") -> Units:
        """The units the outputs of a model of these inputs are in (`mpitrain.data.units.output_units`)."""
        return output_units(self.manifest, self.normalize, self.standardize_targets, reconstruction, loss)

    def __call__(self, stored: np.ndarray, out=None):
        """`stored` as model input: in `out` (a backend array of the right shape) when given, else a new array. A
        padded `SequenceBatch` goes in as stored (sequences are not rescaled), on the backend's device; of
        `Inputs`, the fixed features are scaled (as rows are) and the columns (ids, sequences) go as stored."""
        if isinstance(stored, Inputs):
            x = self.ws("inputs.x", stored.x.shape, self.dtype, host=True)
            scaled(stored.x, self.scale, self.shift, x)
            return self.on_device(Inputs(x, stored.columns), "inputs")
        if isinstance(stored, SequenceBatch):
            return self.on_device(stored, "sequence")
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

    def on_device(self, batch, name: str):
        """A batch of host arrays (a padded `SequenceBatch`, `Inputs` whose `x` is already scaled, or a column of ids)
        on the backend, each array in the grow-only device buffer `name.PART` (itself on the CPU)."""
        if isinstance(batch, Inputs):
            return Inputs(self._on_device(batch.x, f"{name}.x"),
                          {column: self.on_device(each, f"{name}.{column}") for column, each in batch.columns.items()})
        if isinstance(batch, np.ndarray):
            return self._on_device(batch, name)
        return SequenceBatch(self._on_device(batch.values, f"{name}.values"),
                             self._on_device(batch.lengths, f"{name}.lengths"))

    def _on_device(self, host: np.ndarray, name: str):
        """`host` (in the model's dtype if a float) on the backend: itself on the CPU, else the grow-only device
        buffer `name` it is copied into."""
        if host.dtype.kind == "f" and host.dtype != self.dtype:
            host = host.astype(self.dtype)
        if not self.backend.on_gpu:
            self.backend.transfers.count("to_device", host.nbytes)
            return host
        device = self.ws.at_least(name, host.size, host.dtype).reshape(host.shape)
        self.backend.copy_to_device(host, device)
        return device


class Batches:
    """Per-epoch batches of one rank's training rows (`TrainRows`), normalized to float on the backend.

    Step k's rows are the ones the epoch order gives this rank (`mpitrain.data.order`), so a
    run is reproducible, a resumed run sees the same batches, and every rank runs
    `steps_per_epoch` steps. The next batch is prepared in a thread while this one trains; that
    thread also reads the rows of the next window (`mpitrain.data.stream`). `augment` ({flip,
    shift}, or False) flips and shifts image rows (`mpitrain.data.augment`), each batch by its key, or with
    `augment_rows` (`sync.deterministic_rows`) each block of that many rows by its place in the global batch.
    `record(epoch, step, row_ids)`, when given, sees each batch's row numbers (the debug hook `MPITRAIN_DEBUG_ROWS`).

    No step allocates: a batch is gathered, scaled and shifted in one pass
    (`mpitrain.kernels.rows`) into one of two fixed host buffers of the workspace part `ws`
    (the model's, `Run.batches`), alternating by step, and on a GPU copied into one of two
    device buffers. So a batch `epoch` yields stays valid while the next one is prepared and
    is overwritten two steps later: copy what must be kept longer. (Augmentation, off in the
    shipped configs, makes new arrays per batch.)
    """

    def __init__(self, rows: TrainRows, manifest, backend, dtype, seed: int, rank: int, normalize: bool = True,
                 prefetch: bool = True, augment: dict | bool = False, ws: WorkspacePart | None = None, record=None,
                 standardize_targets: bool = True, augment_rows: int = 0):
        self.rows, self.batch_size, self.backend, self.dtype = rows, rows.rank_batch, backend, np.dtype(dtype)
        self.seed, self.rank, self.prefetch, self.augment, self.record = seed, rank, prefetch, augment, record
        self.key_blocks = self.batch_size // augment_rows if augment_rows else 0
        self.ws = ws or Workspace(backend.xp).part("batches")
        self.to_model_input = ModelInput(manifest, backend, dtype, normalize, self.ws, standardize_targets)
        self.scale, self.shift = self.to_model_input.scale, self.to_model_input.shift
        self.steps_per_epoch = rows.plan.steps

    def epoch(self, epoch: int, start_step: int = 0):
        """Yield (x, y) for steps start_step.. of `epoch` (workspace buffers: see the class docstring)."""
        view = self.rows.epoch(epoch)
        steps = range(start_step, self.steps_per_epoch)
        if self.prefetch:
            yield from _prefetched(lambda step: self._batch(view, epoch, step), steps)
        else:
            yield from (self._batch(view, epoch, step) for step in steps)

    def warm_up(self) -> None:
        """Run the kernels a batch goes through (gathering and scaling its rows) once, on one stored row of zeros into
        buffer pair 1, so numba compiles or loads them here and not in the prefetch thread's first batch (the first
        step's time). Not a collective."""
        manifest = self.rows.shards.manifest
        x, y, _ = self._buffers(1)
        stored_x = np.zeros((1, *x.shape[1:]), manifest.feature_dtype)
        stored_y = np.zeros((1, *manifest.target_shape), manifest.target_dtype)
        gather_scaled(stored_x, stored_y, np.zeros(1, np.int64), self.scale, self.shift, x[:1], y[:1])
        if self.augment:
            scaled(stored_x, self.scale, self.shift, x[:1])

    def zeros(self):
        """A batch of zeros in buffer pair 0: what a rank whose read failed trains on until every rank knows (a
        sequence dataset's: sequences of one zero step; ids 0)."""
        x, y, ids = self._buffers(0)
        x[...], y[...], ids[...] = 0, 0, 0
        manifest = self.rows.shards.manifest
        columns = {column["name"]: SequenceBatch(np.zeros((self.batch_size, 1, column["features"]),
                                                          model_dtype(manifest, column, self.dtype)),
                                                 np.ones(self.batch_size, np.int64)) for column in manifest.sequences}
        if manifest.step_target:
            y = np.zeros((self.batch_size, 1), np.int32)
        return self.to_model_input.on_device(model_input(manifest, x, ids, columns), "zeros"), self._on_device(y, "y0")

    def _batch(self, view, epoch: int, step: int):
        """Step `step`'s rows (ascending within the batch) into buffer pair `step % 2`."""
        slot = step % 2
        stored_x, stored_y, stored_ids, index, sequences = view.step(step)
        if self.record is not None:
            self.record(epoch, step, view.row_ids(step))
        x, y, ids = self._buffers(slot)
        manifest = self.rows.shards.manifest
        np.take(stored_ids, index, axis=0, out=ids)  # the categorical ids as stored: integers, (B, 0) if none
        if sequences or manifest.id_columns:  # each sequence column padded to its longest, step classes alike
            gather_scaled(stored_x, stored_y, index, self.scale, self.shift, x, y)  # fixed features: (B, 0) if none
            self.to_model_input.targets.to_model(y, out=y)
            batch, y = padded_rows(manifest, sequences, x, y, ids, index, self.ws, str(slot), self.dtype) \
                if sequences else (model_input(manifest, x, ids, {}), y)
            with self._device():
                batch = self.to_model_input.on_device(batch, f"batch{slot}")
            return batch, self._on_device(y, f"y{slot}")
        if self.augment:
            stored = augment_blocks(stored_x[index], self._augment_keys(epoch, step), **self.augment)
            scaled(stored, self.scale, self.shift, x)
            y[...] = stored_y[index]
        else:
            gather_scaled(stored_x, stored_y, index, self.scale, self.shift, x, y)
        self.to_model_input.targets.to_model(y, out=y)  # a regression target standardized in place, else as read
        return self._on_device(x, f"x{slot}"), self._on_device(y, f"y{slot}")

    def _augment_keys(self, epoch: int, step: int) -> list[tuple]:
        """The augmentation's keys of step `step`'s rows: one for the batch, by rank; with `augment_rows`, one per
        block of that many rows, by the block's place in the global batch."""
        if not self.key_blocks:
            return [(self.seed, epoch, self.rank, step)]
        first = self.rank * self.key_blocks
        return [(self.seed, epoch, first + j, step) for j in range(self.key_blocks)]

    def _device(self):
        """The backend's GPU as the current device (the prefetch thread's current GPU is GPU 0); on the CPU nothing."""
        return self.backend.xp.cuda.Device(self.backend.device) if self.backend.on_gpu else contextlib.nullcontext()

    def _buffers(self, slot: int):
        """Host buffers `slot`: a batch's model input x, its labels or targets, and its categorical ids."""
        manifest = self.rows.shards.manifest
        return (self.ws(f"x{slot}", (self.batch_size, *self.rows.row_shape), self.dtype, host=True),
                self.ws(f"y{slot}", (self.batch_size, *manifest.target_shape), manifest.target_dtype, host=True),
                self.ws(f"ids{slot}", (self.batch_size, manifest.id_columns), manifest.ids_dtype,
                        host=True))

    def _on_device(self, host: np.ndarray, name: str):
        """`host` itself on the CPU; on a GPU, the device buffer `name` it is copied into."""
        if not self.backend.on_gpu:
            self.backend.transfers.count("to_device", host.nbytes)
            return host
        with self._device():
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
