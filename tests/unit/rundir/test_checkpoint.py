"""Checkpoints: atomic write, newest-last listing, pruning, per-layer datasets, and refusals saying what differs."""
import h5py
import numpy as np
import pytest

from mpitrain.rundir.checkpoint import Checkpoint, check_fits, list_checkpoints, load_checkpoint, save_checkpoint
from mpitrain.errors import DataError

LAYOUT = [("00_dense/W", (2, 3)), ("00_dense/b", (3,)), ("02_dense/W", (3, 1)), ("02_dense/b", (1,))]


def checkpoint(epoch, step, value=1.0):
    return Checkpoint(np.arange(13, dtype=np.float32) * value, np.zeros(26, np.float32), epoch, step,
                      epoch * 100 + step, LAYOUT, {"tau": 0.25}, "ab" * 32, "train: {epochs: 3}\n")


def test_save_list_prune_load(tmp_path):
    for epoch, step in ((1, 0), (1, 50), (2, 0), (10, 0)):
        save_checkpoint(str(tmp_path), checkpoint(epoch, step), keep=3)
    (tmp_path / "checkpoints" / "ckpt-0099-000000.h5.tmp").write_bytes(b"half written")
    paths = list_checkpoints(str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["ckpt-0001-000050.h5", "ckpt-0002-000000.h5",
                                                     "ckpt-0010-000000.h5"]
    ckpt = load_checkpoint(paths[-1])
    assert (ckpt.epoch, ckpt.step, ckpt.iteration) == (10, 0, 1000)
    assert ckpt.layout == LAYOUT and ckpt.sync_numbers == {"tau": 0.25} and ckpt.config_yaml.startswith("train")
    np.testing.assert_array_equal(ckpt.params, np.arange(13))
    with h5py.File(paths[-1]) as f:  # named per-layer datasets, readable by any HDF5 tool
        np.testing.assert_array_equal(f["layers/00_dense/b"][...], [6, 7, 8])
        np.testing.assert_array_equal(f["layers/02_dense/W"][...], [[9], [10], [11]])
    with pytest.raises(DataError, match="not a readable mpitrain checkpoint"):
        load_checkpoint(str(tmp_path / "checkpoints" / "ckpt-0099-000000.h5.tmp"))


def test_check_fits_says_what_differs(tmp_path):
    ckpt = load_checkpoint(save_checkpoint(str(tmp_path), checkpoint(1, 0), keep=1))
    check_fits(ckpt, LAYOUT, 26, "ab" * 32)
    wider = [("00_dense/W", (2, 4))] + LAYOUT[1:]
    with pytest.raises(DataError, match=r"holds 00_dense/W of shape \[2, 3\] where this config's model has "
                                        r"00_dense/W of shape \[2, 4\]"):
        check_fits(ckpt, wider, 26)
    with pytest.raises(DataError, match="holds 4 parameter arrays, this config's model has 5"):
        check_fits(ckpt, LAYOUT + [("04_dense/W", (1, 1))])
    with pytest.raises(DataError, match="holds 26 updater values, this config's optimizer needs 13"):
        check_fits(ckpt, LAYOUT, 13)
    with pytest.raises(DataError, match=r"manifest.json has sha256 abababab.*but data/other has cdcdcd"):
        check_fits(ckpt, LAYOUT, 26, "cd" * 32, "data/other")
