"""ETL sources, chosen by the `--source` string `SCHEME:ARGUMENT`: one file of this folder per format, each a `Source`
(`base.py`) that says what it is and can do (`scheme`, `usage`, `separate_test`, `unlabeled_records`, `key_columns`,
`tabular`, `typed_columns`), registered in `SOURCES` below. A new format is one new file and its line here: the
command line's list (`KNOWN_SOURCES`), `open_source` and scoring's checks follow from the registry, and nothing
outside a source tests a scheme string.

    idx.py      idx:/folder      MNIST-format IDX files          digits.py   digits:          scikit-learn's digits
    csv.py      csv:PATH         CSV files (table.py: shared)    parquet.py  parquet:PATH     Parquet files
    images.py   images:/folder   class folders of images
"""
from __future__ import annotations

from mpitrain.base.errors import ConfigError
from mpitrain.etl.sources.base import Source, SourceOptions, carved_rows, source_paths
from mpitrain.etl.sources.csv import CsvSource
from mpitrain.etl.sources.digits import DigitsSource
from mpitrain.etl.sources.idx import IdxSource
from mpitrain.etl.sources.images import ImageFolderSource
from mpitrain.etl.sources.parquet import ParquetSource

SOURCES: dict[str, type[Source]] = {kind.scheme: kind for kind in (IdxSource, DigitsSource, CsvSource, ParquetSource,
                                                                     ImageFolderSource)}
KNOWN_SOURCES = tuple(kind.usage for kind in SOURCES.values())

__all__ = ["KNOWN_SOURCES", "SOURCES", "Source", "SourceOptions", "carved_rows", "open_source", "schemes_that",
           "source_kind", "source_paths"]


def source_kind(spec: str) -> type[Source]:
    """The class of `--source` `spec` (its capabilities, before it is opened); a spec of no known form is a
    ConfigError listing them."""
    scheme, _, argument = spec.partition(":")
    kind = SOURCES.get(scheme)
    if kind is None or bool(argument) != kind.takes_path:
        raise ConfigError(f"--source {spec!r}: expected one of: {'; '.join(KNOWN_SOURCES)}")
    return kind


def schemes_that(capability: str, conjunction: str = "and") -> str:
    """The schemes of the sources that have `capability` (a class attribute), in words: "csv, parquet and images"
    (`conjunction` "or": "csv or parquet")."""
    schemes = [scheme for scheme, kind in SOURCES.items() if getattr(kind, capability)]
    return f" {conjunction} ".join([", ".join(schemes[:-1]), schemes[-1]] if len(schemes) > 1 else schemes)


def open_source(spec: str, test_fraction: float = 0.2, options: SourceOptions = SourceOptions()) -> Source:
    """Parse `--source` and open it (headers validated, no rows read).

    A source without a test split whose rows are known has `test_fraction` checked here.
    """
    kind = source_kind(spec)
    if options.test and not kind.separate_test:
        raise ConfigError(f"--test {options.test}: only {schemes_that('separate_test')} sources take a separate test "
                          "split")
    source = kind.open(spec, spec.partition(":")[2], options)
    if "test" not in source.splits and source.known_rows():
        carved_rows("test", test_fraction, source.known_rows()["train"])
    return source
