"""Paths a file names stay inside its folder (mpitrain/base/paths.py): a manifest listing a shard outside the dataset
(`../outside/x.h5`, `/etc/passwd`, a path with `..` inside it) is refused at load naming the manifest, the key and
the path, before any shard is read, so `mpitrain info` prints no checksum of it; a shard that is a symlink out of the
dataset is refused when it is opened; a symlink inside the dataset, and a dataset folder reached by a symlink, read."""
import json
import os
import shutil

import pytest

from mpitrain import cli
from mpitrain.base.errors import DataError
from mpitrain.base.paths import confined, leaves
from mpitrain.data.reader import DatasetReader
from mpitrain.data.shards import MANIFEST_NAME, read_manifest
from mpitrain.testing.datasets import make_dataset, read_split


class _Rank:
    rank, size = 0, 1


@pytest.mark.parametrize("path", ["../outside/x.h5", "/etc/passwd", "train/../../x.h5", "train/./s.h5", "train//s.h5",
                                  "..", ".", "", "train\\s.h5", 7])
def test_a_path_outside_its_folder_or_not_normalized_is_refused(path):
    with pytest.raises(DataError, match=r"^m.json: splits.train.shards\[0\].path .* is not a path inside its folder"):
        confined(path, "m.json", "splits.train.shards[0].path")


def test_a_relative_normalized_path_is_kept():
    assert confined("train/shard-00000.h5", "m.json", "key") == "train/shard-00000.h5"
    assert confined("a..b/c", "m.json", "key") == "a..b/c"  # dots inside a name are a name


@pytest.mark.parametrize("path", ["../outside/x.h5", "/etc/passwd"])
def test_a_manifest_naming_a_file_outside_the_dataset_is_refused_before_it_is_read(tmp_path, capsys, path):
    make_dataset(tmp_path / "data", n_train=30, n_test=12, shards=1)
    (tmp_path / "outside").mkdir()
    shutil.copy(tmp_path / "data" / "train" / "shard-00000.h5", tmp_path / "outside" / "x.h5")
    data = json.loads((tmp_path / "data" / MANIFEST_NAME).read_text())
    data["splits"]["train"]["shards"][0]["path"] = path
    (tmp_path / "data" / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(DataError, match=rf"manifest.json: splits.train.shards\[0\].path '{path}' is not a path "
                                        "inside its folder"):
        read_manifest(str(tmp_path / "data"))
    assert cli.main(["info", str(tmp_path / "data")]) == 2
    printed = capsys.readouterr()
    assert "is not a path inside its folder" in printed.err and "sha256" not in printed.out + printed.err


def test_a_shard_that_is_a_symlink_out_of_the_dataset_is_refused_and_one_inside_it_reads(tmp_path):
    make_dataset(tmp_path / "data", n_train=30, n_test=12, shards=1)
    shard = tmp_path / "data" / "train" / "shard-00000.h5"
    (tmp_path / "outside").mkdir()
    shutil.move(shard, tmp_path / "outside" / "x.h5")
    os.symlink(tmp_path / "outside" / "x.h5", shard)
    assert leaves(str(tmp_path / "data"), str(shard))
    with pytest.raises(DataError, match=r"shard-00000.h5: a symlink takes it to .*outside/x.h5, outside the dataset"):
        read_split(tmp_path / "data", "train")
    os.unlink(shard)
    shutil.move(tmp_path / "outside" / "x.h5", tmp_path / "data" / "train" / "moved.h5")
    os.symlink("moved.h5", shard)  # a symlink inside the dataset
    os.symlink(tmp_path / "data", tmp_path / "linked")  # the dataset itself reached by a symlink
    for folder in ("data", "linked"):
        assert not leaves(str(tmp_path / folder), str(tmp_path / folder / "train" / "shard-00000.h5"))
        x, _ = read_split(tmp_path / folder, "train")
        assert len(x) == 30
    assert DatasetReader(str(tmp_path / "linked"), _Rank()).manifest.rows("train") == 30
