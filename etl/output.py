"""Output folders that appear complete or not at all, and are never replaced by accident.

A job writes into a temporary sibling of `out` and renames it into place at the end. An
existing `out` is refused unless `overwrite`, and even then replaced only when it holds the
job's own `marker` file (or nothing), so a typo cannot delete a home directory. Used by the
ETL (marker manifest.json) and by scoring (marker _metrics.json).

`out` given as a symbolic link is replaced where the link points, and the link stays. While a
job runs it holds `TMP.lock` beside its temporary folder (`mpitrain.rundir.directory.FileLock`, released
by the operating system when the job dies, however it dies); a later job for the same `out`
removes the temporary folders whose lock nobody holds (jobs that were killed) and leaves the
others (jobs still running).
"""
from __future__ import annotations

import contextlib
import fnmatch
import glob
import logging
import os
import shutil
import uuid

from mpitrain.base.errors import DataError
from mpitrain.base.files import os_errors, refuse_existing
from mpitrain.rundir.directory import FileLock

log = logging.getLogger(__name__)


def check_apart(out: str, sources: list[str], tag: str) -> None:
    """Refuse an `out` that a job would read as its own data, before it starts: `out` (and so the temporary folder
    and lock beside it, `OUT.TAG-tmp-*`) inside a source folder or inside what a source's glob matches, `out` that
    is a source, and a source inside `out` (--overwrite would delete it). `sources` are local paths (globs allowed)."""
    out = os.path.realpath(out)
    beside = f"{out}.{tag}-tmp-00000000"
    for source in sources:
        if glob.has_magic(source):
            if any(_within_match(path, source) for path in (out, beside, beside + ".lock")):
                raise DataError(f"--out {out}: lies in what the source's pattern {source} matches, so the job would "
                                "read its own output (and its temporary folder) as data; write it elsewhere")
            source = source[:min(source.find(c) for c in "*?[" if c in source)].rpartition(os.sep)[0] or os.sep
        else:
            folder = os.path.realpath(source)
            if out == folder:
                raise DataError(f"--out {out}: is the source itself; write the output elsewhere")
            if out.startswith(folder.rstrip(os.sep) + os.sep):
                raise DataError(f"--out {out}: lies inside the source folder {folder}, so the job would read its "
                                "own output (and its temporary folder) as data; write it outside that folder")
        if os.path.realpath(source).startswith(out + os.sep):
            raise DataError(f"--out {out}: holds the source {os.path.realpath(source)}, which replacing it would "
                            "delete; write the output elsewhere")


def _within_match(path: str, pattern: str) -> bool:
    """Whether `path` is, or lies inside, a path the glob `pattern` matches (component by component, as glob
    matches)."""
    names, parts = path.split(os.sep), pattern.split(os.sep)
    return len(names) >= len(parts) and all(fnmatch.fnmatch(n, p) for n, p in zip(names, parts))


def check_out(out: str, overwrite: bool, marker: str, kind: str) -> None:
    """Refuse an existing `out` without `overwrite`, and with it anything but a `kind` folder (holding `marker`)."""
    out = os.path.realpath(out)
    if not os.path.lexists(out):
        return
    refuse_existing(out, overwrite, DataError)
    if not os.path.isdir(out) or (os.listdir(out) and not os.path.isfile(os.path.join(out, marker))):
        raise DataError(f"{out}: exists and is not a {kind} folder (no {marker}); "
                        "refusing to replace it, even with --overwrite")


@contextlib.contextmanager
def atomic_folder(out: str, overwrite: bool, marker: str, kind: str, tag: str, create: bool = True):
    """Yield a temporary sibling `OUT.TAG-tmp-XXXXXXXX` to write into (made unless not `create`); on success
    rename it to `out`, on any failure delete it and leave `out` as it was."""
    out = os.path.realpath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)  # the lock file goes beside the folder
    _remove_stale_temporaries(out, tag)
    tmp = f"{out}.{tag}-tmp-{uuid.uuid4().hex[:8]}"
    lock = FileLock(tmp + ".lock")
    try:
        with os_errors(lock.path, "starting the job beside its --out"):  # a full disk, a folder it cannot write
            lock.take()  # a fresh name: nobody else holds it
            if create:
                os.makedirs(tmp)
        yield tmp
        _move_into_place(tmp, out, overwrite, marker, kind, tag)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if os.path.exists(lock.path):
            os.remove(lock.path)
        lock.release()


def _remove_stale_temporaries(out: str, tag: str) -> None:
    """Remove the temporary folders `OUT.TAG-tmp-*` (and their locks) of jobs that were killed."""
    for path in sorted(glob.glob(glob.escape(f"{out}.{tag}-tmp-") + "*.lock")):
        lock = FileLock(path)
        if lock.take() is None:
            shutil.rmtree(path[:-len(".lock")], ignore_errors=True)
            os.remove(path)
            lock.release()
            log.info("removed %s, left by a job that was killed", path[:-len(".lock")])


def _move_into_place(tmp: str, out: str, overwrite: bool, marker: str, kind: str, tag: str) -> None:
    """Rename `tmp` to `out`; an old `out` is moved aside first and deleted only afterwards."""
    check_out(out, overwrite, marker, kind)  # again: something may have appeared there while the job ran
    if not os.path.lexists(out):
        os.rename(tmp, out)
        return
    old = f"{out}.{tag}-old-{uuid.uuid4().hex[:8]}"
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old)
