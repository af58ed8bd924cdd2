"""A run directory belongs to one job at a time, and a run's own config.yaml always points at its own folder.

    lock = FileLock(os.path.join(run_dir, LOCK_NAME))   # rank 0, before anything is written
    owner = lock.take()          # None: ours until released or the process ends; else "host H pid P"

The lock is `fcntl.flock` on RUN_DIR/.lock: the operating system releases it when the owning
process dies, however it dies, so a crashed job never leaves it stuck. Beside the lock the
file holds the owner's host and pid, for the message a second job gets.

A run directory copied with `cp -r runs/A runs/B` holds a config.yaml whose `run_dir` still
names A; training `runs/B/config.yaml` must write B, not A. `own_run_dir` says which folder a
config file inside a run directory belongs to.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket


LOCK_NAME = ".lock"
RUN_FILES = ("checkpoints", "metrics.jsonl", "summary.json")


class FileLock:
    """An exclusive, non-blocking lock on the file `path` (a run directory's `.lock`, an ETL output's), released
    when the process exits. Not a collective: one process (rank 0, the Spark driver) takes it."""

    def __init__(self, path: str):
        self.path = path
        self.fd = None

    def take(self) -> str | None:
        """Take the lock: None once it is ours, else its holder's host and pid (the lock stays theirs)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                return owner
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode(), 0)
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def is_run_dir(folder: str) -> bool:
    """Whether `folder` holds a run's files (checkpoints, metrics or a summary)."""
    return any(os.path.exists(os.path.join(folder, name)) for name in RUN_FILES)


def own_run_dir(config_path: str) -> str | None:
    """The run directory a config file belongs to: its folder when the file is a run's config.yaml
    (the folder holds the run's files), else None (a config of the user's, which names its run_dir)."""
    folder = os.path.dirname(os.path.abspath(config_path))
    return folder if os.path.basename(config_path) == "config.yaml" and is_run_dir(folder) else None
