"""Sequence columns through `mpitrain etl` (real Spark, local[2]): a Parquet list column per record stored ragged
(values and offsets, never padded), read back row for row; and the errors a sequence can have, each one line naming
the record and the column, exit 2, nothing written."""
from __future__ import annotations

from collections import Counter

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpitrain import cli
from mpitrain.data.reader import DatasetReader
from mpitrain.data.shards import read_manifest
from mpitrain.testing.datasets import siblings
from mpitrain.testing.sequences import motif_sequences, tagged_sequences, token_sequences, write_parquet


class _Rank:
    rank, size = 0, 1


def read_back(out) -> Counter:
    """Every (split, label, sequence bytes) of a written dataset, read by the reader as evaluation reads rows."""
    reader, found = DatasetReader(str(out), _Rank()), Counter()
    for split in reader.manifest.splits:
        for x, y in reader.eval_rows(split).batches(64):
            for values, length, label in zip(x.values, x.lengths, y):
                found[int(label), values[:length].tobytes()] += 1
    return found


@pytest.mark.parametrize("features", [1, 3])
def test_sequences_are_stored_ragged_and_read_back_row_for_row(etl, tmp_path, capsys, features):
    sequences, labels = motif_sequences(300, seed=features, features=features, lengths=(4, 60))
    write_parquet(tmp_path / "seq.parquet", sequences, labels)
    status, out, err = etl("--source", f"parquet:{tmp_path / 'seq.parquet'}", "--out", tmp_path / "ds",
                           "--shards", 2, "--sequence", "readings")
    assert status == 0, err[-2000:]
    manifest = read_manifest(str(tmp_path / "ds"))
    (column,) = manifest.sequences
    assert column["name"] == "readings" and column["features"] == features
    assert column["longest"] == max(map(len, sequences)) and manifest.input_shape == (None, features)
    stored_steps = 0
    for split in manifest.splits:
        for shard in manifest.shards(split):
            with h5py.File(tmp_path / "ds" / shard.path) as f:
                values, offsets = f["sequences/readings/values"], f["sequences/readings/offsets"][:]
                assert values.shape == (offsets[-1], features) and offsets[0] == 0 and (np.diff(offsets) >= 1).all()
                stored_steps += values.shape[0]
    assert stored_steps == sum(map(len, sequences)) == sum(column["steps"].values())  # no padding on disk
    assert read_back(tmp_path / "ds") == Counter((int(label), s.tobytes()) for s, label in zip(sequences, labels))
    assert cli.main(["info", str(tmp_path / "ds")]) == 0
    assert f"sequence readings: {features} feature(s) per step, {column['shortest']}..{column['longest']} steps " \
           f"(at most 10000), {stored_steps} steps stored" in capsys.readouterr().out


def _records(path, readings: list, labels=None) -> str:
    pq.write_table(pa.table({"label": pa.array(labels or [i % 2 for i in range(len(readings))], pa.int32()),
                             "readings": readings}), str(path))
    return f"parquet:{path}"


@pytest.mark.parametrize("readings, options, message", [
    ([[1.0, 2.0]] * 9 + [[1.0, None]], (), "column 'readings' holds a missing or non-finite number"),
    ([[1.0, 2.0]] * 9 + [[]], (), "column 'readings' holds an empty sequence"),
    ([[1.0, 2.0]] * 9 + [[0.5] * 7], ("--max-length", 6), "column 'readings' holds a sequence of 7 steps, more than "
                                                          "--max-length 6"),
    ([[[1.0, 2.0]]] * 9 + [[[1.0, 2.0], [3.0]]], (), "column 'readings' holds a step that is not a list of 2"),
    ([["a", "b"]] * 10, (), "column 'readings' holds string values in its sequences; expected numbers"),
])
def test_a_wrong_sequence_stops_the_job_naming_the_record_and_column(etl, tmp_path, readings, options, message):
    source = _records(tmp_path / "bad.parquet", readings)
    status, _, err = etl("--source", source, "--out", tmp_path / "ds", "--shards", 1, "--sequence", "readings",
                         *options)
    errors = [line for line in err.splitlines() if line.startswith("mpitrain etl: error: ")]
    assert status == 2 and len(errors) == 1, err[-3000:]
    assert message in errors[0] and ("record" in errors[0] or "expected numbers" in errors[0]), errors[0]
    assert not (tmp_path / "ds").exists() and not siblings(tmp_path / "ds")


@pytest.mark.parametrize("source, options, message", [
    ("csv", (), "--sequence: sequence columns are read from a parquet: source"),
    ("parquet", ("--scale",), "a dataset of sequences stores its values as they are, or standardized per channel"),
    ("parquet", ("--max-length", 0), "--max-length 0"),
    ("parquet", ("--sequence", "label"), "'label' is also a label"),
])
def test_sequence_options_are_checked_before_spark_starts(etl, tmp_path, source, options, message):
    path = _records(tmp_path / "ok.parquet", [[1.0, 2.0]] * 10)
    if source == "csv":
        (tmp_path / "t.csv").write_text("label,x\n1,2\n0,3\n")
        path = f"csv:{tmp_path / 't.csv'}"
    sequence = () if "--sequence" in options else ("--sequence", "readings")
    status, _, err = etl("--source", path, "--out", tmp_path / "ds", "--shards", 1, *sequence, *options)
    errors = [line for line in err.splitlines() if line.startswith("mpitrain etl: error: ")]
    assert status == 2 and len(errors) == 1 and message in errors[0], err[-3000:]


def test_a_label_column_of_lists_is_a_class_per_step(etl, tmp_path):
    sequences, tags = tagged_sequences(200, seed=3, lengths=(3, 40))
    write_parquet(tmp_path / "tags.parquet", sequences, tags)
    status, _, err = etl("--source", f"parquet:{tmp_path / 'tags.parquet'}", "--out", tmp_path / "ds", "--shards", 2,
                         "--sequence", "readings")
    assert status == 0, err[-2000:]
    manifest = read_manifest(str(tmp_path / "ds"))
    assert manifest.step_target == "label" and manifest.target == "class" and manifest.num_classes == 2
    reader, found = DatasetReader(str(tmp_path / "ds"), _Rank()), Counter()
    for split in manifest.splits:
        for x, y in reader.eval_rows(split).batches(32):
            for values, length, classes in zip(x.values, x.lengths, y):
                assert (classes[length:] == -1).all()
                found[values[:length].tobytes(), classes[:length].tobytes()] += 1
    assert found == Counter((s.tobytes(), t.tobytes()) for s, t in zip(sequences, tags))


def test_a_class_per_step_must_have_a_class_at_every_step(etl, tmp_path):
    readings = [[1.0, 2.0, 3.0]] * 10
    labels = [[0, 1, 1]] * 9 + [[0, 1]]
    path = tmp_path / "tags.parquet"
    pq.write_table(pa.table({"label": labels, "readings": readings}), str(path))
    status, _, err = etl("--source", f"parquet:{path}", "--out", tmp_path / "ds", "--shards", 1, "--sequence",
                         "readings")
    errors = [line for line in err.splitlines() if line.startswith("mpitrain etl: error: ")]
    assert status == 2 and len(errors) == 1, err[-3000:]
    assert "label column 'label' holds 2 classes, expected one per step of 'readings' (3 steps)" in errors[0]


def test_a_column_of_token_ids_records_its_ids_and_lengths(etl, tmp_path):
    sequences, labels = token_sequences(150, seed=4, ids=40, lengths=(5, 30))
    sequences[7] = sequences[7].astype(np.int64)
    sequences[7][2] = 2**24 + 1  # past float32's integers: an integer column keeps it (int32 end to end)
    write_parquet(tmp_path / "tokens.parquet", sequences, labels, column="tokens", integer=True)
    status, _, err = etl("--source", f"parquet:{tmp_path / 'tokens.parquet'}", "--out", tmp_path / "ds", "--shards", 2,
                         "--sequence", "tokens")
    assert status == 0, err[-2000:]
    manifest = read_manifest(str(tmp_path / "ds"))
    (column,) = manifest.sequences
    assert column["ids"] == 2**24 + 2 and column["integer"] is True and manifest.id_dtype == "int32"
    assert (column["shortest"], column["longest"]) == (min(map(len, sequences)), max(map(len, sequences)))
    stored = []
    for split in manifest.splits:
        for shard in manifest.shards(split):
            with h5py.File(tmp_path / "ds" / shard.path) as f:
                assert f["sequences/tokens/values"].dtype == np.int32
                stored.append(f["sequences/tokens/values"][:, 0])
    assert sorted(np.concatenate(stored).tolist()) == sorted(int(v) for s in sequences for v in s[:, 0])


def test_standardize_takes_each_channel_of_a_sequence_column_to_the_train_split_s_mean_0_and_std_1(etl, tmp_path):
    """Channels of unlike scales (about 1, 100 and 0.01 around offsets), beside a column of token ids: --standardize
    stores the readings standardized per channel by the train split's steps (recorded in the manifest, the test split
    by the train split's figures) and the token ids as they are; lengths and padding are untouched."""
    readings, labels = motif_sequences(240, seed=5, features=3, lengths=(4, 40))
    readings = [(r * [1.0, 100.0, 0.01] + [0.0, 500.0, -3.0]).astype(np.float32) for r in readings]
    tokens, _ = token_sequences(240, seed=6, ids=30, lengths=(3, 20))
    pq.write_table(pa.table({"label": pa.array(labels, pa.int32()), "readings": [r.tolist() for r in readings],
                             "tokens": [t[:, 0].astype(np.int64).tolist() for t in tokens]}), str(tmp_path / "s.parquet"))
    status, _, err = etl("--source", f"parquet:{tmp_path / 's.parquet'}", "--out", tmp_path / "ds", "--shards", 2,
                         "--sequence", "readings,tokens", "--standardize")
    assert status == 0, err[-2000:]
    manifest = read_manifest(str(tmp_path / "ds"))
    columns = {column["name"]: column for column in manifest.sequences}
    assert "mean" not in columns["tokens"] and columns["tokens"]["ids"] == 30  # ids stay ids
    mean, std = np.array(columns["readings"]["mean"]), np.array(columns["readings"]["std"])
    stored = {}
    for split in manifest.splits:
        for shard in manifest.shards(split):
            with h5py.File(tmp_path / "ds" / shard.path) as f:
                stored.setdefault(split, []).append((f["sequences/readings/values"][:],
                                                     f["sequences/tokens/values"][:]))
    train = np.concatenate([values for values, _ in stored["train"]])
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-5)  # every train step, each channel
    np.testing.assert_allclose(train.std(axis=0), 1.0, rtol=1e-5)
    raw = np.concatenate(readings).astype(np.float64)
    everything = np.concatenate([values for parts in stored.values() for values, _ in parts]) * std + mean
    np.testing.assert_allclose(np.sort(everything, axis=0), np.sort(raw, axis=0), rtol=1e-5, atol=1e-4)
    assert 50 < std[1] / std[0] < 200 and std[2] < 0.1  # the channels' own scales, recorded
    ids = np.concatenate([t for parts in stored.values() for _, t in parts])
    assert sorted(ids[:, 0].tolist()) == sorted(np.concatenate(tokens)[:, 0].tolist())
