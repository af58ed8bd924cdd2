"""A checkpoint keeps its meaning, and a refusal lasts (issue 29, classes 2, 4 and 5), under real `mpiexec -n 2`.

A resume that changes what gives a checkpoint's numbers their meaning (mid-epoch also the epoch's order) is refused
in one line naming the key; eval, predict and export of a checkpoint give what the run measured, whatever the run's
config.yaml says now; a run left with only damaged checkpoints refuses until `resume=never`, and a start from
scratch moves an earlier run's records aside instead of writing over them. Every refusal: exit 2, one error line,
no traceback, every file that existed byte for byte unchanged."""
import json
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, command, mpiexec
from mpitrain.testing.outcomes import file_digests as checksums

SECTIONS = {"train": {"epochs": 1, "batch_size": 16, "seed": 1, "log_every": 10},
            "checkpoint": {"unit": "step", "every": 4, "keep": 10}}  # 10 steps: checkpoints at steps 4, 8, the end


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A dataset, a config and a run trained on it for one epoch on 2 ranks (checkpoints at steps 4 and 8 and the
    epoch's end), shared read-only by the cases."""
    folder = tmp_path_factory.mktemp("record")
    make_dataset(folder / "data", n_train=320, n_test=64)
    config = write_config(folder / "exp.yaml", folder / "data", **SECTIONS)
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    assert result.returncode == 0, result.stderr
    return folder


def copy_run(trained: Path, case: Path, keep: tuple = ()) -> Path:
    """The trained run copied into `case` (with its own run_dir), holding only the checkpoints named in `keep`
    (all when empty), and the config that trains it, case/exp.yaml."""
    write_config(case / "exp.yaml", trained / "data", run_dir=str(case / "run"), **SECTIONS)
    shutil.copytree(trained / "run", case / "run")
    (case / "run" / "config.yaml").write_text((case / "run" / "config.yaml").read_text()
                                              .replace(str(trained / "run"), str(case / "run")))
    for path in (case / "run" / "checkpoints").iterdir():
        if keep and path.name not in keep:
            path.unlink()
    return case / "run"


def on_2_ranks(*args):
    """`mpiexec -n 2 ARGS...`, each rank's exit status read from its own line: `returncode` is the status both ranks
    ended with, -1 when they differ."""
    result = mpiexec(2, "sh", "-c", '"$@"; echo "rank exit status $?" >&2', "sh", *args, timeout=120)
    codes = set(re.findall(r"^rank exit status (\d+)$", result.stderr, re.MULTILINE))
    result.returncode = int(codes.pop()) if result.stderr.count("rank exit status") == 2 and len(codes) == 1 else -1
    return result


def train(case: Path, *overrides: str):
    """`mpitrain train case/exp.yaml --set OVERRIDE...` on 2 ranks."""
    return on_2_ranks(MPITRAIN, "train", case / "exp.yaml", *[f"--set={o}" for o in overrides])


def assert_refused_and_nothing_changed(result, before: dict, folder: Path, pattern: str) -> str:
    """Exit 2 on every rank, exactly one error line matching `pattern`, no traceback, and `folder` as it was; the
    error line."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and re.search(pattern, errors[0]), result.stderr
    assert checksums(folder) == before
    return errors[0]


MID_EPOCH = ("ckpt-0000-000004.h5",)
END_OF_EPOCH = ("ckpt-0001-000000.h5",)


@pytest.mark.parametrize("keep, override, pattern", [
    # what gives the numbers their meaning: refused from any checkpoint
    (END_OF_EPOCH, "data.normalize=false", "ckpt-0001-000000.h5: was trained with data.normalize true, this config "
                                           "has false; data.normalize gives the checkpoint's numbers their meaning "
                                           "and may not change on resume .*: set it back to true"),
    (MID_EPOCH, "model.dtype=float64", 'was trained with model.dtype "float32", this config has "float64"'),
    (END_OF_EPOCH, "model.loss_options={class_weights: [1, 2, 3]}",
     r"was trained with model.loss_options.class_weights unset, this config has \[1.0, 2.0, 3.0\]; .*: remove "
     "model.loss_options.class_weights, or"),
    # the epoch's order: refused mid-epoch (class 5: no silent skip of the epoch's rest)
    (MID_EPOCH, "train.batch_size=32", "ckpt-0000-000004.h5: stopped at step 4 of epoch 1 with a global batch of "
                                       r"32 rows; train.batch_size was 16, so this run's is 64 \(train.batch_size 32 "
                                       r"x 2 ranks\); .*resume with train.global_batch_size: 32"),
    (MID_EPOCH, "train.global_batch_size=64", "global batch of 32 rows; train.global_batch_size was 0, so this "
                                              r"run's is 64 \(train.global_batch_size 64\)"),
    (MID_EPOCH, "train.seed=5", "stopped at step 4 of epoch 1 with train.seed 1, this config has 5; train.seed sets "
                                "the epoch's order and may change only at an epoch's end"),
    (MID_EPOCH, "data.shuffle=false", "with data.shuffle true, this config has false"),
    (MID_EPOCH, "data.max_rows=160", "with data.max_rows 0, this config has 160"),
], ids=["normalize", "dtype", "loss-options", "batch-size", "global-batch", "seed", "shuffle", "max-rows"])
def test_a_resume_that_changes_what_the_checkpoint_means_is_refused_naming_the_key(trained, tmp_path, keep, override,
                                                                                   pattern):
    copy_run(trained, tmp_path, keep)
    before = checksums(tmp_path)
    result = train(tmp_path, "train.epochs=2", override)
    assert_refused_and_nothing_changed(result, before, tmp_path, pattern)


@pytest.mark.parametrize("keep, overrides", [(END_OF_EPOCH, ("train.batch_size=32", "train.seed=5")),
                                             (MID_EPOCH, ("optimizer.lr=0.01", "checkpoint.every=3"))],
                         ids=["order-at-an-epoch-end", "lr-mid-epoch"])
def test_what_may_change_on_resume_resumes(trained, tmp_path, keep, overrides):
    run_dir = copy_run(trained, tmp_path, keep)
    result = train(tmp_path, "train.epochs=2", *overrides)
    assert result.returncode == 0, result.stderr
    assert f"resuming from {run_dir / 'checkpoints' / keep[0]}" in result.stderr
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["epoch"] for record in epochs if record["kind"] == "epoch"] == [0, 1]


def test_eval_predict_and_export_of_a_checkpoint_use_its_own_config_not_todays(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    assert command(MPITRAIN, "export", run_dir, "--out", baseline / "model.onnx").returncode == 0
    assert on_2_ranks(MPITRAIN, "predict", run_dir, "--out", baseline / "predictions.h5").returncode == 0
    config = run_dir / "config.yaml"  # edited after the checkpoints: they were trained with normalized inputs
    config.write_text(config.read_text().replace("normalize: true", "normalize: false"))
    assert "normalize: false" in config.read_text()
    before = checksums(tmp_path)

    result = on_2_ranks(MPITRAIN, "eval", run_dir)
    assert result.returncode == 0, result.stderr
    evaluation = json.loads((run_dir / "eval-test.json").read_text())
    assert evaluation["loss"] == pytest.approx(summary["test_loss"], rel=1e-6)  # what the run measured at its end
    assert evaluation["accuracy"] == pytest.approx(summary["test_accuracy"], rel=1e-6)

    result = on_2_ranks(MPITRAIN, "predict", run_dir, "--out", tmp_path / "predictions.h5")
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "predictions.h5") as now, h5py.File(baseline / "predictions.h5") as then:
        np.testing.assert_array_equal(now["probabilities"][...], then["probabilities"][...])

    result = command(MPITRAIN, "export", run_dir, "--out", tmp_path / "model.onnx")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "model.onnx").read_bytes() == (baseline / "model.onnx").read_bytes()

    after = checksums(tmp_path)
    assert {path: after.get(path) for path in before} == before  # they only added their outputs


def damaged_run(trained: Path, case: Path) -> Path:
    """A copy of the trained run whose every checkpoint is truncated, after the run that set them aside as damaged."""
    run_dir = copy_run(trained, case)
    for path in (run_dir / "checkpoints").iterdir():
        path.write_bytes(path.read_bytes()[:1000])
    result = train(case, "train.epochs=2")
    assert result.returncode == 2 and "none of its 3 checkpoints can be resumed" in result.stderr, result.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "ckpt-0000-000004.h5.damaged", "ckpt-0000-000008.h5.damaged", "ckpt-0001-000000.h5.damaged"]
    return run_dir


def test_a_run_left_with_only_damaged_checkpoints_refuses_until_resume_never(trained, tmp_path):
    run_dir = damaged_run(trained, tmp_path)
    before = checksums(tmp_path)
    for _ in range(2):  # the refusal lasts: the same command again is refused again, and writes nothing
        result = train(tmp_path, "train.epochs=2")
        assert_refused_and_nothing_changed(
            result, before, tmp_path, re.escape(f"{run_dir / 'checkpoints'}: holds only checkpoints set aside as "
                                                "damaged (ckpt-0000-000004.h5.damaged, ") + ".*none to resume; .* use "
                                                "--set resume=never")

    result = train(tmp_path, "train.epochs=2", "resume=never")
    assert result.returncode == 0, result.stderr
    assert len(re.findall(re.escape(f"starting {run_dir} from scratch: the earlier run's config.yaml, metrics.jsonl, "
                                    "summary.json, events.out.tfevents.") + r"[^,]+, checkpoints/ckpt-0000-000004.h5"
                          r"\.damaged", result.stderr)) == 1, result.stderr
    after = checksums(tmp_path)
    earlier = {path.replace("run/", "run/earlier-1/", 1): digest for path, digest in before.items()
               if path.startswith("run/")}
    assert {path: after.get(path) for path in earlier} == earlier  # every earlier file kept, byte for byte
    fresh = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert fresh[-1] == "ckpt-0002-000000.h5" and not any(name.endswith(".damaged") for name in fresh)


def test_a_start_from_scratch_moves_an_earlier_runs_records_aside(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path)
    assert on_2_ranks(MPITRAIN, "eval", run_dir).returncode == 0
    shutil.rmtree(run_dir / "checkpoints")  # the user deleted them: nothing to resume, but records to keep
    before = checksums(tmp_path)
    result = train(tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(re.findall(re.escape(f"starting {run_dir} from scratch: the earlier run's config.yaml, metrics.jsonl, "
                                    "summary.json, confusion-test.png, eval-test.json, events.out.tfevents.")
                          + r"[^,]+ are moved to " + re.escape(str(run_dir / "earlier-1")), result.stderr)) == 1, \
        result.stderr
    after = checksums(tmp_path)
    assert {path.replace("run/", "run/earlier-1/", 1): digest for path, digest in before.items()
            if path.startswith("run/")}.items() <= after.items()
    assert (run_dir / "summary.json").exists() and not (run_dir / "eval-test.json").exists()
