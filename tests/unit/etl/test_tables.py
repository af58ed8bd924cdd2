"""What the ETL decides about a table before Spark starts (local files: the CSV header and first lines, the Parquet
schema): label columns and the target, categorical columns, the table options; label checks; numeric statistics."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.etl.job import plan_etl
from mpitrain.etl.records import Target
from mpitrain.etl.sources import SourceOptions, open_source
from mpitrain.etl.tables import NumericStats, TableOptions
from mpitrain.etl.transforms import TransformOptions


@pytest.fixture
def table(tmp_path):
    """A CSV of two numbers, a text column, an integer class, 0/1 labels and a value."""
    lines = ["x1,x2,city,klass,a,b,price,answer"]
    for i in range(30):
        lines.append(f"{i * 0.5},{i % 7},{'paris' if i % 2 else 'rome'},{i % 3},{i % 2},{(i // 2) % 2},{i * 1.25},"
                     f"{'yes' if i % 3 else 'no'}")
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    return f"csv:{tmp_path / 't.csv'}"


def opened(spec, **options):
    return open_source(spec, options=SourceOptions(**options))


@pytest.mark.parametrize("label, target, expected", [
    ("klass", "", "class"), ("3", "", "class"), ("price", "", "regression"), ("a,b", "", "multilabel"),
    ("a,klass", "", "regression"), ("a", "binary", "binary"), ("answer", "", "class"), ("klass", "regression", "regression")])
def test_the_target_is_inferred_from_the_first_records_or_stated(table, label, target, expected):
    source = opened(table, label=label, target=target, categorical=("city",))
    assert source.target.kind == expected
    assert source.text_labels == (label == "answer")
    assert "city" not in source.features and set(source.labels).isdisjoint(source.features)


@pytest.mark.parametrize("options, message", [
    (dict(label="klass", categorical=("town",)), "--categorical town: no column 'town' in csv:"),
    (dict(label="klass,nope"), "--label klass,nope: no column 'nope' in csv:"),
    (dict(label="a,b", target="binary"), "--target binary: expected one label column, --label gives 2 (a,b)"),
    (dict(label="a", target="multilabel"), "--target multilabel: expected two or more label columns, --label gives 1"),
    (dict(label="a,answer"), "--label a,answer: column 'answer' holds text; several label columns hold numbers"),
    (dict(label="klass", categorical=("klass",)), "--categorical klass: 'klass' is a --label column"),
    (dict(label="price", target="regression", num_classes=3), "--num-classes 3: only a class target has classes"),
    (dict(label="klass", categorical=("city",), feature_shape=(2, 3)), "--feature-shape and --feature-dtype: a table"),
])
def test_wrong_columns_and_targets_fail_in_one_line_naming_them(table, options, message):
    with pytest.raises(ConfigError) as failed:
        opened(table, **options)
    assert message in str(failed.value) and "\n" not in str(failed.value)


@pytest.mark.parametrize("options, message", [
    (lambda: dict(tables=TableOptions(hash_buckets=(("city", 1 << 31),))),
     "--hash-buckets city:2147483648: expected 1..2147483647"),
    (lambda: dict(tables=TableOptions(hash_buckets=(("x1", 10),))),
     "--hash-buckets x1:10: 'x1' is not a --categorical or --bag column"),
    (lambda: dict(transforms=TransformOptions(scale=True)), "--scale and --binarize: a table"),
    (lambda: dict(tables=TableOptions(max_vocabulary=0)), "--max-vocabulary 0: expected 1..2147483646"),
    (lambda: dict(tables=TableOptions(min_count=0)), "--min-count 0: expected an integer >= 1"),
    (lambda: dict(source_options=SourceOptions(label="a,b", categorical=("city",)),
                  transforms=TransformOptions(one_hot=True)),
     "--one-hot: one-hot labels are a class target's, this one is multilabel"),
    (lambda: dict(source_options=SourceOptions(label="price", categorical=("city",)), order="label"),
     "--order label: sorts rows by class or binary outcome, this target is regression"),
])
def test_table_options_are_checked_before_spark_starts(table, tmp_path, options, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        options = {"source_options": SourceOptions(label="klass", categorical=("city",)), **options()}
        plan_etl(table, str(tmp_path / "out"), 2, **options)
    assert not (tmp_path / "out").exists()




def test_parquet_columns_are_typed_by_the_schema(tmp_path):
    pq.write_table(pa.table({"y": [0, 1, 1], "kind": ["a", "b", "a"], "v": [1.0, 2.0, 3.0], "tags": [[1], [2], [3]]}),
                   tmp_path / "t.parquet")
    spec = f"parquet:{tmp_path / 't.parquet'}"
    source = opened(spec, label="y", categorical=("kind",), features=("v",))
    assert (source.target.kind, source.features, source.categorical) == ("class", ["v"], ["kind"])
    with pytest.raises(ConfigError, match=r"column 'kind' is string; expected numbers or arrays of numbers "
                                          r"\(or name it in --categorical\)"):
        opened(spec, label="y")
    with pytest.raises(ConfigError, match="column 'v' is number; expected strings or integers"):
        opened(spec, label="y", categorical=("v",), features=("y",))
    with pytest.raises(ConfigError, match="column 'tags' is array; expected numbers"):
        opened(spec, label="y", categorical=("kind",))


def test_labels_that_do_not_fit_the_target_are_bad_and_named():
    record = str
    y, ok, describe = Target("binary", ("clicked",)).check([pa.array([0, 1, 2, None])], "f.parquet", record)
    assert ok.tolist() == [True, True, False, False] and y.dtype == np.float32 and y.shape == (4, 1)
    assert describe(2) == "f.parquet: label 2 at record 2, expected 0 or 1 (column 'clicked')"
    assert describe(3) == "f.parquet: label missing at record 3, expected 0 or 1 (column 'clicked')"
    y, ok, describe = Target("regression", ("price",)).check([pa.array(["1.5", "cheap"])], "f.csv", record)
    assert ok.tolist() == [True, False] and y[0, 0] == 1.5
    assert describe(1) == "f.csv: label 'cheap' at record 1, expected a finite number (column 'price')"
    y, ok, describe = Target("class", ("answer",), 2, ("no", "yes")).check([pa.array(["yes", "no", "maybe"])], "f",
                                                                           record)
    assert y[:2].tolist() == [1, 0] and y.dtype == np.int32 and ok.tolist() == [True, True, False]
    assert describe(2) == "f: label 'maybe' at record 2, expected one of 'no', 'yes' (column 'answer')"
    y, ok, _ = Target("class", ("k",), 3).check([np.array([0.0, 2.0, 3.0, 1.5])], "f", record)
    assert ok.tolist() == [True, True, False, False]


def test_numeric_statistics_merge_exactly_and_skip_missing_values():
    rng = np.random.default_rng(0)
    values = rng.normal(1e6, 3.0, (1000, 3))
    values[rng.random((1000, 3)) < 0.2] = np.nan
    values[:, 2] = np.nan
    merged = NumericStats.of(values[:10])
    for part in np.array_split(values[10:], 7):
        merged = merged.merge(NumericStats.of(part))
    present = ~np.isnan(values[:, :2])
    assert merged.count.tolist() == [*present.sum(axis=0), 0] and merged.rows == 1000
    np.testing.assert_allclose(merged.mean[:2], np.nanmean(values[:, :2], axis=0), rtol=1e-14)
    np.testing.assert_allclose(merged.std[:2], np.nanstd(values[:, :2], axis=0), rtol=1e-9)
    assert merged.std[2] == 1.0 and merged.mean[2] == 0.0  # no value: mean 0, std 1
