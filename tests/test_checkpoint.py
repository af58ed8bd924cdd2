"""Checkpoints: atomic write, newest-last listing, pruning, and size checks on load."""
import numpy as np
import pytest

from mpitrain.checkpoint import Checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from mpitrain.errors import DataError


def test_save_list_prune_load(tmp_path):
    for epoch, step in ((1, 0), (1, 50), (2, 0), (10, 0)):
        save_checkpoint(str(tmp_path), Checkpoint(np.full(4, epoch, np.float32), np.zeros(8, np.float32),
                                                  epoch, step, epoch * 100 + step), keep=3)
    (tmp_path / "checkpoints" / "ckpt-0099-000000.h5.tmp").write_bytes(b"half written")
    paths = list_checkpoints(str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["ckpt-0001-000050.h5", "ckpt-0002-000000.h5",
                                                     "ckpt-0010-000000.h5"]
    ckpt = load_checkpoint(paths[-1], 4, 8)
    assert (ckpt.epoch, ckpt.step, ckpt.iteration) == (10, 0, 1000)
    assert (ckpt.params == 10).all()
    with pytest.raises(DataError, match="holds 4 parameters and 8 updater values, expected 5 and 8"):
        load_checkpoint(paths[-1], 5, 8)
    with pytest.raises(DataError, match="not a readable mpitrain checkpoint"):
        load_checkpoint(str(tmp_path / "checkpoints" / "ckpt-0099-000000.h5.tmp"), 4)
