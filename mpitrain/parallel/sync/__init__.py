"""Synchronizers keep the ranks' replicas one model; `create_synchronizer` picks one by `sync.mode`.

| mode        | what crosses the network            | when to pick it                                       |
| ----------- | ----------------------------------- | ----------------------------------------------------- |
| `allreduce` | the flat gradient, every step       | the baseline: synchronous SGD, same result as 1 rank  |
|             |                                     | with N times the batch; fast interconnects            |
| `averaging` | the flat parameters (+ updater      | slow networks or many ranks: communication falls by   |
|             | state), every `frequency` steps     | `frequency`; DL4J/IterativeReduce parameter averaging |
| `sharing`   | each rank's update elements beyond  | slow networks, large models: ~1% of the bytes of      |
|             | +-tau, as sparse int32 messages;    | `allreduce`; DL4J SharedTrainingMaster / Strom 2015;  |
|             | or summed on the way, by index      | `sync.exchange` (`exchange.py`) keeps it within a     |
|             | blocks or recursive halving and     | dense allreduce's bytes and log2 N messages per rank  |
|             | doubling (SparCML)                  | on many ranks                                         |
| `none`      | nothing                             | one rank, or independent runs for baselines           |
| `allreduce` | int64 fixed-point sums of each      | the same model bit for bit on any number of ranks     |
| + determ.   | micro-batch's gradient, every step  | (`deterministic.py`): reproducibility, at a price     |
| `auto`      | one of allreduce (float32, bf16,    | not knowing the network: measured at every epoch's    |
|             | powersgd), sharing or averaging     | end, the least lossy whose communication hides in the |
|             |                                     | step's compute (`auto.py`)                            |

A mode is a `Synchronizer` in a file of its own with its options dataclass (`Options`) and checkpoint state
(`state_names`) beside it, plus its line in `SYNCHRONIZERS`; the config's `sync` section is composed of every
mode's options (docs/sync-modes.md, "Adding a mode or a codec").
"""
from __future__ import annotations

from mpitrain.parallel.sync.auto import AutoSync
from mpitrain.parallel.sync.base import Synchronizer, check_replicas, parameter_hash
from mpitrain.parallel.sync.deterministic import DeterministicSync
from mpitrain.parallel.sync.exchange import EXCHANGES
from mpitrain.parallel.sync.modes import AllreduceSync, AveragingSync, NoSync
from mpitrain.parallel.sync.sharing import SharingSync

SYNCHRONIZERS = {"none": NoSync, "allreduce": AllreduceSync, "averaging": AveragingSync, "sharing": SharingSync,
                 "auto": AutoSync}

__all__ = ["Synchronizer", "create_synchronizer", "check_replicas", "parameter_hash", "SYNCHRONIZERS", "EXCHANGES"]


def create_synchronizer(config, comm) -> Synchronizer:
    """The synchronizer for `config.mode` (a SyncConfig, validated here) on communicator `comm`, which must be
    the one the run uses (`mpitrain.init()`'s, or the run's `comm`); `allreduce` with `sync.deterministic`, its
    exact variant."""
    config = config.validate("create_synchronizer")
    return (DeterministicSync if config.deterministic else SYNCHRONIZERS[config.mode])(comm, config)
