"""Bag columns through `mpitrain etl` (real Spark, local[2]): a Parquet list of strings and the same bags in a CSV
cell (`--bag-delimiter`) give the same stored ids row for row, through one vocabulary fitted on the train split
alone (most frequent first, `--min-count`), with empty and missing lists stored as empty bags; `--hash-buckets`
instead of a vocabulary; and the options a bag cannot take, refused in one line before Spark starts."""
from __future__ import annotations

from collections import Counter

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpitrain import cli
from mpitrain.data.encoding import hash_ids
from mpitrain.data.shards import read_manifest

TRAIN = [["m1", "m2", "m1"], [], None, ["m2", None], ["m4"], ["m1"], ["m2", "m4"], ["m1", "m2"]] * 5 + [["m3"]]
TEST = [["m1", "m9"], ["m4"], [], ["m2", "m2"]] * 3  # m9: never in the train split


def write(folder, name: str, bags: list, delimiter: str = "|") -> dict[str, str]:
    """The records (label, a number telling them apart, the bag) as Parquet and as CSV: {format: source}."""
    numbers = np.arange(len(bags), dtype=np.float64) + (0.5 if name == "test" else 0.0)
    labels = [i % 2 for i in range(len(bags))]
    pq.write_table(pa.table({"label": pa.array(labels, pa.int32()), "n": numbers,
                             "recent": pa.array(bags, pa.list_(pa.string()))}), str(folder / f"{name}.parquet"))
    cells = [delimiter.join(value or "" for value in bag or []) for bag in bags]
    (folder / f"{name}.csv").write_text("label,n,recent\n" + "".join(
        f"{label},{number},{cell}\n" for label, number, cell in zip(labels, numbers, cells)))
    return {"parquet": f"parquet:{folder / f'{name}.parquet'}", "csv": f"csv:{folder / f'{name}.csv'}"}


def stored(out) -> dict[float, list[int]]:
    """{a row's number: its bag's stored ids} over every split's shards."""
    manifest, found = read_manifest(str(out)), {}
    for split in manifest.splits:
        for shard in manifest.shards(split):
            with h5py.File(out / shard.path) as f:
                offsets, values = f["sequences/recent/offsets"][:], f["sequences/recent/values"][:, 0]
                for number, a, b in zip(f["x"][:, 0], offsets[:-1], offsets[1:]):
                    found[float(number)] = values[a:b].astype(int).tolist()
    return found


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bags")
    return folder, write(folder, "train", TRAIN), write(folder, "test", TEST)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_bag_column_is_stored_as_ids_of_one_vocabulary_of_the_train_split(etl, sources, tmp_path, capsys, fmt):
    folder, train, test = sources
    status, _, err = etl("--source", train[fmt], "--test", test[fmt].split(":", 1)[1], "--out", tmp_path / "ds",
                         "--shards", 2, "--bag", "recent", "--features", "n", "--min-count", 2)
    assert status == 0, err[-2000:]
    (column,) = read_manifest(str(tmp_path / "ds")).sequences
    counts = Counter(value for bag in TRAIN for value in bag or [] if value)
    vocabulary = sorted((value for value in counts if counts[value] >= 2), key=lambda v: (-counts[v], v))
    assert vocabulary == ["m1", "m2", "m4"]  # m3 seen once: out of vocabulary; m9 only in the test split
    assert {key: column[key] for key in ("bag", "vocabulary", "ids", "min_count", "shortest", "features")} == \
        {"bag": True, "vocabulary": vocabulary, "ids": 5, "min_count": 2, "shortest": 0, "features": 1}
    ids = {value: 2 + i for i, value in enumerate(vocabulary)} | {None: 0, "m3": 1, "m9": 1}
    expected = {number + offset: [ids[value] for value in bag or []]
                for bags, offset in ((TRAIN, 0.0), (TEST, 0.5)) for number, bag in enumerate(bags)}
    assert stored(tmp_path / "ds") == expected
    assert cli.main(["info", str(tmp_path / "ds")]) == 0
    assert "bag recent (5 ids: vocabulary of 3, min count 2): 0..3 values (at most 10000), 71 values stored" in \
        capsys.readouterr().out


def test_a_hashed_bag_column_stores_each_value_s_bucket(etl, sources, tmp_path):
    _, train, _ = sources
    status, _, err = etl("--source", train["parquet"], "--out", tmp_path / "ds", "--shards", 1, "--bag", "recent",
                         "--features", "n", "--hash-buckets", "recent:7", "--test-fraction", 0.25)
    assert status == 0, err[-2000:]
    (column,) = read_manifest(str(tmp_path / "ds")).sequences
    assert (column["hash_buckets"], column["ids"], "vocabulary" in column) == (7, 8, False)
    buckets = {value: int(i) for value, i in zip(["m1", "m2", "m3", "m4"],
                                                 hash_ids(pa.array(["m1", "m2", "m3", "m4"]), 7))} | {None: 0}
    assert stored(tmp_path / "ds") == {float(number): [buckets[value] for value in bag or []]
                                       for number, bag in enumerate(TRAIN)}


@pytest.mark.parametrize("options, message", [
    (("--bag", "recent", "--categorical", "n"), "--bag: a dataset of sequences or bags stores them and its numeric "
                                                "--features as float32, expected no --categorical"),
    (("--bag", "recent", "--scale"), "--scale and --binarize: a dataset of sequences stores"),
    (("--bag", "n"), "column 'n' is number; expected a list of strings or integers per record (a --bag column)"),
    (("--bag", "recent", "--hash-buckets", "other:3"), "'other' is not a --categorical or --bag column (recent)"),
    (("--bag", "recent", "--bag-delimiter", ","), "--bag-delimiter ',': expected one character other than"),
])
def test_what_a_bag_cannot_take_is_refused_before_spark_starts(etl, sources, tmp_path, options, message):
    _, train, _ = sources
    status, _, err = etl("--source", train["parquet"], "--out", tmp_path / "ds", "--shards", 1, *options)
    errors = [line for line in err.splitlines() if line.startswith("mpitrain etl: error: ")]
    assert status == 2 and len(errors) == 1 and message in errors[0], err[-3000:]
    assert not (tmp_path / "ds").exists()
