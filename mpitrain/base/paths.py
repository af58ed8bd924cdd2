"""Paths that a file names, confined to the folder the file belongs to.

    confined("train/shard-00000.h5", "data/manifest.json", "splits.train.shards[0].path")   # the path itself
    confined("../outside/x.h5", ...)     # DataError: not inside the dataset; nothing is read
    leaves(root, full)                   # a local path whose real location (symlinks followed) is outside root

A dataset's manifest, a run's or a study's records come from someone else as often as not (a shared folder, a
bucket). A path they name is read only when it is relative, '/'-separated, normalized (no '.' or '..' part, no
empty part) and so inside the folder; and, on a local file system, only when no symlink takes it out of the folder.
One rule for every stored path: the one-line refusal names the file, the key and the path, before anything is
read.
"""
from __future__ import annotations

import os
import posixpath

from mpitrain.base.errors import DataError


def confined(stored, where: str, what: str) -> str:
    """`stored` when it is a relative, normalized '/'-separated path inside its folder; else one DataError naming
    the file `where`, its key `what` and the path."""
    if not (isinstance(stored, str) and stored and "\\" not in stored and "\0" not in stored
            and not stored.startswith("/") and posixpath.normpath(stored) == stored
            and stored != "." and stored.split("/")[0] != ".."):
        raise DataError(f"{where}: {what} {stored!r} is not a path inside its folder; expected a relative path "
                        "without '.', '..' or an empty part (a file the folder holds)")
    return stored


def leaves(root: str, full: str) -> bool:
    """Whether the local path `full` (inside `root` by name) resolves, symlinks followed, to a place outside
    `root`'s own real location."""
    real_root, real = os.path.realpath(root), os.path.realpath(full)
    return real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep)
