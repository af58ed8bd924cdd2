"""etl/sequence_columns.py: a Parquet list of integers stays integers (past float32's 2**24), a list of floats
becomes float32; an integer an int32 cannot hold, or a missing one, is one error naming the record and column."""
import numpy as np
import pyarrow as pa
import pytest

from mpitrain.base.errors import DataError
from mpitrain.etl.sequence_columns import ragged_column


def read(values, kind):
    return ragged_column(pa.array(values, pa.list_(kind)), "tokens", 1, 100, "f.parquet", lambda i: f"#{i}")


def test_integers_stay_integers_and_floats_become_float32():
    ids = read([[1, 2**24 + 1], [2**31 - 1]], pa.int64())
    assert ids.values.dtype.kind == "i" and ids.values[:, 0].tolist() == [1, 2**24 + 1, 2**31 - 1]
    assert ids.offsets.tolist() == [0, 2, 3]
    numbers = read([[1.5, 2.0]], pa.float64())
    assert numbers.values.dtype == np.float32 and numbers.values[:, 0].tolist() == [1.5, 2.0]


@pytest.mark.parametrize("values, problem", [
    ([[1], [2, 2**31]], "holds an integer outside -2\\*\\*31..2\\*\\*31-1"),
    ([[1], [None, 3]], "holds a missing number in its sequence, expected integers"),
])
def test_an_integer_out_of_int32_or_missing_is_one_error_naming_the_record(values, problem):
    with pytest.raises(DataError, match=f"f.parquet: record #1: column 'tokens' {problem}"):
        read(values, pa.int64())
