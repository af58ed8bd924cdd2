"""The one small interface every synchronization mode implements."""
from __future__ import annotations

import hashlib
import logging
import typing

import numpy as np

from mpitrain.parallel.backend import array_module

if typing.TYPE_CHECKING:  # the registry is read when a config is loaded, which needs no MPI
    from mpitrain.parallel.comm import Communicator

log = logging.getLogger("mpitrain")


class Synchronizer:
    """Keeps the replicas of one model in step; the trainer never knows which mode it has.

    Every method that takes a model is a collective: every rank calls it, in the same order
    (`start` once; `grads_ready` during backward; `step` after each backward; `end_epoch` after an epoch's last step;
    `flush` before each checkpoint; `load_arrays` once when resuming). The model is any
    `mpitrain.nn.flat.FlatModel` (a `Sequential`, an RBM): a mode sees its flat `params`,
    `grads` and `stats`, and the updater's flat `state`.

    `step` is called once per training step after backward (the model's flat `grads` are
    filled) and must update the flat `params`. `replicas_identical` says whether the mode
    promises bit-identical replicas; such modes also average the model's running statistics
    (`stats`, batch norm's) at each epoch end and before each checkpoint, so all replicas
    evaluate alike.

    Three names, three meanings: `metrics()` are the numbers a mode reports per metrics
    window (tau, sparsity); `numbers()` and `arrays()` are what a checkpoint keeps of the
    mode to resume it (sharing's tau; its residual). Neither is the updater's `state` nor
    the model's running statistics `stats`.
    """

    replicas_identical = True

    def __init__(self, comm: Communicator, config):
        self.comm, self.config = comm, config

    def start(self, model, updater) -> None:
        """Make every rank start from rank 0's parameters, running statistics and updater state. A collective."""
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

    def flush(self, model, updater) -> None:
        """Put pending, rank-local changes into the parameters before a checkpoint. A collective."""
        self._flush(model, updater)
        self.average_stats(model)

    def _end_epoch(self, model, updater) -> None:
        """Nothing by default: modes that sync every step are already in step."""

    def _flush(self, model, updater) -> None:
        """Nothing by default: no rank-local changes are pending."""

    def average_stats(self, model) -> None:
        """Average the running statistics across ranks (modes that keep one model). A collective."""
        if self.replicas_identical and model.stats.size:
            self.comm.average_(model.stats)

    def numbers(self) -> dict:
        """Numbers a checkpoint must keep so a resumed run continues exactly (e.g. sharing's tau)."""
        return {}

    def arrays(self) -> dict:
        """Arrays a checkpoint must keep beside `numbers` (identical on every rank after `flush`)."""
        return {}

    def load_numbers(self, numbers: dict) -> None:
        """Take back what `numbers` returned (of this mode, or another mode's: then nothing applies)."""

    def load_arrays(self, saved: dict) -> None:
        """Copy the arrays rank 0 read from a checkpoint (`saved`; empty on the other ranks) into this
        mode's `arrays` on every rank; arrays this mode does not keep are dropped, saying so. A collective."""
        own = self.arrays()
        for name in sorted(set(saved) - set(own)):  # only rank 0 has read any
            log.warning("the checkpoint's %r (of another sync mode) is dropped: sync.mode %s does not keep it",
                        name, self.config.mode)
        for name in self.comm.bcast_obj(sorted(set(saved) & set(own))):
            if self.comm.is_root:
                own[name][...] = array_module(own[name]).asarray(saved[name])
            self.comm.bcast_(own[name])

    def metrics(self) -> dict:
        """Mode-specific numbers for metrics.jsonl (e.g. tau and sparsity). Not a collective."""
        return {}


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
