"""The shard format: codecs, per-chunk Fletcher-32 checksums and the manifest keys that record them."""
from __future__ import annotations

import json

import h5py
import hdf5plugin
import numpy as np
import pytest
from h5py import h5z

from mpitrain.data.shards import (CHUNK_ROWS, COMPRESSIONS, MANIFEST_NAME, read_manifest, shard_path,
                                  write_manifest, write_shard)
from mpitrain.base.errors import DataError
from mpitrain.testing.datasets import make_dataset


def _filters(data: h5py.Dataset) -> list[int]:
    """The HDF5 filter ids of a dataset, in pipeline order."""
    plist = data.id.get_create_plist()
    return [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]


def _rows(n=2500, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.integers(0, 4, size=(n, 1, 8, 8)) * 60).astype(np.uint8)  # compressible, not constant
    return x, rng.integers(0, 10, size=n).astype(np.int32)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_each_codec_reads_back_equal_with_checksummed_chunks(tmp_path, compression):
    x, y = _rows()
    codec = {"none": [], "gzip": [h5z.FILTER_SHUFFLE, h5z.FILTER_DEFLATE],
             "lz4": [h5z.FILTER_SHUFFLE, hdf5plugin.LZ4_ID], "zstd": [h5z.FILTER_SHUFFLE, hdf5plugin.ZSTD_ID]}
    pipeline = codec[compression] + [h5z.FILTER_FLETCHER32]  # the checksum covers the stored (compressed) bytes
    onehot = np.eye(10, dtype=np.uint8)[y]
    info = write_shard(str(tmp_path), shard_path("train", 0), x, y, {"y_onehot": onehot}, compression=compression)
    with h5py.File(tmp_path / info.path, "r") as f:
        for name, expected in (("x", x), ("y", y), ("y_onehot", onehot)):
            data = f[name]
            assert _filters(data) == pipeline and data.chunks[0] == CHUNK_ROWS
            np.testing.assert_array_equal(data[:], expected)
    plain = write_shard(str(tmp_path), "plain.h5", x, y)
    assert compression == "none" or (tmp_path / info.path).stat().st_size < (tmp_path / plain.path).stat().st_size


def test_a_flipped_byte_inside_a_chunk_fails_the_read(tmp_path):
    x, y = _rows()
    info = write_shard(str(tmp_path), "s.h5", x, y)
    with h5py.File(tmp_path / info.path, "r") as f:
        chunk = f["x"].id.get_chunk_info(1)  # rows 1024..2047
    with open(tmp_path / info.path, "r+b") as f:
        f.seek(chunk.byte_offset + chunk.size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    with h5py.File(tmp_path / info.path, "r") as f:
        np.testing.assert_array_equal(f["x"][:CHUNK_ROWS], x[:CHUNK_ROWS])  # the other chunks still read
        with pytest.raises(OSError):
            f["x"][CHUNK_ROWS:2 * CHUNK_ROWS]


def test_manifest_records_codec_chunks_and_checksums(tmp_path):
    manifest = make_dataset(tmp_path)
    manifest.compression, manifest.chunk_rows, manifest.checksums = "zstd", 512, "fletcher32"
    write_manifest(str(tmp_path), manifest)
    assert read_manifest(str(tmp_path)) == manifest


def test_old_manifests_read_with_the_defaults(tmp_path):
    make_dataset(tmp_path)
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    for key in ("compression", "chunk_rows", "checksums"):
        del data[key]
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    manifest = read_manifest(str(tmp_path))
    assert (manifest.compression, manifest.chunk_rows, manifest.checksums) == ("none", CHUNK_ROWS, "")


@pytest.mark.parametrize("key, value, expected", [
    ("compression", "brotli", "compression 'brotli', expected one of"),
    ("chunk_rows", 0, "chunk_rows 0, expected an integer >= 1"),
    ("checksums", "md5", "checksums 'md5', expected one of"),
])
def test_bad_format_keys_name_the_file(tmp_path, key, value, expected):
    make_dataset(tmp_path)
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    data[key] = value
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(DataError, match=f"{tmp_path / MANIFEST_NAME}: {expected}"):
        read_manifest(str(tmp_path))


@pytest.mark.parametrize("rows", [-5, 10**15, 2.5, "160"])
def test_a_shards_rows_out_of_their_domain_are_refused_before_anything_is_read(tmp_path, rows):
    """A hand-edited count: -5 once dropped the shard and trained on the rest (exit 0); 10**15 hung planning an
    epoch of 10**12 chunks."""
    make_dataset(tmp_path)
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    data["splits"]["train"]["shards"][1]["rows"] = rows
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"splits.train.shards\[1\].rows is .*, expected an integer 0\.\.2147483648 "
                                        r"\(the rows of train/shard-00001.h5\)"):
        read_manifest(str(tmp_path))
