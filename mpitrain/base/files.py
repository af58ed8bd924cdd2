"""The one way mpitrain writes a file whole (config.yaml, summary.json, manifest.json, metrics.jsonl trimmed on resume,
eval-SPLIT.json, predictions, checkpoints, ONNX models): a failure never leaves half a file and always says, in one
line, which path failed and why.

    write_file(path, lambda f: json.dump(summary, f))      # temporary file, fsync, rename
    with os_errors(path, "reading it"): ...                 # an OSError as one line naming the path
    refuse_existing(path, overwrite)                        # an existing path refused unless --overwrite
    dangling_link("runs/exp")                               # "runs" when it is a symlink to nothing, else None
"""
from __future__ import annotations

import errno
import io
import os
from contextlib import contextmanager

from mpitrain.base.errors import MpitrainError, describe


def write_file(path: str, write, binary: bool = False, size: int = 0) -> None:
    """Call `write(f)` on a temporary file beside `path` (its folder made if need be), fsync, rename it to `path`:
    `path` is whole or as it was, also after a crash.

    A folder at `path`, or a file system that refuses (read-only, full), is a `MpitrainError` naming it,
    with the space needed (`size`, bytes) and free when the disk is full.
    """
    if os.path.isdir(path):
        raise MpitrainError(f"{path}: is a folder; expected a file path to write")
    tmp = path + ".tmp"
    with os_errors(path, "writing it", cleanup=tmp, size=size):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(tmp, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def write_hdf5(path: str, fill) -> memoryview:
    """Call `fill(h5)` on an HDF5 file built in memory, then write it whole with `write_file` and return its bytes.
    HDF5's own writes to a full disk fail at random points and can crash the process; one plain write of the
    finished file fails cleanly, as one line naming `path` and the space it needs. (Built in an `io.BytesIO`: twice
    as fast as h5py's core driver here, and no second copy to take the bytes out.)"""
    import h5py  # here: most commands never write HDF5

    built = io.BytesIO()
    with h5py.File(built, "w") as h5:
        fill(h5)
    image = built.getbuffer()
    write_file(path, lambda f: f.write(image), binary=True, size=image.nbytes)
    return image


def refuse_existing(path: str, overwrite: bool, error=MpitrainError) -> None:
    """Refuse an existing `path` (file, folder or link) unless `overwrite`, in the words every command uses."""
    if os.path.lexists(path) and not overwrite:
        raise error(f"{path}: exists; pass --overwrite to replace it")


def dangling_link(path: str) -> str | None:
    """The first of `path`'s folders, or `path` itself, that is a symbolic link leading nowhere (to a missing path,
    or a loop of links), else None: what a "File exists" from making `path`'s folders means, said plainly."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        part = os.sep.join(parts[:i])
        if os.path.islink(part) and not os.path.exists(part):
            return part
    return None


@contextmanager
def os_errors(path: str, doing: str, cleanup: str | None = None, size: int = 0):
    """Turn an operating-system error in the block into one line naming `path` and what was being done
    (on a full disk, with the `size` needed and the space free), removing the partial file `cleanup` first."""
    try:
        yield
    except OSError as e:
        partial = bool(cleanup) and os.path.exists(cleanup)
        if partial:
            os.remove(cleanup)
        space = _space_left(path, size) if e.errno == errno.ENOSPC else ""
        removed = "; the partial file is removed" if partial else ""
        raise MpitrainError(f"{path}: {describe(e)} while {doing}{space}{removed}") from None


def _space_left(path: str, size: int) -> str:
    """What a full file system has left, for an error line: no file can be created when its inodes are all used
    (many small files), whatever the bytes free; otherwise the `size` needed against the space free, when known."""
    try:
        stats = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return ""
    if stats.f_files and not stats.f_favail:
        return f" (no file can be created: all {stats.f_files} inodes of the file system are used)"
    if size:
        return f" (it needs about {_megabytes(size)}, {_megabytes(stats.f_bavail * stats.f_frsize)} free)"
    return ""


def _megabytes(n: int) -> str:
    return f"{n / 2**20:.1f} MB"
