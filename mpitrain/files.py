"""Writing a run's small files (config.yaml, summary.json, eval-SPLIT.json, predictions) so that a failure
never leaves half a file and always says, in one line, which path failed and why.

    write_file(path, lambda f: json.dump(summary, f))      # temporary file, then rename
"""
from __future__ import annotations

import os
from contextlib import contextmanager

from mpitrain.errors import MpitrainError, describe


def write_file(path: str, write, binary: bool = False) -> None:
    """Call `write(f)` on a temporary file beside `path`, then rename it to `path`: `path` is whole or as it was.

    A folder at `path`, or a file system that refuses (read-only, full), is a `MpitrainError` naming it.
    """
    if os.path.isdir(path):
        raise MpitrainError(f"{path}: is a folder; expected a file path to write")
    tmp = path + ".tmp"
    with os_errors(path, "writing it", cleanup=tmp):
        with open(tmp, "wb" if binary else "w") as f:
            write(f)
        os.replace(tmp, path)


@contextmanager
def os_errors(path: str, doing: str, cleanup: str | None = None):
    """Turn an operating-system error in the block into one line naming `path` and what was being done,
    removing the partial file `cleanup` first."""
    try:
        yield
    except OSError as e:
        if cleanup and os.path.exists(cleanup):
            os.remove(cleanup)
        raise MpitrainError(f"{path}: {describe(e)} while {doing}") from None
