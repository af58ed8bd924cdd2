"""The ETL sources' registry (etl/sources/__init__.py): every source class of the folder is registered under its own
scheme, the command line's list and the messages follow from it, and a spec of no known form is refused naming
them all."""
from __future__ import annotations

import inspect

import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.etl import sources
from mpitrain.etl.sources import KNOWN_SOURCES, SOURCES, SourceOptions, open_source, schemes_that, source_kind
from mpitrain.etl.sources.base import RangeSource, Source
from mpitrain.etl.sources.table import TableSource

ABSTRACT = {Source, RangeSource, TableSource}


def test_every_source_class_is_registered_under_its_scheme():
    found = {obj for module in (sources.csv, sources.digits, sources.idx, sources.images, sources.parquet)
             for obj in vars(module).values()
             if inspect.isclass(obj) and issubclass(obj, Source) and obj not in ABSTRACT}
    assert found == set(SOURCES.values())
    assert all(scheme == kind.scheme and kind.usage.startswith(scheme + ":") for scheme, kind in SOURCES.items())
    assert KNOWN_SOURCES == tuple(kind.usage for kind in SOURCES.values())


def test_capabilities_in_words():
    assert schemes_that("tabular") == "csv and parquet" and schemes_that("tabular", "or") == "csv or parquet"
    assert schemes_that("unlabeled_records") == schemes_that("separate_test") == "csv, parquet and images"
    assert schemes_that("key_columns") == "parquet"
    assert source_kind("parquet:/data/x.parquet").typed_columns and not source_kind("csv:x.csv").typed_columns


@pytest.mark.parametrize("spec", ["nope:x", "digits:/folder", "csv:", "idx", ""])
def test_a_spec_of_no_known_form_names_every_form(spec):
    with pytest.raises(ConfigError) as refused:
        source_kind(spec)
    assert str(refused.value) == f"--source {spec!r}: expected one of: {'; '.join(KNOWN_SOURCES)}"


def test_a_separate_test_split_only_where_the_source_takes_one():
    with pytest.raises(ConfigError, match="--test t: only csv, parquet and images sources take a separate test split"):
        open_source("digits:", options=SourceOptions(test="t"))
    assert open_source("digits:").known_rows() == {"train": 1797}
