"""Checkpoints: atomic write, newest-last listing, pruning, per-layer datasets, and refusals saying what differs."""
import h5py
import numpy as np
import pytest

from mpitrain.base.errors import DataError
from mpitrain.rundir.checkpoint import Checkpoint, check_fits, list_checkpoints, load_checkpoint, save_checkpoint

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


def test_each_ranks_own_arrays_are_kept_checksummed_beside_the_merged_ones(tmp_path):
    ckpt = checkpoint(1, 7)
    ckpt.sync_arrays = {"residual": np.full(13, 0.5, np.float32)}
    ckpt.ranks = 3
    ckpt.rank_arrays = {"params": np.stack([np.arange(13, dtype=np.float32) + r for r in range(3)]),
                        "sync/residual": np.stack([np.full(13, r, np.float32) for r in range(3)])}
    path = save_checkpoint(str(tmp_path), ckpt, keep=1)
    with h5py.File(path) as f:  # any HDF5 tool reads rank R's own arrays as ranks/R/NAME
        assert f.attrs["ranks"] == 3 and f["ranks/2/params"].fletcher32 and f["ranks/1/sync/residual"].fletcher32
        np.testing.assert_array_equal(f["ranks/2/sync/residual"][...], np.full(13, 2))
        assert "ranks/0/updater_state" not in f  # the ranks did not differ there: the merged array is every rank's
    loaded = load_checkpoint(path)
    assert loaded.ranks == 3 and sorted(loaded.rank_arrays) == ["params", "sync/residual"]
    np.testing.assert_array_equal(loaded.rank_arrays["params"], ckpt.rank_arrays["params"])
    np.testing.assert_array_equal(loaded.merged_array("sync/residual"), np.full(13, 0.5))
    with h5py.File(path, "r+") as f:  # a rank's array of another size than the merged one: a damaged file
        del f["ranks/1/params"]
        f.create_dataset("ranks/1/params", data=np.zeros(12, np.float32))
    with pytest.raises(DataError, match=r"not a readable mpitrain checkpoint \(ranks/R/params holds \[13, 12, 13\] values for its 3 "
                                        r"ranks, params 13\)"):
        load_checkpoint(path)


def test_a_checkpoint_without_rank_arrays_reads_as_before(tmp_path):
    loaded = load_checkpoint(save_checkpoint(str(tmp_path), checkpoint(1, 0), keep=1))
    assert (loaded.ranks, loaded.rank_arrays) == (0, {})
