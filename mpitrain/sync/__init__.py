"""Synchronizers keep the ranks' replicas one model; `create_synchronizer` picks one by `sync.mode`.

| mode        | what crosses the network            | when to pick it                                       |
| ----------- | ----------------------------------- | ----------------------------------------------------- |
| `allreduce` | the flat gradient, every step       | the baseline: synchronous SGD, same result as 1 rank  |
|             |                                     | with N times the batch; fast interconnects            |
| `averaging` | the flat parameters (+ updater      | slow networks or many ranks: communication falls by   |
|             | state), every `frequency` steps     | `frequency`; DL4J/IterativeReduce parameter averaging |
| `none`      | nothing                             | one rank, or independent runs for baselines           |
"""
from __future__ import annotations

from mpitrain.sync.base import Synchronizer, check_replicas, parameter_hash
from mpitrain.sync.modes import AllreduceSync, AveragingSync, NoSync

SYNCHRONIZERS = {"none": NoSync, "allreduce": AllreduceSync, "averaging": AveragingSync}

__all__ = ["Synchronizer", "create_synchronizer", "check_replicas", "parameter_hash", "SYNCHRONIZERS"]


def create_synchronizer(config, comm) -> Synchronizer:
    """The synchronizer for `config.mode` (a SyncConfig) on communicator `comm`."""
    return SYNCHRONIZERS[config.mode](comm, config)
