"""Tables through `mpitrain etl` (real Spark, local[2]): label columns and targets, categorical columns as ids
(vocabularies of the train split, hashing), standardized and imputed numbers, `mpitrain info`; and the errors a
table can have, each one line naming the column, exit 2, nothing written.

The command runs in this process on the module's SparkSession (`etl`, tests/system/conftest.py), so the module starts Spark once."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpitrain import cli
from mpitrain.data.encoding import hash_ids
from mpitrain.data.shards import read_manifest
from mpitrain.testing.datasets import read_split, siblings

BUCKETS = 2**31 - 1  # the most --hash-buckets takes: ids past float32's integers (2**24), as int32


def one_error_line(status: int, err: str) -> str:
    """The one line a failed `mpitrain etl` prints (Spark's own warnings aside)."""
    errors = [line for line in err.splitlines() if line.startswith("mpitrain etl: error: ")]
    assert status == 2 and len(errors) == 1, err[-3000:]
    return errors[0]


# --- a CSV table: numbers, categorical columns, missing values, several 0/1 labels ---

ROWS = 400
CITIES = ["paris"] * 120 + ["rome"] * 90 + ["oslo"] * 60 + ["kyiv"] * 40 + ["bern"] * 40 + ["zurich"] * 3 + \
    ["lima"] * 2 + [""] * 45  # lima: below --min-count 3; zurich: 3, unless a row goes to the test split; "": missing


@pytest.fixture(scope="module")
def csv_table(tmp_path_factory):
    """A CSV of ROWS records: a row id (it finds each row after the shuffle), `age` with missing values, `income`,
    `city` (text), `shop` (integers), `user` (too many values for a vocabulary: hashed) and labels l1, l2, l3."""
    rng = np.random.default_rng(7)
    rows = {"rowid": np.arange(ROWS), "age": np.round(rng.normal(40, 12, ROWS), 3),
            "income": np.round(rng.lognormal(3, 1, ROWS), 4), "city": rng.permutation(CITIES),
            "shop": rng.integers(0, 12, ROWS), "user": [f"u{v}" for v in rng.integers(0, 10**6, ROWS)],
            "l1": rng.integers(0, 2, ROWS), "l2": rng.integers(0, 2, ROWS), "l3": rng.integers(0, 2, ROWS)}
    rows["age"][::9] = np.nan
    path = tmp_path_factory.mktemp("csv") / "people.csv"
    lines = [",".join(rows)] + [",".join("" if isinstance(v, float) and np.isnan(v) else str(v)
                                        for v in values) for values in zip(*rows.values())]
    path.write_text("\n".join(lines) + "\n")
    return path, rows


def vocabulary_of(values) -> list[str]:
    """Values seen at least 3 times, by descending count then text (missing ones left out)."""
    counts = Counter(v for v in values if v != "")
    return [v for v, c in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if c >= 3]


def test_csv_table_to_ids_and_standardized_numbers(etl, csv_table, tmp_path):
    path, raw = csv_table
    out = tmp_path / "people"
    status, printed, err = etl("--source", f"csv:{path}", "--out", out, "--shards", 2, "--seed", 3, "--label", "l1,l2,l3",
                               "--categorical", "city,shop,user", "--hash-buckets", f"user:{BUCKETS}", "--min-count", 3,
                               "--numeric-missing", "impute", "--standardize")
    assert status == 0, err[-3000:]
    assert f"wrote {out}: train 320 rows, test 80 rows" in printed
    manifest = read_manifest(str(out))
    assert (manifest.target, manifest.target_names, manifest.num_classes) == ("multilabel", ["l1", "l2", "l3"], 3)
    assert (manifest.feature_shape, manifest.feature_dtype, manifest.id_dtype) == ((4,), "float32", "int32")
    assert (manifest.scale, manifest.offset, manifest.mean, manifest.std) == (1.0, 0.0, 0.0, 1.0)
    numeric, categorical = manifest.columns["numeric"], manifest.columns["categorical"]
    assert [c["name"] for c in numeric] == ["rowid", "age", "income", "age_missing"]
    assert numeric[3] == {"name": "age_missing", "missing_of": "age"}  # income misses nothing: no indicator
    assert [(c["name"], c["ids"]) for c in categorical][2] == ("user", BUCKETS + 1)
    assert categorical[2]["hash_buckets"] == BUCKETS
    assert set(manifest.input_groups) == {"numeric", "categorical"}

    split_rows = {}
    for split in ("train", "test"):
        x, y = read_split(out, split)
        x = x.x  # the numbers
        rowid = np.rint(x[:, 0].astype(np.float64) * numeric[0]["std"] + numeric[0]["mean"]).astype(int)
        split_rows[split] = rowid
        assert y.dtype == np.float32 and y.shape == (len(x), 3)
        np.testing.assert_array_equal(y, np.stack([raw[c][rowid] for c in ("l1", "l2", "l3")], axis=1))
        assert manifest.label_counts[split] == y.sum(axis=0).astype(int).tolist()
    train = split_rows["train"]
    assert sorted(np.concatenate(list(split_rows.values())).tolist()) == list(range(ROWS))

    # numbers: the train split's mean and std (numpy's), a missing age imputed by the mean (0 once standardized)
    for j, name in ((1, "age"), (2, "income")):
        assert numeric[j]["mean"] == pytest.approx(np.nanmean(raw[name][train]), rel=1e-12)
        assert numeric[j]["std"] == pytest.approx(np.nanstd(raw[name][train]), rel=1e-12)
        assert numeric[j]["impute"] == numeric[j]["mean"]
    x = read_split(out, "train")[0].x
    age = raw["age"][train]
    expected = np.where(np.isnan(age), 0.0, (age - numeric[1]["mean"]) / numeric[1]["std"]).astype(np.float32)
    np.testing.assert_allclose(x[:, 1], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x[:, 3], np.isnan(age))
    np.testing.assert_allclose(x[:, :3].mean(axis=0), 0, atol=1e-5)

    # categories: vocabularies of the train rows only, most frequent first; 0 missing, 1 out of vocabulary
    cities = vocabulary_of(raw["city"][train])
    assert categorical[0] == {"name": "city", "ids": len(cities) + 2, "vocabulary": cities, "min_count": 3}
    assert cities[:2] == ["paris", "rome"] and "lima" not in cities
    assert cities != vocabulary_of(raw["city"])  # a zurich row went to the test split: 2 train rows are too few
    assert categorical[1]["vocabulary"] == vocabulary_of(raw["shop"][train].astype(str))
    ids = []
    for split, rowid in split_rows.items():
        x, _ = read_split(out, split)
        categories = x.columns["categorical"]
        assert categories.dtype == np.int32 and categories.shape == (len(rowid), 3)
        city = raw["city"][rowid]
        expected = [0 if c == "" else cities.index(c) + 2 if c in cities else 1 for c in city]
        np.testing.assert_array_equal(categories[:, 0], expected)
        users = hash_ids(pa.array(np.array(raw["user"])[rowid]), BUCKETS)  # int64, beyond float32's integers
        assert (users > 2**24).mean() > 0.9
        np.testing.assert_array_equal(categories[:, 2], users)
        ids += categories[:, 0].tolist()
    assert {0, 1} <= set(ids)  # missing, and rare (lima) or test-only (zurich)


def test_info_names_the_target_and_every_column(etl, csv_table, tmp_path, capsys):
    path, _ = csv_table
    out = tmp_path / "people"
    status, _, err = etl("--source", f"csv:{path}", "--out", out, "--shards", 1, "--label", "l1,l2,l3",
                         "--categorical", "city,shop", "--hash-buckets", "1000", "--numeric-missing", "impute",
                         "--features", "age,income")
    assert status == 0, err[-3000:]
    assert cli.main(["info", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{out}: schema 1, features float32[3] (scale 1, offset 0, mean 0, std 1), ids int32[2], " \
                       "target multilabel (3 labels: l1, l2, l3)"
    assert lines[1] == "columns numeric (3): age (imputed), income (imputed), age_missing (missing indicator of age)"
    assert lines[2] == "columns categorical (2): city (1001 ids: 1000 hash buckets), shop (1001 ids: 1000 hash buckets)"
    manifest = json.loads((out / "manifest.json").read_text())
    assert lines[-3].startswith("  train: 320 rows in 1 shards; positives per label ")
    assert lines[-3].endswith(str(manifest["label_counts"]["train"]))
    assert lines[-1] == "all shards present and well-formed, checksums verified"


# --- Parquet: a binary target, text class labels; a regression target ---

@pytest.fixture(scope="module")
def parquet_table(tmp_path_factory):
    rng = np.random.default_rng(11)
    n = 300
    countries = rng.choice(["de", "fr", "us", None], n, p=[0.4, 0.3, 0.2, 0.1])
    table = pa.table({"clicked": rng.integers(0, 2, n), "answer": rng.choice(["yes", "no", "maybe"], n),
                      "device": pa.array(rng.integers(100, 104, n), pa.int32()), "country": pa.array(countries),
                      "amount": rng.normal(50, 10, n), "row": np.arange(n)})
    path = tmp_path_factory.mktemp("parquet") / "clicks.parquet"
    pq.write_table(table, path)
    return path, table.to_pydict()


def test_parquet_binary_target_and_text_classes(etl, parquet_table, tmp_path):
    path, raw = parquet_table
    out = tmp_path / "clicks"
    status, _, err = etl("--source", f"parquet:{path}", "--out", out, "--shards", 2, "--label", "clicked",
                         "--target", "binary", "--categorical", "device,country", "--features", "amount,row")
    assert status == 0, err[-3000:]
    manifest = read_manifest(str(out))
    assert (manifest.target, manifest.target_names, manifest.num_classes) == ("binary", ["clicked"], 2)
    assert manifest.transforms[0]["stratified"] is True  # carved by outcome
    clicked = np.array(raw["clicked"])
    positives = manifest.label_counts["test"][0]
    assert abs(positives - 0.2 * clicked.sum()) <= 1
    x, y = read_split(out, "test")
    x, categories = x.x, x.columns["categorical"]
    row = x[:, 1].astype(int)
    assert y.dtype == np.float32 and y.shape == (60, 1)
    np.testing.assert_array_equal(y[:, 0], clicked[row])
    device = manifest.columns["categorical"][0]
    assert set(device["vocabulary"]) <= {"100", "101", "102", "103"}  # integers by their decimal text
    np.testing.assert_array_equal(categories[:, 0], [device["vocabulary"].index(str(d)) + 2
                                                     for d in np.array(raw["device"])[row]])
    np.testing.assert_array_equal(categories[:, 1] == 0, [raw["country"][r] is None for r in row])

    out = tmp_path / "answers"
    status, _, err = etl("--source", f"parquet:{path}", "--out", out, "--shards", 1, "--label", "answer",
                         "--categorical", "country", "--features", "row")
    assert status == 0, err[-3000:]
    manifest = read_manifest(str(out))
    assert (manifest.target, manifest.class_names, manifest.num_classes) == ("class", ["maybe", "no", "yes"], 3)
    x, y = read_split(out, "train")
    assert y.dtype == np.int32
    answers = np.array(raw["answer"])[x.x[:, 0].astype(int)]
    np.testing.assert_array_equal(np.array(manifest.class_names)[y], answers)


def test_regression_target_inferred_from_numbers(etl, parquet_table, tmp_path):
    path, raw = parquet_table
    out = tmp_path / "amounts"
    status, _, err = etl("--source", f"parquet:{path}", "--out", out, "--shards", 2, "--label", "amount",
                         "--features", "row,clicked", "--standardize")
    assert status == 0, err[-3000:]
    manifest = read_manifest(str(out))
    assert (manifest.target, manifest.target_names, manifest.columns) == ("regression", ["amount"], {})
    assert manifest.label_counts == {"train": [240], "test": [60]}
    assert manifest.transforms[0]["stratified"] is False
    x, y = read_split(out, "train")
    assert y.dtype == np.float32 and y.shape == (240, 1)
    standardize = manifest.transforms[-1]
    row = np.rint(x[:, 0] * standardize["std"][0] + standardize["mean"][0]).astype(int)
    np.testing.assert_array_equal(y[:, 0], np.array(raw["amount"], np.float32)[row])
    # the target as stored, its train split's mean and std recorded for data.standardize_targets
    np.testing.assert_allclose(manifest.target_mean, [y[:, 0].mean(dtype=np.float64)], rtol=1e-9)
    np.testing.assert_allclose(manifest.target_std, [y[:, 0].std(dtype=np.float64)], rtol=1e-6)


# --- errors: one line naming the column, exit 2, nothing written ---

def test_unknown_categorical_column_fails_before_spark(csv_table, tmp_path, capsys):
    path, _ = csv_table
    out = tmp_path / "ds"
    status = cli.main(["etl", "--source", f"csv:{path}", "--out", str(out), "--shards", "2", "--label", "l1",
                       "--categorical", "city,town"])
    line = one_error_line(status, capsys.readouterr().err)
    assert line.startswith("mpitrain etl: error: --categorical city,town: no column 'town' in csv:")
    assert siblings(out) == []


def test_a_million_values_without_hashing(etl, tmp_path):
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(10**6), "y": np.arange(10**6) % 2}), path)
    out = tmp_path / "ds"
    line = one_error_line(*etl("--source", f"parquet:{path}", "--out", out, "--shards", 1, "--label", "y",
                               "--categorical", "id")[::2])
    assert line == (f"mpitrain etl: error: parquet:{path}: categorical column 'id' has 800000 distinct values in the "
                    "train split (seen at least --min-count 1 times), more than --max-vocabulary 100000; hash it "
                    "(--hash-buckets id:N), raise --max-vocabulary or keep it in Parquet files beside the manifest "
                    "(--vocabulary-files)")
    assert siblings(out) == []


def test_a_million_values_in_vocabulary_files(etl, tmp_path, capsys):
    """--vocabulary-files: the 800,000 train values get ids 2.. in Parquet parts beside the manifest, written by the
    tasks that counted them; every train row's stored id is its value's there, each value its own; a value only in
    the test split is out of vocabulary (1); a small column beside it keeps its vocabulary in the manifest."""
    from mpitrain.data.vocabulary_files import FileVocabulary, file_paths
    path = tmp_path / "ids.parquet"
    n = 10**6
    pq.write_table(pa.table({"id": np.arange(n), "v": np.arange(n, dtype=np.float64), "small": np.arange(n) % 7,
                             "y": np.arange(n) % 2}), path)
    out = tmp_path / "ds"
    status, printed, err = etl("--source", f"parquet:{path}", "--out", out, "--shards", 2, "--label", "y",
                               "--features", "v", "--categorical", "id,small", "--vocabulary-files")
    assert status == 0, err[-3000:]
    manifest = read_manifest(str(out))
    entry, small = manifest.columns["categorical"]
    assert sorted(small["vocabulary"]) == [str(v) for v in range(7)] and "vocabulary_path" not in small
    assert entry["ids"] == 800_002 and entry["vocabulary_path"] == "vocabularies/id" and entry["min_count"] == 1
    parts = [pq.read_table(out / p) for p in file_paths([entry])]
    assert len(parts) == entry["vocabulary_parts"] >= 2
    ids = np.concatenate([p.column("id").to_numpy() for p in parts])
    assert np.array_equal(np.sort(ids), np.arange(2, 800_002))
    assert all(set(p.column("count").to_pylist()) == {1} for p in parts)
    x, _ = read_split(out, "train")
    lookup = FileVocabulary(entry, str(out))
    values = pa.array([str(int(v)) for v in x.x[:, 0]])
    assert np.array_equal(lookup(values), x.columns["categorical"][:, 0])
    test_x, _ = read_split(out, "test")
    assert len(test_x.x) == 200_000 and np.all(test_x.columns["categorical"][:, 0] == 1)
    assert np.array_equal(lookup(pa.array([str(int(v)) for v in test_x.x[:, 0]] + [None])),
                          np.r_[np.ones(200_000, np.int64), 0])
    assert cli.main(["info", str(out)]) == 0
    assert f"id (800002 ids: vocabulary of 800000 in {entry['vocabulary_parts']} Parquet files vocabularies/id/, " \
           "min count 1), small (9 ids: vocabulary of 7, min count 1)" in capsys.readouterr().out


def test_missing_and_wrong_kind_labels_are_bad_records(etl, tmp_path):
    lines = ["price,size,color"] + [f"{10 + i},{i % 5},{'red' if i % 2 else 'blue'}" for i in range(40)]
    lines[7] = ",3,red"  # no label
    lines[9] = "cheap,3,blue"  # text for a regression target
    path = tmp_path / "prices.csv"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "ds"
    line = one_error_line(*etl("--source", f"csv:{path}", "--out", out, "--shards", 1, "--label", "price",
                               "--target", "regression", "--categorical", "color")[::2])
    assert line.startswith(f"mpitrain etl: error: csv:{path}: 2 of 40 records are bad, more than --max-bad-fraction 0 "
                           "allows; the first: ")
    assert f"{path}: label missing at record ',3,red', expected a finite number (column 'price')" in line
    assert f"{path}: label 'cheap' at record 'cheap,3,blue', expected a finite number (column 'price')" in line
    assert siblings(out) == []

    lines[7], lines[9] = "1,3,red", "2,3,blue"  # 2: not a binary outcome
    path.write_text("\n".join(f"{i % 2}{line[line.index(','):]}" if 0 < i and i not in (7, 9) else line
                              for i, line in enumerate(lines)) + "\n")
    line = one_error_line(*etl("--source", f"csv:{path}", "--out", out, "--shards", 1, "--label", "price",
                               "--target", "binary", "--categorical", "color")[::2])
    assert line.startswith(f"mpitrain etl: error: csv:{path}: 1 of 40 records are bad")
    assert line.endswith(f"{path}: label 2.0 at record '2,3,blue', expected 0 or 1 (column 'price')")
    assert siblings(out) == []


def test_text_classes_of_a_csv_found_by_spark(etl, tmp_path):
    """A URL's columns are found by Spark when the job connects (a local path's before Spark starts); text labels
    get their classes from one pass over the label column of every split."""
    lines = ["size,color,shade"] + [f"{i % 5},{['red', 'blue', 'green'][i % 3]},{'dark' if i % 4 else ''}"
                                    for i in range(30)]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "test.csv").write_text("size,color,shade\n1,violet,dark\n2,red,\n")
    out = tmp_path / "ds"
    status, _, err = etl("--source", f"csv:file://{tmp_path / 'train.csv'}", "--test", f"file://{tmp_path / 'test.csv'}",
                         "--out", out, "--shards", 1, "--label", "color", "--categorical", "shade")
    assert status == 0, err[-3000:]
    manifest = read_manifest(str(out))
    assert (manifest.target, manifest.class_names) == ("class", ["blue", "green", "red", "violet"])
    assert manifest.label_counts == {"train": [10, 10, 10, 0], "test": [0, 0, 1, 1]}
    assert manifest.columns["categorical"] == [{"name": "shade", "ids": 3, "vocabulary": ["dark"], "min_count": 1}]
    x, y = read_split(out, "test")
    assert sorted(zip(y.tolist(), x.columns["categorical"][:, 0].tolist())) == [(2, 0), (3, 2)]  # red: shade missing; violet: dark
    status, _, err = etl("--source", f"csv:file://{tmp_path / 'train.csv'}", "--out", tmp_path / "other", "--shards", 1,
                         "--label", "hue")
    assert one_error_line(status, err).startswith("mpitrain etl: error: --label hue: no column 'hue' in csv:file://")
