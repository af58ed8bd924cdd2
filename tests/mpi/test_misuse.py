"""Misuse never costs a user their results: each case builds its bad input in a folder of its own, runs the
command under `mpiexec -n 2` (or alone, for single-process commands), and asserts exit 2, one error line and
no traceback, a quick exit, and that every file that existed before is byte for byte unchanged."""
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mpitrain.data.shards import Manifest, shard_path, write_manifest, write_shard
from mpitrain.rundir.directory import RunDir
from mpitrain.testing.datasets import flip_a_byte_in_a_chunk, make_dataset, write_config
from mpitrain.testing.launch import MPIEXEC, MPITRAIN, command, mpiexec
from mpitrain.testing.outcomes import file_digests as checksums
from mpitrain.testing.outcomes import one_error_line

SMALL = {"train": {"epochs": 1, "batch_size": 16, "seed": 1, "log_every": 10}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A dataset and a run trained on it for one epoch (SGD with momentum, ReLU), shared read-only by the cases."""
    folder = tmp_path_factory.mktemp("trained")
    make_dataset(folder / "data", n_train=320, n_test=64)
    config = write_config(folder / "exp.yaml", folder / "data", **SMALL)
    result = mpiexec(2, MPITRAIN, "train", config)
    assert result.returncode == 0, result.stderr
    return folder


def copy_run(trained: Path, case: Path) -> Path:
    """The trained run copied into the case's folder (its config.yaml still names the original)."""
    shutil.copytree(trained / "run", case / "run")
    return case / "run"


def config_for(trained: Path, case: Path, **sections) -> str:
    return write_config(case / "exp.yaml", trained / "data", **{**SMALL, "run_dir": str(case / "run"), **sections})


def resumed_as(**sections):
    """A config continuing the trained run (a copy of it) with `sections` changed."""
    def setup(trained, case):
        copy_run(trained, case)
        return ["train", config_for(trained, case, train={**SMALL["train"], "epochs": 2}, **sections)]
    return setup


def other_dataset(subcommand):
    def setup(trained, case):
        run = copy_run(trained, case)
        make_dataset(case / "data2", n_train=320, n_test=64, seed=7)  # a re-ETL: same shapes, other rows
        text = (run / "config.yaml").read_text().replace(str(trained / "data"), str(case / "data2"))
        (run / "config.yaml").write_text(text)
        return [subcommand, str(run)]
    return setup


def written(name: str, text: str):
    def setup(trained, case):
        (case / name).write_bytes(text.encode("latin-1") if isinstance(text, str) else text)
        return ["train", str(case / name)]
    return setup


def with_config(**sections):
    def setup(trained, case):
        return ["train", config_for(trained, case, **sections)]
    return setup


def huge_values_run(case: Path, exchange: str = "auto") -> list:
    """float32 features of 3e38 (finite, so the dataset is valid): the first forward pass overflows and the
    update is NaN; `sharing` (with `exchange`) must stop every rank, in its exchange, before a metrics window sees
    the loss."""
    rng = np.random.default_rng(0)
    splits = {}
    for split, n in (("train", 640), ("test", 16)):
        x, y = np.full((n, 4), 3e38, np.float32), rng.integers(0, 3, n).astype(np.int32)
        splits[split] = [write_shard(str(case / "data"), shard_path(split, 0), x, y)]
    write_manifest(str(case / "data"), Manifest(feature_shape=(4,), feature_dtype="float32", scale=1.0, offset=0.0,
                                                mean=0.0, std=1.0, num_classes=3, splits=splits,
                                                label_counts={"train": [1, 1, 1], "test": [1, 1, 1]}))
    return ["train", write_config(case / "exp.yaml", case / "data", run_dir=str(case / "run"),
                                  sync={"mode": "sharing", "exchange": exchange},
                                  data={"path": str(case / "data"), "normalize": False},
                                  train={**SMALL["train"], "log_every": 1000})]


def data_path_is_a_file(trained, case):
    (case / "data").write_text("not a dataset")
    return ["train", write_config(case / "exp.yaml", case / "data", run_dir=str(case / "run"), **SMALL)]


def corrupt_shard(verify: bool):
    """verify: a byte flipped inside a chunk (its Fletcher-32 checksum fails); else the shard cut short."""
    def setup(trained, case):
        shutil.copytree(trained / "data", case / "data")
        shard = case / "data" / "train" / "shard-00001.h5"
        if verify:
            flip_a_byte_in_a_chunk(shard)
        else:
            shard.write_bytes(shard.read_bytes()[:100])
        return ["train", write_config(case / "exp.yaml", case / "data", run_dir=str(case / "run"),
                                      data={"path": str(case / "data"), "verify_checksums": verify}, **SMALL)]
    return setup


def shard_is_a_named_pipe(trained, case):
    """A shard replaced by a FIFO: reading it would wait for a writer, on every rank, with no end (seen: `train` and
    `info` hung until killed)."""
    shutil.copytree(trained / "data", case / "data")
    (case / "data" / "train" / "shard-00001.h5").unlink()
    os.mkfifo(case / "data" / "train" / "shard-00001.h5")
    return ["train", write_config(case / "exp.yaml", case / "data", run_dir=str(case / "run"), **SMALL)]


def run_dir_is_a_file(trained, case):
    (case / "run").write_text("a file where the run directory should be")
    return ["train", config_for(trained, case)]


def run_dir_is_a_dangling_link(parent: bool):
    """run_dir (or, `parent`, the folder above it) a symbolic link to a folder not made yet: a scratch space's."""
    def setup(trained, case):
        (case / "scratch").symlink_to(case / "not-made-yet")
        return ["train", config_for(trained, case, run_dir=str(case / ("scratch/run" if parent else "scratch")))]
    return setup


def run_dir_in_the_dataset(inside: str):
    """run_dir the dataset's folder (`inside` ""), or a folder in it: before, training wrote its files among the
    shards, where the ETL's --overwrite of the dataset would delete them with it."""
    def setup(trained, case):
        shutil.copytree(trained / "data", case / "data")
        return ["train", write_config(case / "exp.yaml", case / "data", run_dir=str(case / "data" / inside), **SMALL)]
    return setup


def with_set(*overrides):
    def setup(trained, case):
        return ["train", config_for(trained, case), *[part for o in overrides for part in ("--set", o)]]
    return setup


def eval_with(*args):
    def setup(trained, case):
        return [args[0], str(copy_run(trained, case)), *args[1:]]
    return setup


def predict_into_a_folder(trained, case):
    (case / "out.h5").mkdir()
    return ["predict", str(copy_run(trained, case)), "--out", str(case / "out.h5")]


CASES = [
    # wrong results reported as success
    ("eval-after-re-etl", other_dataset("eval"), "trained on a dataset whose manifest.json had sha256"),
    ("predict-after-re-etl", other_dataset("predict"), "take --allow-other-dataset to use it anyway"),
    ("resume-as-rmsprop", resumed_as(optimizer={"type": "rmsprop", "lr": 0.01}),
     "was trained with optimizer.type sgd, this config has rmsprop"),
    ("resume-as-adagrad", resumed_as(optimizer={"type": "adagrad", "lr": 0.01}), "optimizer.type sgd"),
    ("resume-with-tanh", resumed_as(model={"layers": [{"type": "dense", "units": 16, "activation": "tanh"},
                                                      {"type": "dense", "units": 3}]}),
     "its layer 1 is relu, this config's is tanh"),
    ("zero-units", with_config(model={"layers": [{"type": "dense", "units": 0}, {"type": "dense", "units": 3}]}),
     r"model.layers\[0\].units is 0, expected an integer in \[1, 16777216\]"),
    ("dropout-rate-1", with_config(model={"layers": [{"type": "dense", "units": 8}, {"type": "dropout", "rate": 1},
                                                     {"type": "dense", "units": 3}]}),
     r"model.layers\[1\].rate is 1, expected a number in \[0, 1\)"),
    ("conv-stride-0", with_config(model={"layers": [{"type": "conv2d", "filters": 2, "kernel": 3, "stride": 0},
                                                    {"type": "flatten"}, {"type": "dense", "units": 3}]}),
     r"model.layers\[0\].stride is 0"),
    ("batchnorm-momentum", with_config(model={"layers": [{"type": "batchnorm", "momentum": 1.5},
                                                         {"type": "dense", "units": 3}]}),
     r"model.layers\[0\].momentum is 1.5"),
    ("lr-inf", with_config(optimizer={"type": "sgd", "lr": float("inf")}),
     r"optimizer.lr is inf, expected a finite number"),
    ("units-1e9", with_config(model={"layers": [{"type": "dense", "units": 10**9}, {"type": "dense", "units": 3}]}),
     r"model.layers\[0\].units is 1000000000, expected an integer in \[1, 16777216\]"),
    ("model-beyond-memory", with_config(model={"layers": [{"type": "dense", "units": 2**24},
                                                          {"type": "dense", "units": 2**24},
                                                          {"type": "dense", "units": 3}]}),
     r"model.layers: the model needs about [0-9,]+ bytes per rank .*expected at most the [0-9,]+ bytes a rank has"),
    ("sharing-diverges", lambda trained, case: huge_values_run(case), "training diverged: the update of rank [01] "
                                                                      "holds NaN after [0-9]+ sharing steps"),
    ("sharing-split-diverges", lambda trained, case: huge_values_run(case, "split"),
     "training diverged: the update of rank [01] holds NaN after [0-9]+ sharing steps"),
    # one line, exit 2, on every rank
    ("config-is-a-folder", lambda trained, case: ["train", str(case)], "is a folder; expected a YAML config file"),
    ("config-is-binary", written("exp.yaml", "\x00\x01\xff\xfe" * 64), "expected a YAML config file|not valid YAML"),
    ("duplicate-section", written("exp.yaml", "data: {path: d}\nmodel: {layers: [{type: dense, units: 3}]}\n"
                                              "train: {epochs: 1}\ntrain: {epochs: 5}\n"),
     "'train' appears twice"),
    ("yaml-tab", written("exp.yaml", "data: {path: d}\ntrain:\n\tepochs: 2\n"),
     r"exp.yaml:3:1: not valid YAML: found character '\\t' that cannot start any token \(YAML indents with spaces"),
    ("set-unclosed", with_set("x=["), r"--set x=\[: at character 2 of the value: not valid YAML: expected the node"),
    ("set-unknown-key", with_set("epochs=3"), r"--set epochs=3: unknown key 'epochs'; did you mean 'train.epochs'\?"),
    ("set-bad-value", with_set("train.seed=2", "train.epochs=0"), r"--set train.epochs=0: train.epochs is 0, expected"),
    ("data-path-is-a-file", data_path_is_a_file, "is a file; expected a dataset folder"),
    ("corrupt-shard", corrupt_shard(True), "could not be read .*; the chunk fails its checksum"),
    ("unreadable-shard", corrupt_shard(False), "not a readable shard"),
    ("shard-is-a-named-pipe", shard_is_a_named_pipe, r"data/train/shard-00001.h5: is a named pipe \(FIFO\), not a file; "
                                                     "expected the dataset's file written by mpitrain etl"),
    ("run-dir-in-the-dataset", run_dir_in_the_dataset("train/run"),
     r"data/train/run: is inside the dataset folder \S+/data; expected a run_dir outside every dataset"),
    ("run-dir-is-the-dataset", run_dir_in_the_dataset(""), r"data/?: is the dataset folder; expected a run_dir outside"),
    ("run-dir-is-a-file", run_dir_is_a_file, "expected a folder this job can write"),
    ("run-dir-dangling-link", run_dir_is_a_dangling_link(False), r"scratch: it is a symbolic link to \S+/not-made-yet, "
                                                                 "which leads nowhere"),
    ("run-dir-in-a-dangling-link", run_dir_is_a_dangling_link(True),
     r"scratch/run: \S+/scratch is a symbolic link to \S+/not-made-yet, which leads nowhere"),
    ("eval-negative-batch", eval_with("eval", "--batch-size", "-5"), "--batch-size is -5, expected an integer >= 1"),
    ("eval-no-run-dir", lambda trained, case: ["eval", str(case / "nowhere")], "no such run directory"),
    ("predict-out-is-a-folder", predict_into_a_folder, "is a folder; expected an HDF5 file path"),
]


def run_case(command_args, ranks: int = 2, timeout: float = 90):
    started = time.monotonic()
    if ranks:
        result = mpiexec(ranks, MPITRAIN, *command_args, timeout=timeout)
    else:
        result = command(MPITRAIN, *command_args, timeout=timeout)
    return result, time.monotonic() - started


def assert_one_line_error(result, elapsed: float, pattern: str) -> None:
    assert re.search(pattern, one_error_line(result, elapsed)), result.stderr


@pytest.mark.parametrize("name, setup, pattern", CASES, ids=[c[0] for c in CASES])
def test_misuse_is_one_line_exit_2_and_changes_no_file(trained, tmp_path, name, setup, pattern):
    args = setup(trained, tmp_path)
    before, trained_before = checksums(tmp_path), checksums(trained)
    result, elapsed = run_case(args)
    assert_one_line_error(result, elapsed, pattern)
    after = checksums(tmp_path)
    assert {path: after.get(path) for path in before} == before
    assert checksums(trained) == trained_before


def test_eval_of_another_dataset_when_allowed_says_so_in_its_output(trained, tmp_path):
    args = other_dataset("eval")(trained, tmp_path)
    result, _ = run_case([*args, "--allow-other-dataset"])
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "run" / "eval-test.json").read_text())
    assert record["other_dataset"] is True and record["dataset"] == str(tmp_path / "data2")
    assert record["trained_on_manifest_sha256"] != record["manifest_sha256"]


def test_info_on_a_corrupt_shard_is_one_line(trained, tmp_path):
    corrupt_shard(False)(trained, tmp_path)
    result, elapsed = run_case(["info", str(tmp_path / "data"), "--no-verify"], ranks=0)
    assert_one_line_error(result, elapsed, "not a readable shard")


def test_a_copied_run_directory_trains_itself_not_the_original(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    original = checksums(trained)
    result, _ = run_case(["train", str(run / "config.yaml"), "--set", "train.epochs=2"])
    assert result.returncode == 0, result.stderr
    assert checksums(trained) == original
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2
    assert yaml.safe_load((run / "config.yaml").read_text())["run_dir"] == str(run)
    assert "ignored:" not in result.stderr  # nothing the tool wrote into config.yaml is reported as ignored


def test_a_finished_run_asked_to_train_again_says_so_and_leaves_its_files(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    before = checksums(run)
    result, _ = run_case(["train", str(run / "config.yaml")])
    assert result.returncode == 0, result.stderr
    assert "is finished: 1 epochs trained, train.epochs is 1" in result.stderr
    assert checksums(run) == before


def test_options_of_another_sync_mode_are_reported_once_as_ignored(trained, tmp_path):
    config = config_for(trained, tmp_path, sync={"mode": "allreduce", "threshold": 0.01, "frequency": 3})
    result, _ = run_case(["train", config])
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("ignored: sync.threshold (read by sharing only") == 1
    assert result.stderr.count("ignored: sync.frequency (read by averaging only") == 1


def test_a_second_job_on_a_run_directory_is_refused_naming_the_first(trained, tmp_path):
    config = config_for(trained, tmp_path, train={**SMALL["train"], "epochs": 150}, checkpoint={"every": 50})
    first = subprocess.Popen([MPIEXEC, "-n", "2", MPITRAIN, "train", config], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        lock = Path(RunDir(str(tmp_path / "run")).lock)
        while not (lock.exists() and lock.read_text().startswith("host")) and time.monotonic() < deadline:
            time.sleep(0.1)
        result, elapsed = run_case(["train", config])
        assert_one_line_error(result, elapsed, r"run: in use by another job \(host \S+ pid \d+\)")
        assert first.poll() is None  # the first job was not disturbed
    finally:
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    windows = [(r["epoch"], r["step"]) for r in records if r["kind"] == "window"]
    assert windows == sorted(set(windows))  # one job's records, in order, none twice


@pytest.mark.parametrize("closed", [(2,), (0, 1, 2)], ids=["stderr", "all-three"])
def test_a_job_started_with_its_standard_streams_closed_trains(trained, tmp_path, closed):
    """`mpitrain train ... 2>&-` (a daemon's closed descriptors): before, Python's sys.stderr was None, the first
    look at it raised, and the job ended with exit 1, nothing trained and nowhere to say why."""
    config = config_for(trained, tmp_path)
    result = subprocess.run([MPITRAIN, "train", config], preexec_fn=lambda: [os.close(fd) for fd in closed],
                            timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["epochs"] == 1


def test_resuming_on_another_rank_count_keeps_the_earlier_records(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    before = (run / "metrics.jsonl").read_text().splitlines()
    result = command(MPITRAIN, "train", str(run / "config.yaml"), "--set", "train.epochs=2", timeout=120)
    assert result.returncode == 0, result.stderr
    after = (run / "metrics.jsonl").read_text().splitlines()
    assert after[:len(before)] == before and len(after) > len(before)


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_good_checkpoints(trained, tmp_path,
                                                                                    small_disks):
    disk = small_disks.mount(tmp_path / "disk")
    wide = {"layers": [{"type": "dense", "units": 2250, "activation": "relu"}, {"type": "dense", "units": 3}]}
    config = write_config(tmp_path / "exp.yaml", trained / "data", model=wide, run_dir=str(disk / "run"),
                          train={**SMALL["train"], "epochs": 3}, checkpoint={"keep": 3})  # 0.34 MB a checkpoint
    result, elapsed = run_case(["train", config])
    assert_one_line_error(result, elapsed, r"run/checkpoints/ckpt-0003-000000.h5: No space left on device while "
                                           r"writing it \(it needs about 0.\d MB, 0.\d MB free\); the partial file "
                                           "is removed")
    names = sorted(os.listdir(disk / "run" / "checkpoints"))
    assert names == ["ckpt-0001-000000.h5", "ckpt-0002-000000.h5"]  # no partial file; the good ones intact
    resumed = command(MPITRAIN, "eval", disk / "run", timeout=120)
    assert resumed.returncode == 0 and "ckpt-0002-000000.h5" in resumed.stdout, resumed.stderr


def test_a_read_only_run_directory_is_one_line(trained, tmp_path, small_disks):
    disk = small_disks.mount(tmp_path / "disk", "ro")
    result, elapsed = run_case(["train", config_for(trained, tmp_path, run_dir=str(disk / "run"))])
    assert_one_line_error(result, elapsed, r"disk/run: Read-only file system; expected a folder this job can write")


def test_ranks_of_different_configs_are_refused_at_once_naming_the_difference(trained, tmp_path):
    """One mpiexec starting ranks on two configs (MPMD, or a script passing its own --set per rank) refuses them
    before anything else, instead of the ranks waiting in different collectives until the watchdog (seen: 100% CPU
    for 30 minutes)."""
    configs = [write_config(tmp_path / f"{size}.yaml", trained / "data", **{
        **SMALL, "train": {**SMALL["train"], "batch_size": size}, "run_dir": str(tmp_path / "run")}) for size in (16, 32)]
    started = time.monotonic()
    result = command(MPIEXEC, "-n", 1, MPITRAIN, "train", configs[0], ":", "-n", 2, MPITRAIN, "train", configs[1],
                     timeout=60)
    assert_one_line_error(result, time.monotonic() - started, re.escape(
        "the ranks' configs differ: train.batch_size is 16 on rank 0 but 32 on ranks 1, 2; expected one config on "
        "every rank"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("variable, launcher", [("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
                                                ("PMI_SIZE", "an MPICH-family mpiexec")])
def test_another_mpis_launcher_is_refused_instead_of_n_lone_copies(trained, tmp_path, variable, launcher):
    """What each process of another MPI's launcher sees: a world of 1 rank, and the launcher's count."""
    started = time.monotonic()
    result = command(MPITRAIN, "train", config_for(trained, tmp_path), env={variable: "4"}, timeout=60)
    assert_one_line_error(result, time.monotonic() - started,
                          f"{launcher} started 4 processes, but each sees an MPI world of 1 rank: mpi4py runs on "
                          "another MPI library")
    assert not (tmp_path / "run").exists()


# The commands that write a file the user names, and the ranks they run on (0: one process, no mpiexec).
WRITERS = {"predict": 2, "export": 0, "report": 0}


def an_existing_output(command: str, case: Path) -> tuple[Path, Path]:
    """(the --out to give, the file already there): a file of the user's, or for report a folder holding one."""
    if command == "report":
        (case / "mine").mkdir()
        return case / "mine", case / "mine" / "report.png"
    out = case / ("model.onnx" if command == "export" else "predictions.h5")
    return out, out


@pytest.mark.parametrize("command", WRITERS)
def test_an_existing_out_is_refused_and_replaced_only_with_overwrite(trained, tmp_path, command):
    run = copy_run(trained, tmp_path)
    out, existing = an_existing_output(command, tmp_path)
    existing.write_bytes(b"the user's results")
    before = checksums(tmp_path)
    result, elapsed = run_case([command, str(run), "--out", str(out)], WRITERS[command])
    assert_one_line_error(result, elapsed, f"{existing}: exists; pass --overwrite to replace it")
    assert checksums(tmp_path) == before
    result, _ = run_case([command, str(run), "--out", str(out), "--overwrite"], WRITERS[command])
    assert result.returncode == 0, result.stderr
    assert existing.read_bytes() != b"the user's results"
    assert not [p for p in tmp_path.rglob("*.tmp")]  # written under a temporary name, then renamed


def inside(place: str, command: str, run: Path, case: Path) -> Path:
    """An --out in the run's checkpoints/ (the newest checkpoint itself, for a file) or in a dataset folder."""
    if place == "checkpoints":
        newest = sorted((run / "checkpoints").glob("ckpt-*.h5"))[-1]
        return newest.parent if command == "report" else newest
    make_dataset(case / "data", n_train=32, n_test=16)
    return case / "data" if command == "report" else case / "data" / "train" / "predictions.h5"


@pytest.mark.parametrize("command", WRITERS)
@pytest.mark.parametrize("place, pattern", [("checkpoints", "is inside the run's checkpoints folder .*/checkpoints; "
                                                            "write it elsewhere"),
                                            ("dataset", "is inside the dataset folder .*/data; write it elsewhere")])
def test_out_in_a_runs_checkpoints_or_a_dataset_is_refused_even_with_overwrite(trained, tmp_path, command, place,
                                                                                pattern):
    run = copy_run(trained, tmp_path)
    out = inside(place, command, run, tmp_path)
    before = checksums(tmp_path)
    result, elapsed = run_case([command, str(run), "--out", str(out), "--overwrite"], WRITERS[command])
    assert_one_line_error(result, elapsed, pattern)
    assert checksums(tmp_path) == before


def test_predict_without_out_replaces_its_own_default_file(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    for _ in range(2):
        result, _ = run_case(["predict", str(run)])
        assert result.returncode == 0, result.stderr
    assert (run / "predictions-test.h5").is_file()


def test_report_out_an_existing_file_is_one_line_and_leaves_it(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    (tmp_path / "notes.txt").write_text("the user's notes")
    before = checksums(tmp_path)
    result, elapsed = run_case(["report", str(run), "--out", str(tmp_path / "notes.txt"), "--overwrite"], ranks=0)
    assert_one_line_error(result, elapsed, "notes.txt: is a file; expected a folder to write report.png and "
                                           "report.html into")
    assert checksums(tmp_path) == before
