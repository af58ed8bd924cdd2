"""File vocabularies (`mpitrain.data.vocabulary_files`, written by `mpitrain.etl.vocabulary_files`) and a rank's share
of raw Parquet records (`mpitrain.data.record_share`): ids by part, each part read only when a value hashes to it,
and one line naming the file or column for what is wrong."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpitrain.base.errors import DataError
from mpitrain.data.encoding import HASH, TableEncoder
from mpitrain.data.record_share import RecordShare
from mpitrain.data.vocabulary_files import FileVocabulary, file_paths, parts_of
from mpitrain.etl.vocabulary_files import vocabulary_folder, write_part

VALUES = [f"user-{k}" for k in range(1000)] + ["ünïcode", ""]


def write_vocabulary(root, parts: int) -> tuple[dict, dict]:
    """VALUES as a file vocabulary of `parts` parts under `root`, as the ETL lays it out: (its entry, {value: id})."""
    part = parts_of(pa.array(VALUES), parts)
    first, ids = 2, {}
    for p in range(parts):
        mine = sorted(v for v, q in zip(VALUES, part) if q == p)
        assert write_part(str(root), vocabulary_folder("user/id"), p, pa.array(mine, pa.string()),
                          np.arange(len(mine)) + 1, first) == len(mine)
        ids.update(zip(mine, range(first, first + len(mine))))
        first += len(mine)
    entry = {"name": "user/id", "ids": first, "vocabulary_path": vocabulary_folder("user/id"), "vocabulary_parts": parts,
             "hash": HASH, "min_count": 1}
    return entry, ids


def test_every_value_has_its_own_id_and_unseen_and_missing_ones_get_1_and_0(tmp_path):
    entry, ids = write_vocabulary(tmp_path, parts=5)
    assert entry["vocabulary_path"] == "vocabularies/user%2Fid" and entry["ids"] == len(VALUES) + 2
    assert sorted(ids.values()) == list(range(2, len(VALUES) + 2))
    looked_up = FileVocabulary(entry, str(tmp_path))(pa.array(VALUES[::-1] + ["nobody", None]))
    assert looked_up.tolist() == [ids[v] for v in VALUES[::-1]] + [1, 0]
    counts = pq.read_table(tmp_path / file_paths([entry])[0]).column("count").to_numpy()
    assert counts.tolist() == list(range(1, len(counts) + 1))  # each value's train count, beside it


def test_a_lookup_reads_only_the_parts_its_values_hash_to_and_a_table_encodes_through_it(tmp_path):
    entry, ids = write_vocabulary(tmp_path, parts=8)
    lookup = FileVocabulary(entry, str(tmp_path))
    part = parts_of(pa.array(VALUES), 8)
    some = [v for v, p in zip(VALUES, part) if p in (2, 5)]
    assert lookup(pa.array(some)).tolist() == [ids[v] for v in some]
    assert sorted(lookup.parts) == [2, 5]
    encoder = TableEncoder({"numeric": [{"name": "age"}], "categorical": [entry]}, str(tmp_path))
    encoded = encoder.encode({"age": [1.0, 2.0], "user/id": ["user-7", "stranger"]})
    assert encoded.ids[:, 0].tolist() == [ids["user-7"], 1]


def test_a_missing_part_a_wrong_entry_and_no_dataset_are_one_line_each(tmp_path):
    entry, _ = write_vocabulary(tmp_path, parts=3)
    missing = tmp_path / file_paths([entry])[1]
    missing.unlink()
    value = next(v for v, p in zip(VALUES, parts_of(pa.array(VALUES), 3)) if p == 1)
    with pytest.raises(DataError, match=rf"^{missing}: no such file; expected part 1 of 'user/id''s vocabulary"):
        FileVocabulary(entry, str(tmp_path))(pa.array([value]))
    with pytest.raises(DataError, match=r"vocabulary_path '/etc', vocabulary_parts 3, .*expected a relative path"):
        FileVocabulary({**entry, "vocabulary_path": "/etc"}, str(tmp_path))
    with pytest.raises(DataError, match=r"its vocabulary is the Parquet files 'vocabularies/user%2Fid' of its "
                                        r"dataset, and no dataset is known here"):
        TableEncoder({"categorical": [entry]})


def test_a_rank_reads_its_row_groups_round_robin_with_their_record_indices(tmp_path):
    folder = tmp_path / "records"
    folder.mkdir()
    pq.write_table(pa.table({"a": np.arange(100), "b": np.arange(100) * 2.0}), folder / "part-0.parquet",
                   row_group_size=30)  # groups of 30, 30, 30, 10
    pq.write_table(pa.table({"a": np.arange(100, 125), "b": np.zeros(25)}), folder / "part-1.parquet")
    shares = [RecordShare(str(folder), rank, 3, ["a"]) for rank in range(3)]
    assert [len(s) for s in shares] == [30 + 10, 30 + 25, 30] and shares[0].records == 125
    assert shares[1].chunk_count(20) == 2 + 2
    seen = {}
    for share in shares:
        for start, table in share.chunks(20):
            assert table.column_names == ["a"]
            seen.update(zip(range(start, start + table.num_rows), table.column("a").to_pylist()))
    assert seen == {i: i for i in range(125)}
    assert shares[0].empty().num_rows == 0 and shares[0].empty().column_names == ["a"]
    with pytest.raises(DataError, match=r"no column 'c'; the model reads a, c and the records have a, b"):
        RecordShare(str(folder), 0, 1, ["a", "c"])
    (tmp_path / "text.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"text.parquet: .*expected Parquet records"):
        RecordShare(str(tmp_path / "text.parquet"), 0, 1, ["a"])
