"""The one small interface every synchronization mode implements."""
from __future__ import annotations

import hashlib

import numpy as np

from mpitrain.backend import to_host
from mpitrain.comm import Communicator


class Synchronizer:
    """Keeps the replicas of one model in step; the trainer never knows which mode it has.

    `step` is called once per training step after backward (the model's flat `grads` are
    filled) and must update the flat `params`; `end_epoch` runs after each epoch's last
    step. `replicas_identical` says whether the mode promises bit-identical replicas.
    """

    replicas_identical = True

    def __init__(self, comm: Communicator, config):
        self.comm, self.config = comm, config

    def start(self, model, updater) -> None:
        """Make every rank start from rank 0's parameters and updater state."""
        self.comm.bcast_(model.params)
        if updater.state.size:
            self.comm.bcast_(updater.state)
        self.comm.bytes_sent = 0

    def step(self, model, updater) -> None:
        raise NotImplementedError

    def end_epoch(self, model, updater) -> None:
        """Nothing by default: modes that sync every step are already in step."""

    def flush(self, model, updater) -> None:
        """Put pending, rank-local changes into the parameters before a checkpoint (a collective)."""

    def state(self) -> dict:
        """Numbers a checkpoint must keep so a resumed run continues exactly (e.g. sharing's tau)."""
        return {}

    def load_state(self, state: dict) -> None:
        """Take back what `state` returned (of this mode, or another mode's: then nothing applies)."""

    def stats(self) -> dict:
        """Mode-specific numbers for metrics.jsonl (e.g. tau and sparsity)."""
        return {}


def parameter_hash(params) -> str:
    """A short hash of the parameter bytes, to compare replicas across ranks cheaply."""
    return hashlib.blake2b(np.ascontiguousarray(to_host(params)).view(np.uint8), digest_size=8).hexdigest()


def check_replicas(comm: Communicator, params) -> list[str]:
    """Gather every rank's parameter hash; raise on every rank if they differ."""
    hashes = comm.allgather_obj(parameter_hash(params))
    if len(set(hashes)) > 1:
        raise RuntimeError(f"replicas diverged: parameter hashes per rank {hashes}")
    return hashes
