"""mpitrain's command line in this process (mpitrain/cli.py): the parser refuses what it does not know with exit 2,
a user's error is one line and exit 2, and `info` describes a dataset and checks its shards. The commands that start
ranks are the mpi layer's (tests/mpi/test_misuse.py)."""
from __future__ import annotations

import logging
import signal

import pytest

from mpitrain.cli import main
from mpitrain.testing.datasets import make_dataset
from mpitrain.training.preemption import SIGNALS


@pytest.fixture(autouse=True)
def process_state():
    """main() installs mpitrain's stop handlers (and gives the defaults back) and sets mpitrain's log level: the
    test process gets its own back afterwards."""
    saved, level = {number: signal.getsignal(number) for number in SIGNALS}, logging.getLogger("mpitrain").level
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)
    logging.getLogger("mpitrain").setLevel(level)


def test_a_command_it_does_not_know_is_refused_with_exit_2(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["frobnicate"])
    assert ended.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_a_missing_argument_is_refused_with_exit_2(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["export", "runs/x"])
    assert ended.value.code == 2
    assert "the following arguments are required: --out" in capsys.readouterr().err


def test_info_describes_a_dataset_and_verifies_its_shards(tmp_path, capsys):
    make_dataset(tmp_path / "data", n_train=60, n_test=20, shards=2)
    assert main(["info", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert "train: 60 rows in 2 shards" in out and "test: 20 rows in 2 shards" in out
    assert out.rstrip().endswith("all shards present and well-formed, checksums verified")


@pytest.mark.parametrize("command, expected", [
    (["info", "{tmp}/nowhere"], "mpitrain info: error: {tmp}/nowhere/manifest.json: no such file; expected a dataset "
                                "folder written by `mpitrain etl`"),
    (["export", "{tmp}", "--out", "{tmp}/model.onnx"], "mpitrain export: error: {tmp}/checkpoints: no checkpoint; "
                                                       "train the run first"),
])
def test_a_users_error_is_one_line_and_exit_2(tmp_path, capsys, command, expected):
    assert main([part.format(tmp=tmp_path) for part in command]) == 2
    err = capsys.readouterr().err
    assert err == expected.format(tmp=tmp_path) + "\n"
    assert not (tmp_path / "model.onnx").exists()


def test_info_gives_a_regression_target_s_train_statistics(tmp_path, capsys):
    manifest = make_dataset(tmp_path / "data", n_train=60, n_test=20, shards=1, target="regression")
    assert main(["info", str(tmp_path / "data"), "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert (f"target regression (2 values: value, rest); train split's value mean {manifest.target_mean[0]:.6g} std "
            f"{manifest.target_std[0]:.6g}, rest mean {manifest.target_mean[1]:.6g}") in out


def test_a_rank_s_command_line_imports_no_spark_job_and_help_still_lists_every_command(capsys):
    """`mpitrain train` (what every rank runs) builds the Spark commands' options only when one is asked for."""
    import subprocess
    import sys
    code = ("import sys; from mpitrain.cli import _parser; _parser('train');"
            "print(sorted(m for m in sys.modules if m.startswith(('mpitrain.etl', 'mpitrain.spark'))));"
            "_parser(None); print('mpitrain.etl.job' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "True", out
    with pytest.raises(SystemExit):
        main(["etl", "--help"])  # the etl command's own options are there when it is asked for
    assert "--source SOURCE" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert all(command in listed for command in ("etl", "score", "spark-train", "train")), listed


@pytest.mark.parametrize("command, loaded", [("etl", "['numba']"), ("info", "[]")])
def test_a_command_that_trains_nothing_starts_without_mpi_or_the_training(tmp_path, command, loaded):
    """`mpitrain etl` (a Spark driver) and `mpitrain info` load neither mpi4py, whose import starts MPI, nor the
    training's modules to set their log; `info` not numba either (0.16 s of a start; the ETL's jobs run numba
    kernels). A refused etl took 0.87 s before, 0.45 s after (2026-12-07)."""
    import subprocess
    import sys
    code = ("import sys; from mpitrain.cli import main; status = main(sys.argv[1:]); "
            "print(status, sorted(m for m in ('numba', 'mpi4py.MPI', 'mpitrain.api') if m in sys.modules))")
    argv = {"etl": ["etl", "--source", f"csv:{tmp_path}", "--out", str(tmp_path / "out"), "--shards", "0"],
            "info": ["info", str(tmp_path)]}[command]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"2 {loaded}", done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
