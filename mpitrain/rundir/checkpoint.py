"""The checkpoint file format: HDF5, written atomically, resumable on any number of ranks.

`checkpoints/ckpt-EEEE-SSSSSS.h5` holds, each dataset with HDF5's Fletcher-32 checksum, the run's one model: the
flat parameters and running statistics (and each layer's arrays under `layers/`, for `h5ls` and other tools: virtual
datasets of the flat ones, so the file holds each value once), the flat updater state, the synchronizer's numbers
(e.g. sharing's tau) and arrays under `sync/` (sharing's pending residual); where to resume (epoch EEEE, step SSSSSS
within it, and the global batch and window of that epoch's order: `mpitrain.data.order`), the resolved config and
the sha256 of the dataset's manifest. Where the ranks' arrays differed when it was written (`averaging` between
averagings, `sharing`'s residuals and updater states, running statistics mid-epoch, `none`), those datasets hold
their merged value (the ranks' mean; `none`: rank 0's), which is what `mpitrain eval`, `predict` and `export` read
and what a resume on another number of ranks starts every rank from; beside them `ranks/R/NAME` holds each rank R's
own (NAME: `params`, `stats`, `updater_state` or `sync/NAME`), and the attribute `ranks` the number of ranks that
wrote it, so a resume on as many ranks continues bit for bit. Rank 0 alone writes it. All other randomness derives
from (seed, epoch, step, rank), so no RNG state is stored. A model's sharded embedding tables (`shard: rows`) are in
none of these arrays: each rank keeps its rows in files of its own beside the checkpoint
(`mpitrain.rundir.table_rows`), and the attribute `sharded_tables` describes them. `mpitrain.rundir.checkpointer`
decides when to write them and which one a run resumes from.
"""
from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass, field

import h5py
import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.base.files import write_hdf5
from mpitrain.rundir.directory import CHECKPOINT_NAME, RunDir
from mpitrain.rundir.table_rows import check_rows, remove_rows


@dataclass
class Checkpoint:
    params: np.ndarray
    updater_state: np.ndarray
    epoch: int
    step: int
    iteration: int
    layout: list = field(default_factory=list)  # [(layer parameter name, shape)] in buffer order
    sync_numbers: dict = field(default_factory=dict)  # a sync mode's saved numbers (sharing: tau); file: sync_state
    manifest_sha256: str = ""
    config_yaml: str = ""
    path: str = ""
    stats: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # running statistics (batch norm)
    stats_layout: list = field(default_factory=list)
    sync_arrays: dict = field(default_factory=dict)  # a sync mode's saved arrays (sharing: the mean residual)
    meaning: dict = field(default_factory=dict)  # what the arrays mean: layer types, loss, optimizer, its state slots
    order: tuple = (0, 0)  # the epoch order's (global batch, window rows) at `step`; (0, 0): written before there was one
    ranks: int = 0  # the number of ranks that wrote it (0: written before it was recorded, or not by a training run)
    rank_arrays: dict = field(default_factory=dict)  # {name: (ranks, size)}: each rank's own of the arrays that differed
    loop_state: dict = field(default_factory=dict)  # the loop's counters: {schedule: ..., early_stopping: ...}
    sharded_tables: list = field(default_factory=list)  # `table_rows.describe`'s; their rows: `ranks` rows files

    def merged_array(self, name: str) -> np.ndarray:
        """The one array of `name` (params, stats, updater_state or sync/NAME): what `rank_arrays[name]` merges."""
        merged = {"params": self.params, "stats": self.stats, "updater_state": self.updater_state}
        return merged[name] if name in merged else self.sync_arrays[name.removeprefix("sync/")]

    @property
    def full_layout(self) -> list:
        """Parameters then running statistics: what a model's `layout + stats_layout` must match."""
        return list(self.layout) + list(self.stats_layout)


def save_checkpoint(run_dir: str, ckpt: Checkpoint, keep: int) -> str:
    """Write RUN_DIR/checkpoints/ckpt-EEEE-SSSSSS.h5 atomically; only then delete all but the newest `keep` (with
    their sharded tables' rows files)."""
    path = write_checkpoint(RunDir(run_dir).checkpoint(ckpt.epoch, ckpt.step), ckpt)
    for old in list_checkpoints(run_dir)[:-keep]:
        os.remove(old)
        remove_rows(old)
    return path


def write_best(run_dir: str, ckpt: Checkpoint) -> str:
    """Write RUN_DIR/checkpoints/best.h5 atomically, replacing the one before (early stopping's best)."""
    return write_checkpoint(RunDir(run_dir).best_checkpoint, ckpt)


def write_checkpoint(path: str, ckpt: Checkpoint) -> str:
    """Write `ckpt` to `path` atomically (`mpitrain.base.files.write_file`): complete or absent.

    The HDF5 file is built in memory and written with one plain write (`write_hdf5`), so a full or
    read-only disk fails there, cleanly: the partial file is removed, the checkpoints already there
    are left alone, and the error names the file and the space needed.
    """
    write_hdf5(path, lambda f: _write(f, ckpt))
    return path


def _write(f: h5py.File, ckpt: Checkpoint) -> None:
    _dataset(f, "params", ckpt.params)
    _dataset(f, "updater_state", ckpt.updater_state)
    _dataset(f, "stats", ckpt.stats)
    for name, array in ckpt.sync_arrays.items():
        _dataset(f, f"sync/{name}", array)
    layers = f.create_group("layers")
    for source, flat, layout in (("params", ckpt.params, ckpt.layout), ("stats", ckpt.stats, ckpt.stats_layout)):
        _layer_views(layers, source, flat, layout)
    for rank in range(ckpt.ranks if ckpt.rank_arrays else 0):
        for name, stacked in ckpt.rank_arrays.items():
            _dataset(f, f"ranks/{rank}/{name}", stacked[rank])
    f.attrs.update(ranks=ckpt.ranks, epoch=ckpt.epoch, step=ckpt.step, iteration=ckpt.iteration,
                   layout=json.dumps([[name, list(shape)] for name, shape in ckpt.layout]),
                   stats_layout=json.dumps([[name, list(shape)] for name, shape in ckpt.stats_layout]),
                   sync_state=json.dumps(ckpt.sync_numbers), meaning=json.dumps(ckpt.meaning),
                   loop_state=json.dumps(ckpt.loop_state), sharded_tables=json.dumps(ckpt.sharded_tables),
                   manifest_sha256=ckpt.manifest_sha256, config=ckpt.config_yaml, global_batch=ckpt.order[0],
                   window_rows=ckpt.order[1])


def _layer_views(group, source: str, flat: np.ndarray, layout: list) -> None:
    """Each array of `layout` under `group` by its name, as an HDF5 virtual dataset mapping its values in the flat
    dataset `source` (which holds `flat`): `h5ls` and h5py show a layer's W, and the file (built in memory) holds
    it once. An empty array is an empty dataset."""
    offset = 0
    for name, shape in layout:
        size = math.prod(shape)
        if size:
            view = h5py.VirtualLayout(shape=tuple(shape), dtype=flat.dtype)
            view[...] = h5py.VirtualSource(".", source, shape=flat.shape)[offset:offset + size]
            group.create_virtual_dataset(name, view)
        else:
            group.create_dataset(name, shape=tuple(shape), dtype=flat.dtype)
        offset += size


def _dataset(group, name: str, array: np.ndarray) -> None:
    """A dataset with HDF5's Fletcher-32 checksum, so reading flipped bytes fails instead of resuming from them
    (an empty array cannot be chunked, so it has none: there is nothing in it to damage)."""
    group.create_dataset(name, data=array, fletcher32=array.size > 0)


def list_checkpoints(run_dir: str) -> list[str]:
    """Complete checkpoints, oldest first (temporary files are never listed)."""
    paths = [p for p in glob.glob(os.path.join(RunDir(run_dir).checkpoints, "ckpt-*.h5")) if CHECKPOINT_NAME.search(p)]
    return sorted(paths, key=lambda p: tuple(int(g) for g in CHECKPOINT_NAME.search(p).groups()))


def load_checkpoint(path: str, rank_arrays: bool = True) -> Checkpoint:
    """The checkpoint at `path`; without `rank_arrays`, each rank's own arrays are left unread (evaluation, export:
    they use the merged model). A damaged or malformed file is a DataError."""
    try:
        with h5py.File(path, "r") as f:
            a = f.attrs
            ckpt = Checkpoint(f["params"][...], f["updater_state"][...], int(a["epoch"]), int(a["step"]),
                              int(a["iteration"]), _layout(a["layout"]), json.loads(a["sync_state"]),
                              str(a["manifest_sha256"]), str(a["config"]), path, f["stats"][...],
                              _layout(a["stats_layout"]), {k: v[...] for k, v in f.get("sync", {}).items()},
                              json.loads(a.get("meaning", "{}")),
                              (int(a.get("global_batch", 0)), int(a.get("window_rows", 0))),
                              int(a.get("ranks", 0)))
            ckpt.rank_arrays = _rank_arrays(f, ckpt) if rank_arrays else {}
            ckpt.loop_state = json.loads(a.get("loop_state", "{}"))
            ckpt.sharded_tables = json.loads(a.get("sharded_tables", "[]"))
        check_rows(path, ckpt.sharded_tables, ckpt.ranks if ckpt.sharded_tables else 0)
        return ckpt
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{path}: not a readable mpitrain checkpoint ({e})") from None


def _rank_arrays(f: h5py.File, ckpt: Checkpoint) -> dict:
    """`ranks/R/NAME` of every rank R < `ckpt.ranks`, stacked in rank order: {NAME: (ranks, size)}. A rank's missing
    array, or one of another size than the merged NAME, is a KeyError or ValueError (a damaged file)."""
    if "ranks" not in f:
        return {}
    names, stacked, ranks = [], {}, ckpt.ranks
    f["ranks/0"].visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    for name in names:
        rows = [f[f"ranks/{rank}/{name}"][...] for rank in range(ranks)]
        size = ckpt.merged_array(name).size
        if not rows or any(row.size != size for row in rows):
            raise ValueError(f"ranks/R/{name} holds {[row.size for row in rows]} values for its {ranks} ranks, {name} "
                             f"{size}")
        stacked[name] = np.stack(rows)
    return stacked


def _layout(text: str) -> list:
    return [(name, tuple(shape)) for name, shape in json.loads(text)]


def check_fits(ckpt: Checkpoint, layout: list, n_state: int | None = None, manifest_sha256: str | None = None,
               dataset: str = "", meaning: dict | None = None) -> None:
    """Refuse a checkpoint of another model, optimizer or dataset, saying what differs.

    `layout` is the model's parameters then its running statistics (`layout + stats_layout`);
    `meaning` what its arrays mean (see `Checkpoint.meaning`): keys both sides have must agree.
    """
    for key, here in (meaning or {}).items():
        saved = ckpt.meaning.get(key, here)
        if saved != here:
            raise DataError(f"{ckpt.path}: {_difference(key, saved, here)}; a resumed run must keep what the "
                            "checkpoint's arrays mean (docs/sync-modes.md says what may change)")
    for (saved, saved_shape), (name, shape) in zip(ckpt.full_layout, layout):
        if (saved, tuple(saved_shape)) != (name, tuple(shape)):
            raise DataError(f"{ckpt.path}: holds {saved} of shape {list(saved_shape)} where this config's model "
                            f"has {name} of shape {list(shape)}")
    if len(ckpt.full_layout) != len(layout):
        raise DataError(f"{ckpt.path}: holds {len(ckpt.full_layout)} parameter arrays, this config's model has "
                        f"{len(layout)}")
    if n_state is not None and ckpt.updater_state.size != n_state:
        raise DataError(f"{ckpt.path}: holds {ckpt.updater_state.size} updater values, this config's optimizer "
                        f"needs {n_state} (was optimizer.type or momentum changed?)")
    if manifest_sha256 is not None and ckpt.manifest_sha256 != manifest_sha256:
        raise DataError(f"{ckpt.path}: taken on a dataset whose manifest.json has sha256 "
                        f"{ckpt.manifest_sha256[:16]}..., but {dataset} has {manifest_sha256[:16]}...")


def _difference(key: str, saved, here) -> str:
    """One line on how a checkpoint's `key` (see `Checkpoint.meaning`) differs from this config's."""
    if key == "layers":
        if len(saved) != len(here):
            return f"holds a model of {len(saved)} layers ({', '.join(saved)}), this config's has {len(here)}"
        index = next(i for i, (a, b) in enumerate(zip(saved, here)) if a != b)
        return f"its layer {index} is {saved[index]}, this config's is {here[index]}"
    names = {"loss": "model.loss", "optimizer": "optimizer.type", "updater_state": "the optimizer's state"}
    return f"was trained with {names[key]} {saved}, this config has {here}"
