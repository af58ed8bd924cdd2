"""HDF5 checkpoints, written atomically and independent of the number of ranks.

`checkpoints/ckpt-EEEE-SSSSSS.h5` holds the flat parameters, the flat updater state and
where to resume: epoch EEEE, step SSSSSS within it. Replicas are identical when a
checkpoint is taken, so rank 0 alone writes it and any number of ranks can resume it.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

import h5py
import numpy as np

from mpitrain.errors import DataError

PATTERN = re.compile(r"ckpt-(\d{4})-(\d{6})\.h5$")


@dataclass
class Checkpoint:
    params: np.ndarray
    updater_state: np.ndarray
    epoch: int
    step: int
    iteration: int
    path: str = ""


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def save_checkpoint(run_dir: str, ckpt: Checkpoint, keep: int) -> str:
    """Write to a temporary file, fsync, rename; then delete all but the newest `keep`."""
    folder = checkpoint_dir(run_dir)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"ckpt-{ckpt.epoch:04d}-{ckpt.step:06d}.h5")
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.create_dataset("params", data=ckpt.params)
        f.create_dataset("updater_state", data=ckpt.updater_state)
        f.attrs.update(epoch=ckpt.epoch, step=ckpt.step, iteration=ckpt.iteration)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in list_checkpoints(run_dir)[:-keep]:
        os.remove(old)
    return path


def list_checkpoints(run_dir: str) -> list[str]:
    """Complete checkpoints, oldest first (temporary files are never listed)."""
    paths = [p for p in glob.glob(os.path.join(checkpoint_dir(run_dir), "ckpt-*.h5")) if PATTERN.search(p)]
    return sorted(paths, key=lambda p: tuple(int(g) for g in PATTERN.search(p).groups()))


def load_checkpoint(path: str, n_params: int, n_state: int | None = None) -> Checkpoint:
    """Read a checkpoint and check it fits `n_params` parameters (and `n_state` updater values)."""
    try:
        with h5py.File(path, "r") as f:
            params, state = f["params"][...], f["updater_state"][...]
            ckpt = Checkpoint(params, state, int(f.attrs["epoch"]), int(f.attrs["step"]),
                              int(f.attrs["iteration"]), path)
    except (OSError, KeyError) as e:
        raise DataError(f"{path}: not a readable mpitrain checkpoint ({e})") from None
    if params.shape != (n_params,) or (n_state is not None and state.shape != (n_state,)):
        raise DataError(f"{path}: holds {params.size} parameters and {state.size} updater values, "
                        f"expected {n_params} and {n_state} for this config's model and optimizer")
    return ckpt
