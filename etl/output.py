"""Output folders that appear complete or not at all, and are never replaced by accident.

A job writes into a temporary sibling of `out` and renames it into place at the end. An
existing `out` is refused unless `overwrite`, and even then replaced only when it holds the
job's own `marker` file (or nothing), so a typo cannot delete a home directory. Used by the
ETL (marker manifest.json) and by scoring (marker _metrics.json).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid

from mpitrain.errors import DataError


def check_out(out: str, overwrite: bool, marker: str, kind: str) -> None:
    """Refuse an existing `out` without `overwrite`, and with it anything but a `kind` folder (holding `marker`)."""
    if not os.path.lexists(out):
        return
    if not overwrite:
        raise DataError(f"{out}: exists; pass --overwrite to replace it")
    if not os.path.isdir(out) or (os.listdir(out) and not os.path.isfile(os.path.join(out, marker))):
        raise DataError(f"{out}: exists and is not a {kind} folder (no {marker}); "
                        "refusing to replace it, even with --overwrite")


@contextlib.contextmanager
def atomic_folder(out: str, overwrite: bool, marker: str, kind: str, tag: str, create: bool = True):
    """Yield a temporary sibling `OUT.TAG-tmp-XXXXXXXX` to write into (made unless not `create`); on success
    rename it to `out`, on any failure delete it and leave `out` as it was."""
    tmp = f"{out}.{tag}-tmp-{uuid.uuid4().hex[:8]}"
    if create:
        os.makedirs(tmp)
    try:
        yield tmp
        _move_into_place(tmp, out, overwrite, marker, kind, tag)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
