"""mpitrain.data.encoding: a table's records as rows of x, by the manifest's columns."""
import numpy as np
import pyarrow as pa
import pytest

from mpitrain.data.encoding import (MAX_IDS, TableEncoder, TableRows, fnv1a64, hash_ids, parse_table, text_hashes,
                                    vocabulary_ids)
from mpitrain.base.errors import DataError

MASK = (1 << 64) - 1


def reference_hash(text: str) -> int:
    """FNV-1a 64 of the UTF-8 bytes, then splitmix64's finalizer, in plain Python integers."""
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK
    return h ^ (h >> 31)


COLUMNS = {
    "numeric": [{"name": "age", "mean": 40.0, "std": 10.0, "impute": 40.0}, {"name": "income"},
                {"name": "age_missing", "missing_of": "age"}],
    "categorical": [{"name": "country", "ids": 4, "vocabulary": ["us", "fr"], "min_count": 2},
                    {"name": "shop", "ids": 8, "vocabulary": ["7", "3", "12", "1", "2", "5"], "min_count": 1},
                    {"name": "user", "ids": 101, "hash_buckets": 100, "hash": "fnv1a64-splitmix64"}],
}


def test_hash_ids_are_splitmix64_of_fnv1a64_of_the_utf8_bytes():
    texts = ["", "a", "us", "user-123456", "Zürich", "日本", "x" * 300, None]
    array = pa.array(texts, pa.string())
    assert fnv1a64(array[1:2]).tolist() == [0xAF63DC4C8601EC8C]  # FNV-1a 64 of b"a", the published value
    expected = [0 if t is None else reference_hash(t) for t in texts]
    assert text_hashes(array).tolist() == expected
    assert hash_ids(array, 1000).tolist() == [0 if t is None else 1 + h % 1000 for t, h in zip(texts, expected)]
    assert hash_ids(array.slice(3), 7).tolist() == hash_ids(array, 7)[3:].tolist()  # an array's offset is honoured


def test_vocabulary_ids_missing_out_of_vocabulary_and_known():
    ids = vocabulary_ids(pa.array(["fr", None, "de", "us"]), pa.array(["us", "fr"]))
    assert ids.tolist() == [3, 0, 1, 2]


def test_encoder_maps_records_as_the_columns_say():
    encoder = TableEncoder(COLUMNS)
    assert (encoder.numeric, encoder.categorical, encoder.width) == (["age", "income"], ["country", "shop", "user"], 3)
    records = {"age": [50.0, None, np.nan], "income": [1, 2, 3], "country": ["fr", None, "de"],
               "shop": [12, 7, None], "user": ["u1", "u2", None]}
    encoded = encoder.encode(records)
    users = hash_ids(pa.array(["u1", "u2"]), 100)
    np.testing.assert_array_equal(encoded.x, np.array([
        [1.0, 1, 0],  # (50 - 40) / 10
        [0.0, 2, 1],  # age imputed by 40 (standardized 0), indicator 1
        [0.0, 3, 1]], np.float32))  # NaN is missing too
    np.testing.assert_array_equal(encoded.ids, np.array([
        [3, 4, users[0]],  # shop 12 is vocabulary[2]
        [0, 2, users[1]],  # country missing
        [1, 0, 0]]))  # "de" out of vocabulary; shop and user missing
    assert encoded.x.dtype == np.float32 and encoded.ids.dtype == np.int32 and not encoded.bad.any()
    batch = pa.RecordBatch.from_pydict({**records, "extra": ["ignored"] * 3})
    for again in (encoder.encode(batch), encoder.encode(pa.Table.from_batches([batch]))):
        np.testing.assert_array_equal(again.x, encoded.x)
        np.testing.assert_array_equal(again.ids, encoded.ids)


def test_ids_beyond_float32s_integers_stay_exact_up_to_two_to_the_31():
    buckets = MAX_IDS - 1  # the most --hash-buckets takes
    encoder = TableEncoder({"categorical": [{"name": "user", "ids": MAX_IDS, "hash_buckets": buckets,
                                             "hash": "fnv1a64-splitmix64"}]})
    users = [f"user-{i}" for i in range(1000)]
    expected = hash_ids(pa.array(users), buckets)
    encoded = encoder.encode({"user": users})
    assert encoded.x.shape == (1000, 0) and encoded.ids.dtype == np.int32
    assert encoded.ids[:, 0].tolist() == expected.tolist()  # each as its int64 hash id: none rounded
    assert (expected > 2**24).mean() > 0.99 and (expected != expected.astype(np.float32).astype(np.int64)).any()


def test_bad_numbers_are_marked_and_explained_by_column():
    encoder = TableEncoder({"numeric": [{"name": "age"}, {"name": "income", "impute": 0.0}]})
    records = pa.table({"age": pa.array(["1", " 2.5 ", "abc", None, "inf", "7"]),
                        "income": pa.array(["1", "2", "3", "4", "5", "x"])})
    encoded = encoder.encode(records)
    assert encoded.bad.tolist() == [False, False, True, True, True, True]
    np.testing.assert_array_equal(encoded.x[:2], [[1, 1], [2.5, 2]])
    assert encoded.problem(2) == "column 'age' holds 'abc', expected a number"
    assert encoded.problem(3) == "column 'age' is missing, expected a number (--numeric-missing impute fills it in)"
    assert encoded.problem(4) == "column 'age' holds inf, expected a finite number"
    assert encoded.problem(5) == "column 'income' holds 'x', expected a number"
    with pytest.raises(DataError, match="no column 'age'; the records have"):
        encoder.encode({"income": [1.0]})
    with pytest.raises(DataError, match="column 'country' holds double, expected strings or integers"):
        parse_table({"country": [1.5]}, [], ["country"])


def test_encoder_refuses_columns_that_do_not_add_up():
    with pytest.raises(DataError, match="columns.categorical 'c': expected a vocabulary of ids - 2 values"):
        TableEncoder({"categorical": [{"name": "c", "ids": 5, "vocabulary": ["a"]}]})
    with pytest.raises(DataError, match="missing_of 'b' is not a numeric column"):
        TableEncoder({"numeric": [{"name": "a"}, {"name": "b_missing", "missing_of": "b"}]})


def test_table_rows_index_join_and_hash_their_content():
    rows = parse_table({"v": [1.0, None, 3.0, np.nan], "c": ["a", None, "b", None]}, ["v"], ["c"], imputed={"v"}).rows
    assert len(rows) == 4
    picked = TableRows.concat([rows[np.array([2])], rows[np.array([False, True, False, True])]])
    assert picked.numeric[:, 0].tolist()[0] == 3.0 and np.isnan(picked.numeric[1:, 0]).all()
    assert picked.categorical[0].to_pylist() == ["b", None, None]
    content = rows.content()
    assert content.dtype == np.uint64 and content.shape == (4, 2)
    np.testing.assert_array_equal(content[1], content[3])  # null and NaN alike: the same row
    assert len(set(map(bytes, content))) == 3
    assert len(TableRows.empty(1, 1)) == 0
