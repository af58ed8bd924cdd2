"""A dataset written to an object store (`--out s3://bucket/prefix`, any writable fsspec URL).

Object stores have no folders to rename, so the ETL writes in three steps:

1. Each Spark task writes its shard into a local temporary folder, as for a local `--out`,
   uploads it to a staging prefix `PREFIX.etl-tmp-XXXXXXXX/` beside the dataset and
   deletes the local file (`write_shard_to`); file vocabularies go there too (`etl/vocabulary_files.py`). The task that wrote a shard uploads it, so the
   executors need no file system shared with the driver, but they need the store's
   endpoint and credentials (the standard `AWS_*` variables; Spark's executors inherit the
   driver's environment in local and local-cluster mode, elsewhere set
   `spark.executorEnv.*`).
2. The driver commits (`RemoteDataset.commit`): with `--overwrite` it deletes the old
   `manifest.json` first and then every other old object under the prefix, copies the
   staged shards into the prefix (a server-side copy: no shard passes through the driver),
   and uploads `manifest.json` last.
3. The staging prefix is deleted, on success and on failure.

What a reader sees: while Spark runs, the old dataset untouched (a failed job leaves it as
it was); during the commit (seconds: deletes and server-side copies) no `manifest.json`,
so a reader that starts then fails with "no manifest.json" instead of mixing old and new
shards; afterwards the new dataset. A reader already holding the old manifest finds its
shards gone or changed: its sha256 and chunk checks fail, as when a local dataset is
replaced under a running job. A commit that fails half-way leaves the prefix without a
manifest, which the next run refuses even with `--overwrite`; the error says to delete it.
A job that is killed leaves its staging prefix behind (object stores have no lock that dies
with a process): delete `PREFIX.etl-tmp-*` by hand or with a lifecycle rule.
"""
from __future__ import annotations

import logging
import os
import posixpath
import tempfile
import uuid

from mpitrain.base.errors import DataError
from mpitrain.data.shards import MANIFEST_NAME, Manifest, ShardInfo, manifest_bytes, write_shard
from mpitrain.data.storage import is_url, open_storage
from mpitrain.data.vocabulary_files import file_paths

log = logging.getLogger(__name__)


def _store_error(url: str, doing: str, e: Exception) -> DataError:
    """A store's error (botocore's, aiohttp's, an OSError) as one line naming the URL."""
    return DataError(f"{url}: {type(e).__name__}: {e} while {doing} (are AWS_ENDPOINT_URL and the credentials "
                     "right, and does the bucket exist?)")


def check_remote_out(url: str, overwrite: bool) -> str:
    """Refuse an existing dataset at `url` without `overwrite`, and with it a non-empty prefix that holds no
    manifest.json; check that the bucket exists. Return the URL without a trailing slash."""
    store = open_storage(url)
    root, fs = store.root, store.fs
    bucket, _, prefix = fs._strip_protocol(root).partition("/")
    if not prefix:
        raise DataError(f"{url}: a bucket's root; expected a prefix inside it, e.g. {url.rstrip('/')}/dataset")
    try:
        fs.invalidate_cache()
        if not fs.exists(bucket):
            raise DataError(f"{url}: bucket {bucket!r} does not exist; create it first")
        has_manifest = fs.exists(store.path(MANIFEST_NAME))
        entries = has_manifest or fs.find(root)  # objects only: some stores list empty "folders" too
    except DataError:
        raise
    except Exception as e:
        raise _store_error(root, "checking the output", e) from None
    if not entries:
        return root
    if not overwrite:
        raise DataError(f"{root}: exists; pass --overwrite to replace it")
    if not has_manifest:
        raise DataError(f"{root}: exists and is not a dataset (no {MANIFEST_NAME}); refusing to replace it, "
                        "even with --overwrite (delete it yourself if it is a failed job's leftovers)")
    return root


def write_shard_to(target: str, relative_path: str, *args, **kwargs) -> ShardInfo:
    """`write_shard` into `target`, a local folder or a staging URL; a URL's shard is written into a local
    temporary folder, uploaded by this process (the Spark task that wrote it) and deleted locally."""
    if not is_url(target):
        return write_shard(target, relative_path, *args, **kwargs)
    url = posixpath.join(target, relative_path)
    with tempfile.TemporaryDirectory(prefix="mpitrain-shard-") as local:
        info = write_shard(local, relative_path, *args, **kwargs)
        try:
            open_storage(url).fs.put_file(os.path.join(local, relative_path), url)
        except Exception as e:
            raise _store_error(url, "uploading a shard", e) from None
    return info


class RemoteDataset:
    """The staging prefix of one ETL run into `url`, and its commit."""

    def __init__(self, url: str, overwrite: bool):
        self.url, self.overwrite = url, overwrite
        self.staging = f"{url}.etl-tmp-{uuid.uuid4().hex[:8]}"
        self.fs = open_storage(url).fs

    def commit(self, manifest: Manifest) -> None:
        """Replace what is at the prefix by the staged shards and `manifest` (uploaded last)."""
        check_remote_out(self.url, self.overwrite)  # again: something may have appeared there while the job ran
        fs, manifest_url = self.fs, posixpath.join(self.url, MANIFEST_NAME)
        try:
            if fs.exists(manifest_url):
                fs.rm_file(manifest_url)  # first: from now on no reader starts on the old dataset
                fs.rm(self.url, recursive=True)
            files = [shard.path for shards in manifest.splits.values() for shard in shards]
            for path in files + file_paths(manifest.columns.get("categorical", []) + manifest.sequences):
                fs.copy(posixpath.join(self.staging, path), posixpath.join(self.url, path))
            fs.pipe_file(manifest_url, manifest_bytes(manifest))
        except Exception as e:
            raise _store_error(self.url, "committing the dataset", e) from None

    def remove_staging(self) -> None:
        """Delete the staging prefix (nothing there is anything's only copy); a failure is only logged, so it
        cannot hide the job's own error."""
        self.fs.invalidate_cache()  # the executors wrote there behind this filesystem's listing cache
        try:
            self.fs.rm(self.staging, recursive=True)
        except FileNotFoundError:
            pass
        except Exception as e:
            log.warning("%s: could not delete the staging prefix (%s: %s); delete it by hand",
                        self.staging, type(e).__name__, e)
