"""The one owner of a run's checkpoints: it saves them, finds the newest, validates it and resumes from it.

    checkpointer = Checkpointer(run_dir, comm, backend, manifest_sha256, data_path, keep=3)
    start = checkpointer.resume(model, updater, config)   # where to begin: a Position (a collective)
    checkpointer.write_config(config)                     # RUN_DIR/config.yaml, carried by every checkpoint too
    ...
    checkpointer.save(epoch, step, model, updater, sync)  # a collective; rank 0 writes

The file format is `mpitrain.rundir.checkpoint`'s. Here is the policy: `resume: never` refuses a run
directory that holds checkpoints; a checkpoint of another model, optimizer or dataset is refused,
saying what differs, and so is a resume whose config changes a key the checkpoint's config recorded
otherwise where that key may not change (`mpitrain.config.on_resume`: the model, loss, dtype, input
transforms, the optimizer's type; mid-epoch also the epoch's order: its split, shuffling, rows,
seed and global batch); a save changes no rank's training state, and a resume on as many ranks as wrote
the checkpoint gives each rank its own (bit for bit the run that stopped), on another number the
merged one; records of metrics.jsonl written after the checkpoint (by a job that ended before its
next one) are dropped; a checkpoint is never written with NaN or Inf parameters; only the newest
`keep` are kept. A damaged checkpoint is set aside (PATH.damaged), never deleted; a run directory
left with set-aside checkpoints and none to resume is refused, on every start, until the user says
`resume: never` (or puts a good checkpoint in checkpoints/). A fresh start never overwrites an earlier
run's records: config.yaml, metrics.jsonl, summary.json, the report, eval's and predict's outputs and
the set-aside checkpoints move to RUN_DIR/earlier-N, with a log line saying so. Pretraining's finished
layers (RUN_DIR/pretrain/layer-LL.h5) are checkpoints of this kind too, one per RBM, so a resumed run
skips them.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np

from mpitrain.base.errors import ConfigError, DataError, MpitrainError
from mpitrain.base.files import write_file
from mpitrain.config.on_resume import first_change, global_batch_change, set_back, shown
from mpitrain.config.sections import REFUSED, Config, config_yaml, load_config, recorded_config
from mpitrain.config.yaml_input import read_yaml
from mpitrain.nn.flat import flat_views
from mpitrain.parallel.sync.base import is_array, parameter_hash
from mpitrain.rundir.checkpoint import (
    Checkpoint,
    check_fits,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    write_best,
    write_checkpoint,
)
from mpitrain.rundir.directory import RunDir
from mpitrain.rundir.metrics_file import drop_records_after, keep_records
from mpitrain.rundir.table_rows import describe, read_share, write_rows

log = logging.getLogger("mpitrain")


@dataclass
class Position:
    """Where a run continues: at step `step` of epoch `epoch` (0-based), the updater at `iteration`,
    with a sync mode's saved numbers and arrays (the arrays on rank 0 only), and, from a checkpoint written by as many
    ranks as this run has, each rank's own arrays (`Synchronizer.load_rank_arrays`; on rank 0 only)."""

    epoch: int = 0
    step: int = 0
    iteration: int = 0
    sync_numbers: dict = field(default_factory=dict)
    sync_arrays: dict = field(default_factory=dict)
    order: tuple = (0, 0)  # the epoch order's (global batch, window rows) the checkpoint stopped in
    ranks: int = 0  # the number of ranks that wrote the checkpoint (0: unknown, or no checkpoint)
    rank_arrays: dict = field(default_factory=dict)  # {name: (ranks, size)}, when `ranks` is this run's; rank 0 only
    loop_state: dict = field(default_factory=dict)  # the loop's counters: {schedule: ..., early_stopping: ...}


def _unused(path: str) -> str:
    """`path`, or `path.1`, `path.2`, ... : the first name no file has."""
    name, number = path, 0
    while os.path.exists(name):
        number += 1
        name = f"{path}.{number}"
    return name


def chosen_checkpoint(run_dir: str, path: str | None = None) -> Checkpoint:
    """Checkpoint `path`, loaded without each rank's own arrays (eval, predict, export and score use the merged
    model): a file, `best` (early stopping's best, checkpoints/best.h5), `latest` (the newest), or by default the
    best where the run has one, else the newest. Not a collective."""
    best = RunDir(run_dir).best_checkpoint
    if path == "best" or (path is None and os.path.exists(best)):
        if not os.path.exists(best):
            raise DataError(f"{best}: no best checkpoint (the run trained without train.early_stopping); expected "
                            "--checkpoint latest or a file")
        path = best
    elif path in (None, "latest"):
        checkpoints = list_checkpoints(run_dir)
        if not checkpoints:
            raise DataError(f"{run_dir}/checkpoints: no checkpoint; train the run first")
        path = checkpoints[-1]
    return load_checkpoint(path, rank_arrays=False)


def copy_matching(model, ckpt: Checkpoint, to_device) -> dict[str, list[str]]:
    """Copy each array of `ckpt` (parameters and running statistics, by their layout's names) into `model`'s array of
    the same name and shape (through `to_device`); {copied, skipped (same name, other shape), fresh (not in it)}:
    names. Not a collective."""
    theirs = dict(zip((name for name, _ in ckpt.layout), flat_views(ckpt.params, ckpt.layout)))
    theirs.update(zip((name for name, _ in ckpt.stats_layout), flat_views(ckpt.stats, ckpt.stats_layout)))
    ours = list(zip(model.layout, flat_views(model.params, model.layout)))
    ours += list(zip(model.stats_layout, flat_views(model.stats, model.stats_layout)))
    found = {"copied": [], "skipped": [], "fresh": []}
    for (name, shape), view in ours:
        if name not in theirs:
            found["fresh"].append(name)
        elif tuple(theirs[name].shape) != tuple(shape):
            found["skipped"].append(f"{name} {list(theirs[name].shape)} here {list(shape)}")
        else:
            view[...] = to_device(theirs[name])
            found["copied"].append(name)
    return found


def checkpoint_config(run_dir: str, ckpt: Checkpoint, overrides: tuple = ()) -> Config:
    """The config `ckpt` was trained with, from which eval, predict, export and score build its model and input
    transforms: the checkpoint's own record, whatever RUN_DIR/config.yaml says now, but for what a checkpoint cannot
    know: the run directory (`run_dir`) and where its dataset lies now (data.path and data.storage_options of
    RUN_DIR/config.yaml: the dataset's identity, its manifest's sha256, is checked by `restore`). `overrides` go
    last. A checkpoint without a record (older versions) gives RUN_DIR/config.yaml. Not a collective."""
    run_dir = os.path.abspath(run_dir)
    now = load_config(RunDir(run_dir).config, [f"run_dir={run_dir}", *overrides])
    if not ckpt.config_yaml:
        return now
    where = [f"data.path={json.dumps(now.data.path)}", f"data.storage_options={json.dumps(now.data.storage_options)}"]
    return recorded_config(ckpt.config_yaml, ckpt.path, [f"run_dir={json.dumps(run_dir)}", *where, *overrides])


def _refuse_changes(ckpt: Checkpoint, config, ranks: int) -> None:
    """Refuse to resume `ckpt` under `config` (on `ranks` ranks) where it changes a key that may not change on resume
    (`mpitrain.config.on_resume`; mid-epoch also the epoch's order and its global batch), naming the first such key,
    both values and what to do. Of a checkpoint that recorded no config (older versions) only the global batch is
    compared."""
    saved = read_yaml(ckpt.config_yaml or "{}", f"{ckpt.path}: its recorded config", in_file=False)
    now = read_yaml(config_yaml(config), "this run's config", in_file=False)
    change = first_change(saved, now, mid_epoch=ckpt.step > 0)
    where = f"{ckpt.path}: stopped at step {ckpt.step} of epoch {ckpt.epoch + 1} with"
    if change:
        key, before, after, rule = change
        if rule == REFUSED:
            raise ConfigError(f"{ckpt.path}: was trained with {key} {shown(before)}, this config has {shown(after)}; "
                              f"{key} gives the checkpoint's numbers their meaning and may not change on resume "
                              f"(docs/configuration.md): {set_back(key, before)}, or train a new run in another "
                              "run_dir")
        raise ConfigError(f"{where} {key} {shown(before)}, this config has {shown(after)}; {key} sets the epoch's "
                          f"order and may change only at an epoch's end: {set_back(key, before)} to finish "
                          "the epoch, or resume from a checkpoint at an epoch's end (ckpt-EEEE-000000.h5)")
    batch = global_batch_change(saved, now, ckpt.order[0], config.train.global_batch(ranks), ranks) \
        if ckpt.step else None
    if batch:
        raise ConfigError(f"{where} {batch}; the rest of the epoch needs its global batch: resume with "
                          f"train.global_batch_size: {ckpt.order[0]} (on any number of ranks dividing it), or from "
                          "a checkpoint at an epoch's end (ckpt-EEEE-000000.h5)")


def _whole_params(model, to_host, trained):
    """The host parameters a checkpoint keeps: `trained`, the trainable part's merged values, after the frozen part
    (the same on every rank) when the model has one."""
    trained = to_host(trained)
    if not model.trainable_start:
        return trained
    return np.concatenate([to_host(model.params[:model.trainable_start]), trained])


def meaning(model, updater=None) -> dict:
    """What a checkpoint's arrays mean, beyond their shapes: the model's layer types (activations
    included) and loss, and the optimizer and what each slot of its state holds."""
    described = {"layers": [type(layer).__name__.lower() for layer in model.layers], "loss": model.loss}
    if updater is not None:
        described.update(optimizer=type(updater).__name__.lower(), updater_state=list(updater.slot_names))
    return described


class Checkpointer:
    """Saves, finds, validates and resumes the checkpoints of the run in `run_dir`; see the module docstring."""

    def __init__(self, run_dir: str, comm, backend, manifest_sha256: str, data_path: str, *, keep: int = 3,
                 resume: str = "auto"):
        self.run_dir, self.comm, self.backend = run_dir, comm, backend
        self.manifest_sha256, self.data_path = manifest_sha256, data_path
        self.keep, self.policy = keep, resume
        self.config_yaml = ""  # what write_config wrote: every checkpoint carries it
        self.files = RunDir(run_dir)

    def paths(self) -> list[str]:
        """The run's complete checkpoints, oldest first."""
        return list_checkpoints(self.run_dir)

    def resume(self, model, updater, config, pretraining: bool = False) -> Position:
        """Load the newest checkpoint on rank 0 into `model` and `updater` and say where to continue, refusing it when
        `config` (this run's, resolved) changes what may not change on resume (`mpitrain.config.on_resume`).

        A collective: every rank calls it and gets the same Position (the sync arrays and each rank's own arrays on
        rank 0 only; `Synchronizer.load_state` and `load_rank_arrays` hand them on). The model and updater get the
        checkpoint's merged state; a checkpoint written by as many ranks as this run has also gives each rank's own
        arrays (an exact resume), one of another number of ranks does not, and that is logged. With `pretraining`,
        a fresh start keeps metrics.jsonl for `finished_layers` to sort out while pretraining has finished layers.
        Without a checkpoint, see `_start_afresh`.
        """
        position = Position()
        with self.comm.agreed_errors():
            checkpoints = self.paths() if self.comm.is_root else []
            if checkpoints:
                self._refuse_unless_resuming("checkpoints")
                ckpt = self._newest_good(checkpoints)
                check_fits(ckpt, model.layout + model.stats_layout, updater.state.size, self.manifest_sha256,
                           self.data_path, meaning(model, updater))
                _refuse_changes(ckpt, config, self.comm.size)
                self._restore(ckpt, model)
                updater.state[...] = self.backend.to_device(ckpt.updater_state)
                same_ranks = ckpt.ranks == self.comm.size
                position = Position(ckpt.epoch, ckpt.step, ckpt.iteration, ckpt.sync_numbers, ckpt.sync_arrays,
                                    ckpt.order, ckpt.ranks, ckpt.rank_arrays if same_ranks else {},
                                    ckpt.loop_state)
                drop_records_after(self.files.metrics, ckpt.epoch, ckpt.step)
                log.info("resuming from %s at epoch %d step %d", ckpt.path, ckpt.epoch + 1, ckpt.step)
                if ckpt.rank_arrays and not same_ranks:
                    log.info("the checkpoint holds each of its %d ranks' own %s; this run has %d ranks, so every rank "
                             "starts from their merged state (not bit for bit the run it stopped)", ckpt.ranks,
                             ", ".join(sorted(ckpt.rank_arrays)), self.comm.size)
            elif self.comm.is_root:
                self._start_afresh(pretraining)
        numbers = self.comm.bcast_obj((position.epoch, position.step, position.iteration, position.sync_numbers,
                                       position.order, position.ranks, position.loop_state,
                                       checkpoints and (ckpt.path, ckpt.sharded_tables, ckpt.ranks)))
        if numbers[7]:
            with self.comm.agreed_errors():
                load_table_rows(model, *numbers[7])
        return Position(*numbers[:4], sync_arrays=position.sync_arrays, order=tuple(numbers[4]), ranks=numbers[5],
                        rank_arrays=position.rank_arrays, loop_state=numbers[6])

    def write_config(self, config) -> None:
        """Rank 0 writes RUN_DIR/config.yaml, the config as the run uses it, which every checkpoint then carries
        too; a file that already says exactly that (a resumed run, a finished one asked for its missing records) is
        left untouched. A collective: a write that fails is an error on every rank."""
        self.config_yaml = config_yaml(config)
        with self.comm.agreed_errors():
            if self.comm.is_root and _text_of(self.files.config) != self.config_yaml:
                write_file(self.files.config, lambda f: f.write(self.config_yaml))

    def save(self, epoch: int, step: int, model, updater, sync, order: tuple = (0, 0), read_failure: str | None = None,
             loop_state: dict | None = None, best: bool = False) -> str:
        """Checkpoint "resume at step `step` of epoch `epoch`" (of the epoch order `order`: global batch, window rows);
        never one with NaN or Inf parameters, nor after a rank failed to read its rows (`read_failure`, its message:
        it trained on a stand-in batch since). Returns its path.

        A collective that leaves the training state as it was (parameters, statistics, updater state, the sync
        mode's arrays and numbers), so a run that checkpoints trains exactly as one that does not. Every rank
        reports whether its parameters are finite, its reads whole, and a hash of each of its arrays that may
        differ between ranks (`sync.rank_local`). Of those that do differ, `sync.merged` computes the one value
        kept as the run's model (the ranks' mean, in a new buffer; `none`: rank 0's) and rank 0 gathers every
        rank's own, for an exact resume on as many ranks. Then rank 0 writes. A model with frozen layers gives the
        sync its trainable part (`model.trainable`); its frozen part, the same on every rank, is kept as it is.
        
        With `best`, the checkpoint is the run's best (early stopping's): RUN_DIR/checkpoints/best.h5, replacing
        the one before, which no `checkpoint.keep` deletes and no resume reads; eval, predict and export take it
        (`chosen_checkpoint`).
        """
        to_host = self.backend.to_host
        local = sync.local_arrays(model.trainable, updater)  # a frozen part is the same on every rank
        candidates = [name for name in sync.rank_local if name in local and local[name].size]
        reports = self.comm.allgather_obj((bool(to_host(model.xp.isfinite(model.params).all())), read_failure,
                                           [parameter_hash(to_host(local[name])) for name in candidates]))
        failures = [(rank, failure) for rank, (_, failure, _) in enumerate(reports) if failure]
        if failures:
            raise DataError(f"{failures[0][1]} (seen on rank {failures[0][0]}; no checkpoint is written after it)")
        finite = [ok for ok, _, _ in reports]
        if not all(finite):
            raise MpitrainError(f"parameters hold NaN or Inf on rank {finite.index(False)} before the checkpoint "
                                f"of epoch {epoch} step {step}; it is not written, the last good one is kept; "
                                "try a lower optimizer.lr")
        differ = [name for index, name in enumerate(candidates) if len({hashes[index] for _, _, hashes in reports}) > 1]
        merged = {**local, **{name: sync.merged(name, local[name]) for name in differ}}  # the same order everywhere
        own = {name: self.comm.gather_host(to_host(local[name])) for name in differ}  # on rank 0
        numbers = {name: value for name, value in sync.state().items() if not is_array(value)}  # its arrays: local
        path = self.files.best_checkpoint if best else self.files.checkpoint(epoch, step)
        if model.sharded_tables:  # each rank its rows, before the checkpoint that names them
            with self.comm.agreed_errors():
                write_rows(path, self.comm.rank, model.sharded_tables)
        with self.comm.agreed_errors():  # a full disk on rank 0 ends every rank, not just rank 0
            if self.comm.is_root:
                ckpt = Checkpoint(
                    _whole_params(model, to_host, merged["params"]), to_host(merged["updater_state"]), epoch, step,
                    updater.iteration,
                    model.layout, numbers, self.manifest_sha256, self.config_yaml,
                    stats=to_host(merged["stats"]), stats_layout=model.stats_layout,
                    sync_arrays={name.removeprefix("sync/"): to_host(array) for name, array in merged.items()
                                 if name.startswith("sync/")},
                    meaning=meaning(model, updater), order=tuple(order), ranks=self.comm.size, rank_arrays=own,
                    loop_state=loop_state or {}, sharded_tables=describe(model.sharded_tables))
                if best:
                    write_best(self.run_dir, ckpt)
                else:
                    save_checkpoint(self.run_dir, ckpt, self.keep)
        return path

    def _start_afresh(self, pretraining: bool) -> None:
        """(Rank 0) A run directory without a checkpoint to resume: refused while it holds checkpoints set aside as
        damaged, unless `resume: never`; else the files of an earlier run move to RUN_DIR/earlier-N (but while
        pretraining resumes from its finished layers, whose records `finished_layers` keeps)."""
        damaged = self.files.damaged_checkpoints()
        if damaged and self.policy != "never":
            raise DataError(f"{self.files.checkpoints}: holds only checkpoints set aside as damaged "
                            f"({', '.join(os.path.basename(p) for p in damaged)}), none to resume; to start this run "
                            "again from scratch use --set resume=never (the earlier run's files move to "
                            f"{self.run_dir}/earlier-N), or put a good checkpoint (a backup) in checkpoints/ to resume "
                            "from it")
        if pretraining and os.path.exists(self.files.pretrained_layer(0)):
            return
        records = self.files.records()
        if records:
            folder = self.files.move_aside(records)
            log.info("starting %s from scratch: the earlier run's %s are moved to %s", self.run_dir,
                     ", ".join(os.path.relpath(p, self.run_dir) for p in records), folder)

    def _newest_good(self, paths: list[str]) -> Checkpoint:
        """(Rank 0) The newest of `paths` that reads back whole (its checksums hold) with finite values. Each damaged
        one is renamed PATH.damaged, never deleted (nor pruned), with a warning naming it and what is wrong."""
        problems = []
        for path in reversed(paths):
            try:
                ckpt = load_checkpoint(path)
                if not all(np.isfinite(a).all() for a in (ckpt.params, ckpt.updater_state, ckpt.stats,
                                                          *ckpt.rank_arrays.values())):
                    raise DataError(f"{path}: holds NaN or Inf values")
                return ckpt
            except DataError as e:
                aside = _unused(path + ".damaged")
                os.replace(path, aside)
                log.warning("%s; kept aside as %s, resuming from the checkpoint before it", e, aside)
                problems.append(str(e))
        raise DataError(f"{self.run_dir}/checkpoints: none of its {len(paths)} checkpoints can be resumed (they are "
                        f"kept aside as *.damaged): {'; '.join(problems)}")

    def restore(self, model, checkpoint: str | Checkpoint | None = None, other_dataset: bool = False) -> Checkpoint:
        """Load `checkpoint` (a path, `best`, `latest` or by default `chosen_checkpoint`'s, or one it loaded) into `model` on this
        rank and return it.

        Not a collective: each rank reads the file (evaluation and prediction). A checkpoint
        trained on another dataset than the run's `data.path` holds now (re-written by the
        ETL, say: scores could then count rows the model trained on) is refused unless
        `other_dataset`.
        """
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else chosen_checkpoint(self.run_dir, checkpoint)
        path = ckpt.path
        check_fits(ckpt, model.layout + model.stats_layout, meaning=meaning(model))
        if ckpt.manifest_sha256 != self.manifest_sha256 and not other_dataset:
            raise DataError(f"{path}: trained on a dataset whose manifest.json had sha256 {ckpt.manifest_sha256[:16]}..., "
                            f"but {self.data_path}/manifest.json now has {self.manifest_sha256[:16]}... (re-written "
                            "or another dataset: its rows may include ones the model trained on); `mpitrain eval` "
                            "and `predict` take --allow-other-dataset to use it anyway")
        self._restore(ckpt, model)
        load_table_rows(model, ckpt.path, ckpt.sharded_tables, ckpt.ranks)
        return ckpt

    def init_from(self, model, source: str) -> dict:
        """(Rank 0) Start `model` from another run's trained parameters (`model.init_from`): `source` is a run
        directory (its best checkpoint, else its newest) or a checkpoint file. Every parameter and running
        statistic whose name (`LAYER/ARRAY` of the layout: a list's layer by its position and type, a graph's node
        by its name) and shape match is copied; the others keep their fresh values. Logs and returns what was
        copied, what was skipped (the same name, another shape) and what starts fresh."""
        path = os.path.abspath(source)
        if not os.path.exists(path):
            raise DataError(f"model.init_from is {source!r}: no such run directory or checkpoint file")
        ckpt = chosen_checkpoint(path) if os.path.isdir(path) else load_checkpoint(path, rank_arrays=False)
        found = copy_matching(model, ckpt, self.backend.to_device)
        log.info("model.init_from %s: copied %d arrays (%s), skipped %d of another shape (%s), %d start fresh (%s)",
                 ckpt.path, len(found["copied"]), ", ".join(found["copied"]) or "none", len(found["skipped"]),
                 ", ".join(found["skipped"]) or "none", len(found["fresh"]), ", ".join(found["fresh"]) or "none")
        if not found["copied"]:
            raise DataError(f"model.init_from {ckpt.path}: no array of it fits this model (its layers "
                            f"{sorted({name.split('/')[0] for name, _ in ckpt.full_layout})}, this model's "
                            f"{sorted({name.split('/')[0] for name, _ in model.layout})}); expected layers of the "
                            "same names and shapes")
        return found

    def finished_layers(self, layouts: list[list]) -> list[np.ndarray]:
        """(Rank 0) The parameters of pretraining's finished layers, in order up to the first missing one.

        `layouts` holds each RBM's layout; a layer file of another shape or dataset is refused.
        metrics.jsonl starts afresh, keeping the pretrain records of the layers being skipped.
        """
        finished = []
        for index, layout in enumerate(layouts):
            path = self.files.pretrained_layer(index)
            if not os.path.exists(path):
                break
            self._refuse_unless_resuming("pretrained layers")
            ckpt = load_checkpoint(path)
            check_fits(ckpt, layout, None, self.manifest_sha256, self.data_path)
            finished.append(ckpt.params)
        keep_records(self.files.metrics, lambda r: r.get("kind") == "pretrain" and r.get("layer", 0) < len(finished))
        return finished

    def save_layer(self, index: int, layout: list, params: np.ndarray, epochs: int) -> str:
        """(Rank 0) Write pretraining's finished layer `index` (host parameters of `layout`)."""
        return write_checkpoint(self.files.pretrained_layer(index), Checkpoint(
            params, np.zeros(0, dtype=params.dtype), epochs, 0, 0, layout, {}, self.manifest_sha256, ""))

    def _refuse_unless_resuming(self, what: str) -> None:
        """`resume: never` refuses a run directory holding `what` of an earlier run, rather than overwrite them."""
        if self.policy == "never":
            raise ConfigError(f"resume is 'never', but {self.run_dir} holds {what} of an earlier run; use "
                              "resume=auto to continue it, or another run_dir")

    def _restore(self, ckpt: Checkpoint, model) -> None:
        model.params[...] = self.backend.to_device(ckpt.params)
        model.stats[...] = self.backend.to_device(ckpt.stats)


def load_table_rows(model, path: str, described: list[dict], written_by: int) -> None:
    """Load this rank's rows of `model.sharded_tables` (and their updater state, where it has an updater) from the
    checkpoint at `path`, whose tables are `described` and were written by `written_by` ranks; tables that differ
    from the model's are a DataError. Not a collective."""
    def shapes(tables: list[dict]) -> list:
        return sorted([t["name"], t["rows"], t["dim"]] for t in tables)

    saved = {table["name"]: table for table in described}
    if shapes(describe(model.sharded_tables)) != shapes(described):
        raise DataError(f"{path}: holds sharded tables {shapes(described)}, this config's model has "
                        f"{shapes(describe(model.sharded_tables))} (name, rows, dim)")
    for table in model.sharded_tables:
        for name, array in table.arrays().items():
            if name not in saved[table.name]["arrays"]:
                raise DataError(f"{path}: holds no {name} of {table.name} (was optimizer.type changed?)")
            read_share(path, written_by, saved[table.name], name, table.sharding, table.rank, array)


def _text_of(path: str) -> str | None:
    """The text of the file `path`, None when it cannot be read as text."""
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None
