"""The one small interface every synchronization mode implements."""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import typing
from dataclasses import dataclass

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.options import Options

if typing.TYPE_CHECKING:  # the registry is read when a config is loaded, which needs no MPI
    from mpitrain.parallel.comm import Communicator

log = logging.getLogger("mpitrain")


@dataclass(frozen=True)
class NoOptions(Options):
    """A mode that reads no keys of `sync` beyond every mode's."""


def options_of(cls, config):
    """Options dataclass `cls` with the values of `config`'s keys of the same names (a `SyncConfig`, which holds
    every mode's keys side by side). Not a collective."""
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


def is_array(value) -> bool:
    """Whether a value of a mode's `state()` is an array (a live buffer) rather than a number."""
    return hasattr(value, "shape")


class Synchronizer:
    """Keeps the replicas of one model in step; the trainer never knows which mode it has.

    Every method that takes a model is a collective: every rank calls it, in the same order
    (`start` once; `grads_ready` during backward; `step` after each backward; `end_epoch` after an epoch's last step;
    `load_state` then `load_rank_arrays` once when resuming), and so is `merged`. The model is any
    `mpitrain.nn.flat.FlatModel` (a `Sequential`, an RBM): a mode sees its flat `params`,
    `grads` and `stats`, and the updater's flat `state`.

    `step` is called once per training step after backward (the model's flat `grads` are
    filled) and must update the flat `params`. `replicas_identical` says whether the mode
    promises bit-identical replicas; such modes also average the model's running statistics
    (`stats`, batch norm's) at each epoch end, so all replicas evaluate alike.

    A checkpoint reads the training state and leaves it alone (`mpitrain.rundir.checkpointer`): `local_arrays`
    names this rank's live arrays, `rank_local` those of them that may differ between ranks (between averagings,
    between epoch ends), and `merged` gives, for one that does, the one value the checkpoint keeps as the run's
    model, in a buffer of its own. A resume on as many ranks gives each rank its own arrays back
    (`load_rank_arrays`), so it continues bit for bit; on another number of ranks every rank starts from the merged
    state.

    A mode declares its own keys of `sync` as a small dataclass, `Options` (the config composes `SyncConfig` of
    every mode's: `mpitrain.config.sections`), read as `self.options`; the keys every mode reads (`mode`,
    `embeddings`, `check_replicas`) are `self.config`'s. Its checkpoint state is one pair: `state()`, the
    attributes `state_names` names (numbers, the same on every rank: sharing's tau; arrays, this rank's live
    buffers: its residual), and `load_state`, which takes them back. `metrics()` are the numbers a mode reports per
    metrics window (tau, sparsity); neither is the updater's `state` nor the model's running statistics `stats`.
    """

    Options: typing.ClassVar[type] = NoOptions
    #: the attributes that hold what a checkpoint keeps of the mode to resume it exactly (`state`)
    state_names: typing.ClassVar[tuple[str, ...]] = ()
    #: the names of `local_arrays` whose values may differ between ranks; a checkpoint keeps each rank's own of
    #: those that do. Every mode: the running statistics, averaged at epoch ends only.
    rank_local: tuple[str, ...] = ("stats",)
    replicas_identical = True
    #: the rows of each micro-batch whose gradient the stepper hands to `add_micro` one by one before `step`
    #: (`sync.deterministic`); 0: `step` takes the step's gradient whole
    micro_rows = 0

    def __init__(self, comm: Communicator, config):
        self.comm, self.config = comm, config
        self.options = options_of(self.Options, config)
        self.reset()

    def reset(self) -> None:
        """The mode's run state (sharing's tau and step count, averaging's steps since the last averaging) as a new
        run starts it. `start` calls it: a synchronizer handed to a second run (`mpitrain.train` twice with one
        `sync`) starts that run as a new one would, and a resumed run then loads its checkpoint's numbers."""

    def start(self, model, updater) -> None:
        """Make every rank start from rank 0's parameters, running statistics and updater state, the mode's own state
        reset (`reset`). A collective."""
        self.reset()
        self.comm.bcast_(model.params)
        if model.stats.size:
            self.comm.bcast_(model.stats)
        if updater.state.size:
            self.comm.bcast_(updater.state)
        self.comm.bytes_sent = 0

    def grads_ready(self, model, start: int) -> None:
        """Backward has finished `model.grads[start:]` (called after each layer, `start` never growing within a
        step). A collective where a mode starts communication here (overlapped `allreduce`): every rank's model
        calls it with the same starts in the same order. Nothing by default."""

    def step(self, model, updater) -> None:
        """Update `model.params` from this rank's `model.grads` and the other ranks'. A collective."""
        raise NotImplementedError

    def end_epoch(self, model, updater) -> None:
        """After an epoch's last step: the mode's own work, then the running statistics averaged. A collective."""
        self._end_epoch(model, updater)
        self.average_stats(model)

    def _end_epoch(self, model, updater) -> None:
        """Nothing by default: modes that sync every step are already in step."""

    def average_stats(self, model) -> None:
        """Average the running statistics across ranks (modes that keep one model). A collective."""
        if self.replicas_identical and model.stats.size:
            self.comm.average_(model.stats)

    def state(self) -> dict:
        """What a checkpoint keeps of this mode to resume it exactly, by name (`state_names`): numbers, the same on
        every rank (sharing's tau and step count), and arrays, this rank's live buffers to read and leave alone
        (sharing's residual). Not a collective."""
        return {name: getattr(self, name) for name in self.state_names}

    def local_arrays(self, model, updater) -> dict:
        """This rank's training state by its name in a checkpoint: `params`, `stats`, `updater_state` and
        `sync/NAME` for each array of `state()`. The live buffers themselves, to read and leave alone. Not a collective."""
        return {"params": model.params, "stats": model.stats, "updater_state": updater.state,
                **{f"sync/{name}": value for name, value in self.state().items() if is_array(value)}}

    def merged(self, name: str, array):
        """The one value a checkpoint keeps of `local_arrays()[name]` (`array`, one of `rank_local`) when the ranks'
        differ: by default their mean, in a new buffer; the live `array` is left as it is. What `mpitrain eval`,
        `predict` and `export` read, and what a resume on another number of ranks starts every rank from. A
        collective: every rank calls it for the same names in the same order."""
        mean = array.copy()
        self.comm.average_(mean)
        return mean

    def load_state(self, numbers: dict, arrays: dict) -> None:
        """Take back a checkpoint's `state()`, after `start`: `numbers` (every rank has them) into the attributes
        of those names, as the type they have; `arrays` (read by rank 0; empty on the other ranks) copied into the
        live buffers on every rank. What this mode does not keep (another mode's state: `sync.mode` may change on
        resume) is left alone, and a dropped array is named. A collective."""
        own = self.state()
        for name, value in numbers.items():
            if name in own and not is_array(own[name]):
                setattr(self, name, type(own[name])(value))
        arrays_kept = {name for name, value in own.items() if is_array(value)}
        for name in sorted(set(arrays) - arrays_kept):  # only rank 0 has read any
            log.warning("the checkpoint's %r (of another sync mode) is dropped: sync.mode %s does not keep it",
                        name, self.config.mode)
        for name in self.comm.bcast_obj(sorted(set(arrays) & arrays_kept)):
            if self.comm.is_root:
                own[name][...] = array_module(own[name]).asarray(arrays[name])
            self.comm.bcast_(own[name])

    def load_rank_arrays(self, model, updater, saved: dict) -> None:
        """Give each rank its own arrays of a checkpoint written by as many ranks, after `start` and `load_state`: `saved` maps names of `local_arrays` to the ranks' arrays stacked in rank order (on rank
        0; empty elsewhere). Only the names this mode lets differ (`rank_local`) are taken: another mode's
        rank-local parameters would split this mode's one model. A collective."""
        own = self.local_arrays(model, updater)
        for name in self.comm.bcast_obj(sorted(set(saved) & set(self.rank_local) & set(own))):
            mine = np.empty(own[name].size, own[name].dtype)
            self.comm.scatter_host(saved.get(name), mine)
            own[name][...] = array_module(own[name]).asarray(mine).reshape(own[name].shape)

    def metrics(self) -> dict:
        """Mode-specific numbers for metrics.jsonl (e.g. tau and sparsity). Not a collective."""
        return {}

    def summary(self) -> dict:
        """What the mode adds to summary.json (`auto`'s choices). Not a collective."""
        return {}


def clip_gradients(model, clip_norm: float) -> None:
    """Scale `model.grads` in place so that their L2 norm over all parameters is at most `clip_norm` (PyTorch's
    clip_grad_norm_: times clip_norm / (norm + 1e-6) when that is below 1, else untouched); nothing when it is 0.

    Every mode clips the gradient it hands to the updater, here and nowhere else (`apply_update`, sharing's step):
    in `allreduce` the ranks' average, the same on every rank, so the replicas stay identical; in the other modes
    each rank's own. An embedding table is read and scaled at the rows that may be non-zero (`TableGrad.written`),
    so a step still costs its batch's rows. The factor stays on the device (no wait for the host). Not a
    collective."""
    if not clip_norm:
        return
    xp = model.xp
    parts = [model.grads[model.dense_start:]]
    for table in model.sparse_tables:
        grads = model.grads[table.start:table.stop].reshape(table.rows, table.dim)
        parts.append(grads if table.written is None else grads[table.written])
    squares = sum(xp.vdot(part.ravel(), part.ravel()) for part in parts)
    factor = xp.minimum(clip_norm / (xp.sqrt(squares) + 1e-6), 1.0).astype(model.grads.dtype)
    parts[0] *= factor
    for table, part in zip(model.sparse_tables, parts[1:]):
        if table.written is None:
            part *= factor
        else:
            model.grads[table.start:table.stop].reshape(table.rows, table.dim)[table.written] = part * factor


def apply_update(model, updater) -> None:
    """`model.params += updater.delta(model.grads, model.params)`, the gradient clipped first (`clip_gradients`);
    where the model has embedding tables and the
    updater moves only parameters with a gradient (plain SGD; tables get no L2), the tables' steps are taken on
    the rows that hold gradients (`TableGrad.written`) and the rest of the tables is skipped: a step of a 10^6-row
    table costs its batch's rows, not the table (a step's rows are small new arrays; a whole table, after a dense
    exchange, goes through the updater's own delta buffer). The same values either way. Then sharded tables
    (`model.sharded_tables`) step the rows their backward wrote, lazily (`ShardedTable.step`). Not a collective."""
    clip_gradients(model, updater.clip_norm)
    if not model.sparse_tables or not updater.steps_rows_alone:
        model.params += updater.delta(model.grads, model.params)
    else:
        _step_table_rows(model, updater)
    for table in model.sharded_tables:
        table.step(updater)


def _step_table_rows(model, updater) -> None:
    """`apply_update`'s step of a model whose replicated tables step only their written rows."""
    dense = model.dense_start
    model.params[dense:] += updater.delta(model.grads[dense:], model.params[dense:], dense)
    for table in model.sparse_tables:
        params = model.params[table.start:table.stop].reshape(table.rows, table.dim)
        grads = model.grads[table.start:table.stop].reshape(table.rows, table.dim)
        if table.written is None:
            params += updater.row_delta(grads, updater.out[table.start:table.stop].reshape(grads.shape))
        else:
            params[table.written] += updater.row_delta(grads[table.written])


def parameter_hash(*arrays: np.ndarray) -> str:
    """A short hash of the bytes of host `arrays` (parameters, statistics), to compare replicas across ranks cheaply."""
    digest = hashlib.blake2b(digest_size=8)
    for array in arrays:
        digest.update(np.ascontiguousarray(array).view(np.uint8))
    return digest.hexdigest()


def check_replicas(comm: Communicator, *arrays: np.ndarray) -> list[str]:
    """Gather every rank's hash of host `arrays`; raise on every rank if they differ. A collective."""
    hashes = comm.allgather_obj(parameter_hash(*arrays))
    if len(set(hashes)) > 1:
        raise RuntimeError(f"replicas diverged: parameter hashes per rank {hashes}")
    return hashes
