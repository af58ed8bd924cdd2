"""Fixtures of the system tests that run `mpitrain etl` in this process."""
from __future__ import annotations

import contextlib

import pytest

from mpitrain import cli
from mpitrain.etl import cli as etl_cli


@pytest.fixture
def etl(spark, monkeypatch, capsys):
    """`mpitrain etl ARGS...` in this process, on the module's SparkSession: (exit status, stdout, stderr)."""
    monkeypatch.setattr(etl_cli, "spark_session", lambda master, name: contextlib.nullcontext(spark))

    def run(*args):
        status = cli.main(["etl", *map(str, args)])
        printed = capsys.readouterr()
        return status, printed.out, printed.err
    return run
