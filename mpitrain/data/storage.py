"""Where a dataset lives: a local or shared POSIX folder (Lustre, GPFS, NFS) or an fsspec URL (s3://, http(s)://).

    store = open_storage("s3://bucket/fashion", {"anon": False})   # or a folder: open_storage("data/fashion")
    store.read_bytes("manifest.json"); store.open("train/shard-00000.h5")   # a file object h5py reads

A folder is read by HDF5's own file driver (`store.local_path`); a URL through fsspec with
no read-ahead cache (`cache_type="none"`): each HDF5 read is one ranged request of exactly
the bytes HDF5 asked for, so what a rank fetches is what it reads, and nothing beyond the
chunks it decodes stays in memory. The endpoint and credentials of S3 come from the
standard AWS variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
read by botocore) or from `data.storage_options` (passed to the fsspec filesystem as they
are, e.g. `{endpoint_url: ..., key: ..., secret: ...}`). A URL whose protocol needs a
package that is not installed (s3fs for s3://, aiohttp for http://) is one error naming it.
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import stat

from mpitrain.base.errors import ConfigError, DataError, describe
from mpitrain.base.paths import leaves

REMOTE_EXTRA = "pip install 'mpitrain[remote]'"
REMOTE_EXTRA_PROTOCOLS = ("s3", "s3a", "http", "https")  # what the `remote` extra's packages (s3fs, aiohttp) serve


def is_url(location: str) -> bool:
    """Whether `location` names a remote store (`PROTOCOL://...`) rather than a local folder."""
    return "://" in location and not location.startswith("file://")


class Storage:
    """A dataset's root: a local folder, or a URL with its fsspec filesystem. Not a collective."""

    def __init__(self, location: str, options: dict | None = None):
        self.remote = is_url(location)
        if not self.remote:
            self.root, self.fs = os.path.abspath(location.removeprefix("file://")), None
            return
        import fsspec
        protocol = location.split("://", 1)[0]
        try:
            self.fs = fsspec.filesystem(protocol, **(options or {}))
        except ImportError as e:
            advice = f"install it with {REMOTE_EXTRA}" if protocol in REMOTE_EXTRA_PROTOCOLS else \
                "install the package fsspec names"
            raise ConfigError(f"{location}: {protocol}:// needs a package that is not installed ({e}); "
                              f"{advice}") from None
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{location}: {protocol}:// cannot be opened with data.storage_options {options} "
                              f"({e}); expected options of fsspec's {protocol} filesystem") from None
        self.root = location.rstrip("/")

    def path(self, relative: str) -> str:
        """The full path or URL of `relative` (a '/'-separated path inside the dataset)."""
        return posixpath.join(self.root, relative) if self.remote else os.path.join(self.root, relative)

    def local_path(self, relative: str) -> str | None:
        """The local file of `relative`, or None for a remote store; a DataError when a symlink takes it out of the
        dataset (mpitrain/base/paths.py)."""
        if self.remote:
            return None
        full = os.path.join(self.root, relative)
        if leaves(self.root, full):
            raise DataError(f"{full}: a symlink takes it to {os.path.realpath(full)}, outside the dataset {self.root}; "
                            "expected the dataset's files inside its folder")
        kind = _special_kind(full)
        if kind:  # reading a named pipe waits for a writer, on every rank, with no end
            raise DataError(f"{full}: is {kind}, not a file; expected the dataset's file written by mpitrain etl")
        return full

    def exists(self, relative: str) -> bool:
        if not self.remote:
            return os.path.exists(self.local_path(relative))
        return self._remote(relative, "checking it", lambda: self.fs.exists(self.path(relative)))

    def is_folder_or_absent(self) -> bool:
        """Whether the root is a folder or does not exist (a local file where a dataset folder belongs: False)."""
        return self.remote or not os.path.exists(self.root) or os.path.isdir(self.root)

    def read_bytes(self, relative: str) -> bytes:
        """The whole file `relative`; FileNotFoundError when it is absent, DataError when it cannot be read."""
        if not self.remote:
            with open(self.local_path(relative), "rb") as f:
                return f.read()
        return self._remote(relative, "reading it", lambda: self.fs.cat_file(self.path(relative)))

    def open(self, relative: str):
        """`relative` opened for random-access binary reading (h5py takes it); remote: no read-ahead."""
        if not self.remote:
            return open(self.local_path(relative), "rb")
        return self._remote(relative, "opening it",
                            lambda: self.fs.open(self.path(relative), "rb", cache_type="none"))

    def sha256(self, relative: str) -> str:
        """The sha256 of the whole file `relative`."""
        with self.open(relative) as f:
            return sha256_of(f)

    def _remote(self, relative: str, doing: str, call):
        try:
            return call()
        except FileNotFoundError:
            raise
        except OSError as e:
            raise DataError(f"{self.path(relative)}: {describe(e)} while {doing}; expected a readable object of "
                            "the dataset (are AWS_ENDPOINT_URL and the credentials right?)") from None
        except Exception as e:  # botocore's and aiohttp's own errors: no credentials, endpoint unreachable
            raise DataError(f"{self.path(relative)}: {type(e).__name__}: {e} while {doing}") from None


def sha256_of(f) -> str:
    """The sha256 of what is left to read in the binary file object `f`, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _special_kind(path: str) -> str | None:
    """What `path` is when it exists and is neither a regular file nor a folder (a named pipe, a device, a socket),
    in a few words; else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, kind in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def open_storage(location: str, options: dict | None = None) -> Storage:
    """The store at `location`: a folder path, or a URL read through fsspec with `options`."""
    return Storage(location, options)
