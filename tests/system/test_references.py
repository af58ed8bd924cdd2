"""Issue 28's reference results, each through the whole pipeline (a CSV the test writes, the ETL on the module's
Spark session, `mpiexec -n 2 mpitrain train`, scored by the training's own evaluation of its final model, which
`mpitrain eval` equals: tests/mpi/test_targets.py; benchmarks/tables.py runs eval itself) beside scikit-learn's
model fitted on the same split's rows: breast cancer AUC >= 0.99, wine accuracy >= 0.97, diabetes R² within 0.03
of least squares (Adam at lr 0.003, the target standardized by default), a multilabel table's macro AUC within
0.01 of one-vs-rest logistic regression."""
import argparse

import pytest

from mpitrain.etl.cli import add_arguments, plan_from_args
from mpitrain.etl.job import write_dataset
from mpitrain.testing.references import REFERENCES, run_reference


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_a_shipped_table_reaches_its_reference(tmp_path, spark, name):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    result = run_reference(name, tmp_path, lambda argv: write_dataset(spark, plan_from_args(parser.parse_args(argv))),
                           evaluate=False)
    assert result["met"], {key: result[key] for key in ("mpitrain", "reference", "goal", "splits")}
