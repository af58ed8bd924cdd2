"""Ragged sequences: indexing and joining as the ETL's shuffle does, the reader's windows and padded batches (the
same rows on any rank count and after a resume), and a damaged sequence column named."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from mpitrain.data.reader import Batches, DatasetReader
from mpitrain.data.sequences import PAD_MULTIPLE, Ragged, RaggedBuffer, Inputs, SequenceRows
from mpitrain.base.errors import DataError
from mpitrain.base.workspace import Workspace
from mpitrain.parallel.backend import create_backend
from mpitrain.testing.sequences import make_mixed_dataset, make_sequence_dataset, motif_sequences, ragged


def test_ragged_rows_index_and_join_like_arrays_of_rows():
    sequences, _ = motif_sequences(20, seed=1, lengths=(4, 30))
    seqs = ragged(sequences)
    order = np.random.default_rng(0).permutation(20)[:13]
    taken = seqs[order]
    assert [s.tobytes() for s in _split(taken)] == [sequences[i].tobytes() for i in order]
    joined = Ragged.concat([seqs[order[:5]], seqs[order[5:]]])
    assert np.array_equal(joined.values, taken.values) and np.array_equal(joined.offsets, taken.offsets)
    rows = SequenceRows(np.arange(20, dtype=np.float32)[:, None], {"s": seqs})
    assert np.array_equal(rows[order].x[:, 0], order) and len(SequenceRows.concat([rows, rows])) == 40


def test_the_shuffle_key_content_tells_apart_order_length_and_values():
    a = np.array([[1.0], [2.0]], np.float32)
    variants = [a, a[::-1], np.array([[1.0], [2.0], [0.0]], np.float32), np.array([[1.0], [2.5]], np.float32)]
    content = ragged(variants).content()
    assert len({row.tobytes() for row in content}) == len(variants)
    assert np.array_equal(ragged([a, a]).content()[0], ragged([a]).content()[0])  # the same sequence, the same words


def _split(seqs: Ragged) -> list[np.ndarray]:
    return [seqs.values[a:b] for a, b in zip(seqs.offsets, seqs.offsets[1:])]


def test_a_batch_is_padded_to_its_longest_rounded_up_with_zeros():
    sequences = [np.full((n, 2), n, np.float32) for n in (3, 11, 5)]
    buffer = RaggedBuffer(3, 2, np.float32)
    offsets = np.concatenate([[0], np.cumsum([3, 11, 5])])
    buffer.space(0, offsets)[...] = np.concatenate(sequences)
    values, lengths = buffer.padded(np.array([2, 0]), Workspace(np).part("t"), "s", np.float32)
    assert values.shape == (2, PAD_MULTIPLE, 2) and list(lengths) == [5, 3]
    assert (values[0, :5] == 5).all() and (values[0, 5:] == 0).all() and (values[1, :3] == 3).all()
    values, _ = buffer.padded(np.array([1]), Workspace(np).part("t"), "s", np.float32)
    assert values.shape == (1, 2 * PAD_MULTIPLE, 2)


class _Rank:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def _steps(path, rank, size, epoch=0, start=0, buffer_mb=0.05):
    reader = DatasetReader(str(path), _Rank(rank, size))
    rows = reader.train_rows("train", 16, buffer_mb, seed=3, shuffle=True)
    batches = Batches(rows, reader.manifest, create_backend("numpy"), "float32", seed=3, rank=rank, prefetch=False)
    return [[(int(label), values[:length].tobytes()) for values, length, label in zip(x.values, x.lengths, y)]
            for x, y in batches.epoch(epoch, start)]


def test_training_batches_are_the_same_rows_on_any_rank_count_and_after_a_resume(tmp_path):
    make_sequence_dataset(tmp_path / "ds", n_train=160, n_test=20, shards=3, lengths=(4, 90))
    one = _steps(tmp_path / "ds", 0, 1, epoch=1)  # a small buffer: several windows per epoch
    two = [_steps(tmp_path / "ds", rank, 2, epoch=1) for rank in range(2)]
    assert len(one) == 10 and [sorted(a + b) for a, b in zip(*two)] == [sorted(step) for step in one]
    assert _steps(tmp_path / "ds", 1, 2, epoch=1, start=7) == two[1][7:]


def test_a_damaged_sequence_column_is_one_error_naming_the_shard_column_and_row(tmp_path):
    manifest = make_sequence_dataset(tmp_path / "ds", n_train=40, n_test=10, shards=1, lengths=(4, 20))
    shard = tmp_path / "ds" / manifest.shards("test")[0].path
    with h5py.File(shard, "r+") as f:
        offsets = f["sequences/readings/offsets"]
        offsets[3] = offsets[2]  # row 2 becomes empty
    reader = DatasetReader(str(tmp_path / "ds"), _Rank(0, 1), verify_checksums=False)
    with pytest.raises(DataError, match=r"shard-00000.h5: sequence column 'readings' has offsets out of order or "
                                        r"range at row 2"):
        list(reader.eval_rows("test").batches(8))


def test_several_inputs_come_as_the_fixed_features_and_each_column_padded_to_its_own_longest(tmp_path):
    manifest = make_mixed_dataset(tmp_path / "ds", n_train=40, n_test=30, shards=2, lengths=((4, 30), (4, 9)))
    stored = {"x": [], "readings": [], "events": []}
    for shard in manifest.shards("test"):
        with h5py.File(tmp_path / "ds" / shard.path) as f:
            stored["x"] += list(f["x"][...])
            for name in ("readings", "events"):
                offsets = f[f"sequences/{name}/offsets"][...]
                stored[name] += [f[f"sequences/{name}/values"][a:b] for a, b in zip(offsets, offsets[1:])]
    rows = 0
    for x, _ in DatasetReader(str(tmp_path / "ds"), _Rank(0, 1)).eval_rows("test").batches(7):
        assert isinstance(x, Inputs) and list(x.columns) == ["readings", "events"]
        np.testing.assert_array_equal(x.x, stored["x"][rows:rows + len(x)])
        for name, batch in x.columns.items():
            assert batch.values.shape[1] == -(-batch.lengths.max() // PAD_MULTIPLE) * PAD_MULTIPLE  # its own longest
            for r, length in enumerate(batch.lengths):
                np.testing.assert_array_equal(batch.values[r, :length], stored[name][rows + r])
                assert (batch.values[r, length:] == 0).all()
        rows += len(x)
    assert rows == 30
    reader = DatasetReader(str(tmp_path / "ds"), _Rank(0, 1))
    batches = Batches(reader.train_rows("train", 8, 1, seed=0, shuffle=True), reader.manifest,
                      create_backend("numpy"), "float32", seed=0, rank=0, prefetch=False)
    for x, y in batches.epoch(0):
        assert x.x.shape == (8, 2) and {name: b.values.shape[2] for name, b in x.columns.items()} == \
            {"readings": 2, "events": 1} and y.shape == (8,)
