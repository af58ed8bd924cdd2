"""What a test checks of what a command left: its one error line (exit 2, no traceback, a quick exit), and the
files under a folder, to compare before and after it.

    line = one_error_line(result, elapsed)          # the `mpitrain CMD: error: ...` line, after the checks
    before = file_digests(folder)                   # {relative path: sha256}, but run directories' locks
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from mpitrain.rundir.directory import RunDir


def one_error_line(result: subprocess.CompletedProcess, elapsed: float) -> str:
    """The command's one error line, after checking it ended as every user error does: exit 2, no traceback, and
    within a minute (no hang, no watchdog)."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, result.stderr
    assert elapsed < 60
    return errors[0]


def file_digests(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under `folder` by its path relative to it, but a run directory's lock (it names its
    newest holder) and files named in `skip`."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and str(p) != RunDir(str(p.parent)).lock and p.name not in skip}
