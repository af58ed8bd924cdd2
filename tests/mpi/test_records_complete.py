"""A run's records are complete or clearly not. A full disk at a write of a run (metrics.jsonl, summary.json, the
report, eval's and predict's outputs) is one line on every rank, leaves no partial file, and keeps the records and
checkpoints written before it. A failure after the last step says what is saved and what is not, and `mpitrain
train` on the run again writes only the missing records, without training.

Each disk is a real tmpfs, made full at the moment of the write (`mpitrain.testing.small_disks`): of pages for
files that grow (metrics.jsonl's records), of inodes (no file can be created) for summary.json and the report,
which a page holds. A full disk while checkpointing: tests/mpi/test_misuse.py."""
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, command, mpiexec
from mpitrain.testing.outcomes import file_digests, one_error_line
from mpitrain.testing.small_disks import FILLER, fill, free_space, limit_files

TRAIN = {"epochs": 1, "batch_size": 16, "seed": 1, "log_every": 1}  # 10 steps an epoch on 2 ranks, a record each


@pytest.fixture(scope="module")
def first_epoch(tmp_path_factory) -> Path:
    """A dataset, and a run of it trained for one epoch of two (copied onto each case's disk)."""
    folder = tmp_path_factory.mktemp("first_epoch")
    make_dataset(folder / "data", n_train=320, n_test=64)
    result = mpiexec(2, MPITRAIN, "train", write_config(folder / "exp.yaml", folder / "data", train=TRAIN))
    assert result.returncode == 0, result.stderr
    return folder


def on_disk(first_epoch: Path, disk: Path) -> str:
    """The first epoch's run copied onto `disk`, and the config that trains its second epoch there, drawing the
    report at the end (the tests' configs leave it out otherwise)."""
    shutil.copytree(first_epoch / "run", disk / "run")
    return write_config(disk.parent / "exp.yaml", first_epoch / "data", run_dir=str(disk / "run"),
                        train={**TRAIN, "epochs": 2}, report=True)


def train(config: str, ranks: int = 2):
    started = time.monotonic()
    result = mpiexec(ranks, MPITRAIN, "train", config, timeout=120)
    return result, time.monotonic() - started


def checkpoints(run: Path) -> dict:
    return {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}


def assert_nothing_partial(disk: Path) -> None:
    assert not list(disk.rglob("*.tmp")), sorted(disk.rglob("*"))


def trained_again(disk: Path, config: str, says: str) -> tuple[dict, dict]:
    """After a failure: nothing partial on `disk`; the run's files, then (inodes to spare) `mpitrain train` on the
    run again, which ends well saying `says`, and the run's files after it."""
    assert_nothing_partial(disk)
    trained = file_digests(disk / "run", skip=(FILLER,))
    limit_files(disk, more=100)
    result, _ = train(config)
    assert result.returncode == 0 and says in result.stderr, result.stderr
    return trained, file_digests(disk / "run", skip=(FILLER,))


def test_a_full_disk_while_appending_a_metrics_record_keeps_every_whole_record_and_the_checkpoint(
        first_epoch, tmp_path, small_disks):
    disk = small_disks.mount(tmp_path / "disk", size="2m")
    config = on_disk(first_epoch, disk)
    run, saved = disk / "run", checkpoints(disk / "run")
    fill(disk, leave=1)  # config.yaml's new text (its run_dir, epochs) takes the page and gives the old one back;
    # the first record of epoch 2 that needs a page fails (TensorBoard's events stop with a warning)
    result, elapsed = train(config)
    assert re.search(r"run/metrics\.jsonl: No space left on device while appending a record; the file holds the "
                     r"records written before$", one_error_line(result, elapsed)), result.stderr
    text = (run / "metrics.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines()]  # every line whole
    assert text.endswith("\n") and any(r["kind"] == "window" and r["epoch"] == 1 for r in records)
    assert checkpoints(run) == saved  # epoch 1's checkpoint as it was, no partial one
    assert_nothing_partial(disk)

    free_space(disk)
    result, _ = train(config)  # resumes from epoch 1's checkpoint, dropping epoch 2's records, and finishes
    assert result.returncode == 0, result.stderr
    epochs = [r["epoch"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if r["kind"] == "epoch"]
    assert epochs == [0, 1]


def test_a_full_disk_at_the_summary_says_training_is_saved_and_train_again_writes_only_the_records(
        first_epoch, tmp_path, small_disks):
    disk = small_disks.mount(tmp_path / "disk", size="4m")
    config = on_disk(first_epoch, disk)
    run = disk / "run"
    limit_files(disk, more=2)  # TensorBoard's new event file and checkpoint 2; then no file can be created
    result, elapsed = train(config)
    line = one_error_line(result, elapsed)
    assert re.search(r"run/summary\.json: No space left on device while writing it \(no file can be created: all "
                     r"\d+ inodes of the file system are used\); training is complete and its final checkpoint "
                     r".*run/checkpoints/ckpt-0002-000000\.h5 is saved, summary\.json and the report not; once the "
                     r"cause is fixed, `mpitrain train` on this run again writes summary\.json and the report "
                     r"without training$", line), line
    assert json.loads((run / "summary.json").read_text())["final_checkpoint"] == "ckpt-0001-000000.h5"  # epoch 1's
    assert not (run / "report.png").exists()
    trained, after = trained_again(disk, config, "is finished but has no summary.json of its last checkpoint: "
                                                 "writing its missing records, without training")
    assert {name: after[name] for name in trained if name != "summary.json"} == \
        {name: digest for name, digest in trained.items() if name != "summary.json"}  # no step trained
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_checkpoint"] == "ckpt-0002-000000.h5"
    last_epoch = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                  if r["kind"] == "epoch"][-1]
    assert summary["steps_this_job"] == 0 and summary["test_accuracy"] == last_epoch["test_accuracy"]
    assert (run / "report.png").stat().st_size > 0 and (run / "report.html").stat().st_size > 0


def test_a_full_disk_at_the_report_keeps_the_summary_and_train_again_draws_only_the_report(
        first_epoch, tmp_path, small_disks):
    disk = small_disks.mount(tmp_path / "disk", size="4m")
    config = on_disk(first_epoch, disk)
    run = disk / "run"
    limit_files(disk, more=3)  # the event file, checkpoint 2, summary.json's new file (the old one's is given back)
    result, elapsed = train(config)  # and report.png: report.html is the file that cannot be created
    line = one_error_line(result, elapsed)
    assert re.search(r"run/report\.html: No space left on device while writing it \(no file can be created: .*\); "
                     r"training is complete and its final checkpoint .*ckpt-0002-000000\.h5 and summary\.json are "
                     r"saved, the report not; once the cause is fixed, `mpitrain train` on this run again writes "
                     r"the report without training$", line), line
    assert json.loads((run / "summary.json").read_text())["steps_this_job"] == 10
    assert not (run / "report.html").exists()
    trained, after = trained_again(disk, config, "is finished but has no report: drawing it, without training")
    assert {name: after[name] for name in trained if name != "report.png"} == \
        {name: digest for name, digest in trained.items() if name != "report.png"}  # the summary too
    assert "report.html" in after


@pytest.mark.parametrize("subcommand, written", [("eval", r"(eval-test\.json|[a-z_-]+-test\.png)"),
                                                 ("predict", r"predictions-test\.h5")])
def test_a_full_disk_at_eval_or_predict_is_one_line_and_changes_nothing(first_epoch, tmp_path, small_disks, subcommand,
                                                                       written):
    disk = small_disks.mount(tmp_path / "disk", size="2m")
    shutil.copytree(first_epoch / "run", disk / "run")
    fill(disk)
    before = file_digests(disk, skip=(FILLER,))
    started = time.monotonic()
    result = mpiexec(2, MPITRAIN, subcommand, disk / "run", timeout=120)
    line = one_error_line(result, time.monotonic() - started)
    assert re.search(rf"run/{written}: No space left on device while writing it", line), line
    assert file_digests(disk, skip=(FILLER,)) == before
    assert_nothing_partial(disk)
    free_space(disk)
    assert command(MPITRAIN, subcommand, disk / "run", timeout=120).returncode == 0  # the run itself is intact
