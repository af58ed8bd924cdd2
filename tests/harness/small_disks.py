"""Small file systems for the disk-full and read-only tests: a tmpfs mounted on a folder (root only), made full
at a chosen moment, and unmounted at the end also when the test failed.

    with SmallDisks() as disks:
        disk = disks.mount(tmp_path / "disk", size="1m")     # or "ro", or nr_inodes=...
        ...                                                 # write what must fit
        fill(disk)                                          # no page left: the next new page fails (ENOSPC)
        limit_files(disk, more=2)                           # 2 more files or folders, then ENOSPC on create

A tmpfs counts whole pages (a file of 1 byte holds one) and one inode per file or folder; `fill` takes every
page left, `limit_files` the inodes: a file system that has bytes but no inode left refuses to create a file,
the way a disk of many small files ends. Both are the kernel's own ENOSPC, with nothing simulated.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

FILLER = ".filler"  # the file `fill` grows until the file system refuses a page


class SmallDisks:
    def __init__(self):
        self.mounts: list[Path] = []

    def __enter__(self) -> SmallDisks:
        return self

    def __exit__(self, *exc) -> None:
        for folder in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(folder)], check=False)

    def mount(self, folder: Path, *options: str, size: str = "1m") -> Path:
        """A tmpfs of `size` on the new folder `folder`, with mount `options` ("ro", "nr_inodes=N")."""
        folder.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(folder)],
                       check=True)
        self.mounts.append(folder)
        return folder


def fill(disk: Path, leave: int = 0) -> None:
    """Take every page `disk` has left but `leave` (a file of its own at its top): the write that needs one page
    more fails."""
    page = b"\0" * 4096
    with open(disk / FILLER, "ab", buffering=0) as f:
        try:
            while True:
                f.write(page)
        except OSError:
            pass
        f.truncate(max(f.tell() - leave * len(page), 0))


def free_space(disk: Path) -> None:
    """Give back what `fill` took."""
    (disk / FILLER).unlink()


def limit_files(disk: Path, more: int) -> None:
    """Let `disk` hold only `more` files or folders beyond those it holds now (a remount with fewer inodes)."""
    stats = os.statvfs(disk)
    used = stats.f_files - stats.f_ffree
    subprocess.run(["mount", "-o", f"remount,nr_inodes={used + more}", str(disk)], check=True)
