"""The ETL's and scoring's refusals that come before Spark starts: each is exit 2, one line on stderr naming the
option, file or folder and what was expected, no traceback, and leaves every file as it was. An option a message
advises exists in that command's parser. (The checks that need Spark: tests/system/test_etl_sources.py.)"""
import argparse
import ast
import hashlib
import pathlib
import re

import pytest

from mpitrain.cli import _parser
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, REPO, command


def parser_options(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """{command: its --options} of the mpitrain parser and its subcommands."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = {o for a in sub._actions for o in a.option_strings if o.startswith("--")}
    return found


OPTIONS = parser_options(_parser())
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def checksums(folder: pathlib.Path) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(folder: pathlib.Path, subcommand: str, *args, pattern: str) -> str:
    """Run `mpitrain SUBCOMMAND ARGS` and assert the refusal: exit 2, one line matching `pattern`, no traceback, every
    file under `folder` unchanged and nothing new, and every --option the line names one that SUBCOMMAND takes."""
    before = checksums(folder)
    result = command(MPITRAIN, subcommand, *args, timeout=60)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and re.search(pattern, lines[0]), lines[0]
    assert set(OPTION.findall(lines[0])) <= OPTIONS[subcommand], lines[0]
    assert checksums(folder) == before
    return lines[0]


def csv_folder(folder: pathlib.Path, rows: int = 30) -> pathlib.Path:
    (folder / "csv").mkdir()
    (folder / "csv" / "part-0.csv").write_text("label,a,b\n" + "".join(f"{i % 3},{i},{i}\n" for i in range(rows)))
    return folder / "csv"


@pytest.mark.parametrize("option, value, domain", [
    ("--test-fraction", "1.5", r"a number in \[0, 1\)"), ("--test-fraction", "nan", r"a number in \[0, 1\)"),
    ("--validation-fraction", "1", r"a number in \[0, 1\)"), ("--max-bad-fraction", "-0.1", r"a number in \[0, 1\]"),
    ("--shards", "0", r"an integer in \[1, 1000000\]"), ("--seed", "-1", r"an integer in \[0, 1e18\]"),
    ("--num-classes", "-3", r"an integer in \[0, 16777216\]"), ("--threshold", "inf", r"a number in \[-1e30, 1e30\]"),
])
def test_a_number_out_of_its_range_is_refused_before_spark_naming_the_option(tmp_path, option, value, domain):
    source = csv_folder(tmp_path)
    args = {"--shards": "2", option: value}
    refused(tmp_path, "etl", "--source", f"csv:{source}", "--out", tmp_path / "out",
            *[part for item in args.items() for part in item],
            pattern=rf"^mpitrain etl: error: {option} {value}: expected {domain}$")


@pytest.mark.parametrize("where", ["inside", "same", "holds", "glob", "inside-glob"])
def test_an_out_the_job_would_read_as_its_own_data_is_refused_before_spark(tmp_path, where):
    source = csv_folder(tmp_path)
    spec, out, words = {
        "inside": (f"csv:{source}", source / "out", "lies inside the source folder"),
        "same": (f"csv:{source}", source, "is the source itself"),
        "holds": (f"csv:{source}", tmp_path, "holds the source"),
        "glob": (f"csv:{tmp_path}/*", tmp_path / "out", "lies in what the source.s pattern"),
        "inside-glob": (f"csv:{tmp_path}/c*", source / "out", "lies in what the source.s pattern"),
    }[where]
    refused(tmp_path, "etl", "--source", spec, "--out", out, "--shards", "2", "--overwrite",
            pattern=rf"^mpitrain etl: error: --out {re.escape(str(out))}: {words}")


def test_an_out_beside_the_source_is_not_refused(tmp_path):
    from mpitrain.etl.output import check_apart
    (tmp_path / "csv").mkdir()
    for source in (tmp_path / "csv", tmp_path / "csv" / "part-*.csv", tmp_path / "*.parquet", tmp_path / "c*"):
        check_apart(str(tmp_path / "ds"), [str(source)], "etl")


@pytest.mark.parametrize("header, words", [(True, "only a header line"), (False, "empty")])
def test_a_csv_without_data_rows_says_so_naming_the_file(tmp_path, header, words):
    (tmp_path / "head.csv").write_text("label,a,b\n\n" if header else "\n")
    refused(tmp_path, "etl", "--source", f"csv:{tmp_path / 'head.csv'}", "--out", tmp_path / "out", "--shards", "1",
            *([] if header else ["--no-header"]),
            pattern=rf"^mpitrain etl: error: {re.escape(str(tmp_path / 'head.csv'))}: no data rows \({words}\)")


def test_a_csv_test_split_without_data_rows_says_so(tmp_path):
    source = csv_folder(tmp_path)
    (tmp_path / "test.csv").write_text("label,a,b\n")
    refused(tmp_path, "etl", "--source", f"csv:{source}", "--test", tmp_path / "test.csv", "--out", tmp_path / "out",
            "--shards", "1", pattern=r"test.csv: no data rows \(only a header line\)")


def test_a_parquet_source_without_records_says_so_naming_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"label": pa.array([], pa.int64()), "a": pa.array([], pa.float64())}),
                   tmp_path / "empty.parquet")
    refused(tmp_path, "etl", "--source", f"parquet:{tmp_path / 'empty.parquet'}", "--out", tmp_path / "out",
            "--shards", "1", pattern=rf"{re.escape(str(tmp_path / 'empty.parquet'))}: no data rows; expected Parquet")


def foreign_onnx(path: pathlib.Path) -> None:
    """An ONNX model another tool wrote: 64 inputs to 64 outputs, no mpitrain metadata."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=1)], "foreign",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_score_refuses_a_model_that_is_not_an_mpitrain_export(tmp_path):
    foreign_onnx(tmp_path / "foreign.onnx")
    (tmp_path / "new.csv").write_text("".join(",".join(["1"] * 65) + "\n" for _ in range(4)))
    refused(tmp_path, "score", "--model", tmp_path / "foreign.onnx", "--source", f"csv:{tmp_path / 'new.csv'}",
            "--out", tmp_path / "out", pattern=rf"--model {re.escape(str(tmp_path / 'foreign.onnx'))}: not an "
                                               "mpitrain export")


def test_score_of_a_run_without_checkpoints_advises_only_its_own_options(tmp_path):
    make_dataset(tmp_path / "data", n_train=60, n_test=20)
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(pathlib.Path(config).read_text())
    refused(tmp_path, "score", "--model", tmp_path / "run", "--source", "digits:", "--out", tmp_path / "out",
            pattern=r"run/checkpoints: no checkpoint; train the run first$")


def test_score_checks_its_out_and_fraction_like_the_etl(tmp_path):
    source = csv_folder(tmp_path)
    foreign_onnx(tmp_path / "m.onnx")
    refused(tmp_path, "score", "--model", tmp_path / "m.onnx", "--source", f"csv:{source}", "--out", source / "p",
            pattern="lies inside the source folder")
    refused(tmp_path, "score", "--model", tmp_path / "m.onnx", "--source", f"csv:{source}", "--out", tmp_path / "p",
            "--max-bad-fraction", "2", pattern=r"--max-bad-fraction 2: expected a number in \[0, 1\]$")


def test_every_option_an_error_message_names_exists():
    """Each --option in the text of a raised error, anywhere in mpitrain/ and etl/, is one some command takes."""
    known = set().union(*OPTIONS.values())
    unknown = []
    for path in sorted(pathlib.Path(REPO, "mpitrain").rglob("*.py")) + sorted(pathlib.Path(REPO, "etl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                texts = [n.value for n in ast.walk(node.exc) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
                unknown += [f"{path.name}:{node.lineno} {option}" for text in texts for option in OPTION.findall(text)
                            if option not in known]
    assert unknown == []
