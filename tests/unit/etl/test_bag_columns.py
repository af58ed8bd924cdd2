"""Bag columns (`--bag`, etl/bag_columns.py) without Spark: a Parquet list column and a delimited CSV cell read as
the same bags of texts (an empty or missing list the empty bag, a missing value id 0), the bags indexed, joined and
hashed for the shuffle as `Ragged` sequences are, their ids by a vocabulary or hash buckets, and the manifest's
checks of a bag column's entry."""
import json

import numpy as np
import pyarrow as pa
import pytest

from etl.bag_columns import TextBags, bag_column, bag_ids
from etl.tables import vocabulary_entry
from mpitrain.base.errors import DataError
from mpitrain.data.encoding import CategoryIds, hash_ids
from mpitrain.data.shards import MANIFEST_NAME, read_manifest
from mpitrain.testing.sequences import make_bag_dataset

BAGS = [["m3", "m1", "m3"], [], None, ["m2", None, "m9"], ["7"]]
EXPECTED = [["m3", "m1", "m3"], [], [], ["m2", None, "m9"], ["7"]]  # a missing list is the empty bag


def read(bags: TextBags) -> list:
    values = bags.values.to_pylist()
    return [values[a:b] for a, b in zip(bags.offsets[:-1], bags.offsets[1:])]


def record(i: int) -> str:
    return f"{i} of a batch"


def test_a_parquet_list_and_a_delimited_csv_cell_give_the_same_bags():
    from_list = bag_column(pa.array(BAGS, pa.list_(pa.string())), "recent", 10, "f.parquet", record)
    cells = pa.array(["m3|m1|m3", "", None, " m2 || m9 ", "7"], pa.string())
    from_cells = bag_column(cells, "recent", 10, "f.csv", record, delimiter="|")
    assert read(from_list) == read(from_cells) == EXPECTED
    integers = bag_column(pa.array([[3, 1], [], [7]], pa.list_(pa.int64())), "recent", 10, "f.parquet", record)
    assert read(integers) == [["3", "1"], [], ["7"]]  # integers by their decimal text, as a categorical column's


@pytest.mark.parametrize("column, message", [
    (pa.array([["a"], ["a", "b", "c"]], pa.list_(pa.string())),
     "f: record 1 of a batch: column 'recent' holds a bag of 3 values, more than --max-length 2"),
    (pa.array([[1.5], [2.0]], pa.list_(pa.float64())), "f: column 'recent' holds double, expected strings or integers"),
    (pa.array(["a", "b"], pa.string()), "f: column 'recent' is string; expected a list of strings or integers"),
])
def test_a_wrong_bag_is_one_error_naming_the_file_the_column_and_the_record(column, message):
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bag_column(column, "recent", 2, "f", record)


def test_bags_index_join_and_hash_as_ragged_sequences_do():
    bags = bag_column(pa.array(BAGS, pa.list_(pa.string())), "recent", 10, "f", record)
    assert read(bags[[3, 1, 0]]) == [EXPECTED[3], EXPECTED[1], EXPECTED[0]]
    assert read(bags[np.array([True, False, False, False, True])]) == [EXPECTED[0], EXPECTED[4]]
    assert read(TextBags.concat([bags[[4]], TextBags.empty(), bags[[1, 0]]])) == [EXPECTED[4], [], EXPECTED[0]]
    content = bags.content()
    assert content.shape == (5, 2) and content[:, 0].tolist() == [3, 0, 0, 3, 1]
    assert (content[1] == content[2]).all() and len({tuple(row) for row in content[[0, 3, 4]]}) == 3
    swapped = bag_column(pa.array([["m1", "m3", "m3"]], pa.list_(pa.string())), "recent", 10, "f", record)
    assert (swapped.content()[0] != content[0]).any()  # the same values in another order: another key


def test_ids_come_from_the_vocabulary_or_the_hash_buckets():
    bags = bag_column(pa.array(BAGS, pa.list_(pa.string())), "recent", 10, "f", record)
    vocabulary = CategoryIds({"name": "recent", **vocabulary_entry(["m3", "m2", "m1"])}, "--bag")
    ids = bag_ids(bags, vocabulary)
    assert ids.values.dtype == np.int32 and ids.values.shape == (7, 1) and (ids.offsets == bags.offsets).all()
    assert ids.values[:, 0].tolist() == [2, 4, 2, 3, 0, 1, 1]  # m9 and 7: out of vocabulary; None: missing
    hashed = bag_ids(bags, CategoryIds({"name": "recent", **vocabulary_entry(buckets=5)}, "--bag"))
    assert hashed.values[:, 0].tolist() == hash_ids(bags.values, 5).tolist()


@pytest.mark.parametrize("change, message", [
    ({"shortest": 0, "bag": False}, "expected \\[\\{name, features"),  # only a bag may be empty
    ({"bag": "yes"}, "bag 'yes' of 1 features per step, expected bag true"),
    ({"ids": 9}, "sequences 'recent': expected a vocabulary of ids - 2 values, ids - 1 hash_buckets"),
])
def test_the_manifest_s_bag_column_entry_is_checked(tmp_path, change, message):
    make_bag_dataset(tmp_path, n_train=40, n_test=20, ids=5)
    (column,) = read_manifest(str(tmp_path)).sequences
    assert column["bag"] is True and column["shortest"] == 0 and column["ids"] == column["hash_buckets"] + 1
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    data["sequences"][0].update(change)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(DataError, match=message):
        read_manifest(str(tmp_path))
