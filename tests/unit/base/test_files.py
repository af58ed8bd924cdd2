"""The one atomic file writer (mpitrain/base/files.py): a file is whole or as it was, and a failure is one line
naming the path."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from mpitrain.base.errors import MpitrainError
from mpitrain.base.files import os_errors, refuse_existing, write_file, write_hdf5


def test_a_file_is_written_whole_and_its_folder_made(tmp_path):
    path = tmp_path / "new" / "summary.json"
    write_file(str(path), lambda f: f.write('{"ok": 1}'))
    assert path.read_text() == '{"ok": 1}'
    assert not (tmp_path / "new" / "summary.json.tmp").exists()
    write_file(str(path), lambda f: f.write(b"\x00\x01"), binary=True)
    assert path.read_bytes() == b"\x00\x01"


def test_a_write_that_fails_leaves_the_old_file_and_no_partial_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("old\n")

    def half_then_fail(f):
        f.write("new")
        raise OSError(28, "No space left on device")

    with pytest.raises(MpitrainError, match=r"metrics\.jsonl: No space left on device while writing it "
                                            r"\(it needs about 1\.0 MB, .* free\); the partial file is removed"):
        write_file(str(path), half_then_fail, size=2**20)
    assert path.read_text() == "old\n"
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_an_hdf5_file_is_built_in_memory_then_written_whole(tmp_path):
    path = tmp_path / "shards" / "shard-00000.h5"
    image = write_hdf5(str(path), lambda h5: h5.create_dataset("x", data=np.arange(6.0).reshape(3, 2)))
    assert path.read_bytes() == image and not (tmp_path / "shards" / "shard-00000.h5.tmp").exists()
    with h5py.File(path, "r") as h5:
        assert h5["x"][...].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


def test_a_folder_where_the_file_goes_is_named(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(MpitrainError, match="out: is a folder; expected a file path to write"):
        write_file(str(tmp_path / "out"), lambda f: f.write("x"))


def test_os_errors_name_the_path_and_what_was_done(tmp_path):
    with pytest.raises(MpitrainError, match=r"missing\.h5: No such file or directory while reading it$"):
        with os_errors(str(tmp_path / "missing.h5"), "reading it"):
            open(tmp_path / "missing.h5")


def test_an_existing_path_is_refused_unless_overwrite(tmp_path):
    path = tmp_path / "model.onnx"
    refuse_existing(str(path), overwrite=False)  # nothing there yet
    path.write_text("x")
    with pytest.raises(MpitrainError, match="model.onnx: exists; pass --overwrite to replace it"):
        refuse_existing(str(path), overwrite=False)
    refuse_existing(str(path), overwrite=True)
