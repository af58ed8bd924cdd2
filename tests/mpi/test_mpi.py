"""Multi-rank behaviour under real `mpiexec -n 2` and `-n 4` (and an odd size), each with a timeout."""
import json
import os
import sys
import time

import h5py
import pytest

from mpitrain.testing.datasets import flip_a_byte_in_a_chunk, make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, RANK_SCRIPTS, mpiexec, train_each

MODES = {
    "allreduce": {"mode": "allreduce"},
    "averaging-3": {"mode": "averaging", "frequency": 3},
    "averaging-epoch": {"mode": "averaging", "frequency": "epoch", "average_updater": True},
    "none": {"mode": "none"},
    "sharing": {"mode": "sharing", "threshold": 1.0e-2},
    "sharing-split": {"mode": "sharing", "threshold": 1.0e-2, "exchange": "split"},
    "sharing-recursive": {"mode": "sharing", "threshold": 1.0e-2, "exchange": "recursive"},
}


def train(tmp_path, n, timeout=120, **sections):
    config = write_config(tmp_path / "exp.yaml", tmp_path / "data", **sections)
    result = mpiexec(n, MPITRAIN, "train", config, timeout=timeout)
    return result, tmp_path / "run"


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module", params=[2, 4])
def every_mode(request, tmp_path_factory) -> tuple[int, dict]:
    """Each mode of MODES trained on one dataset in one job of n ranks, in turn (`mpitrain.train` per config, as a
    Python script would: ranks/train_each.py): one start-up for the seven runs. (n, {mode: run directory})."""
    n, folder = request.param, tmp_path_factory.mktemp(f"modes{request.param}")
    make_dataset(folder / "data", n_train=480)
    configs = {mode: write_config(folder / f"{mode}.yaml", folder / "data", run_dir=str(folder / mode), sync=sync,
                                  optimizer={"type": "adam", "lr": 0.01}) for mode, sync in MODES.items()}
    result = train_each(n, *configs.values())
    assert result.returncode == 0, result.stderr
    return n, {mode: folder / mode for mode in MODES}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_replicas_bit_identical_in_every_mode(every_mode, mode):
    n, run_dir = every_mode[0], every_mode[1][mode]
    s = summary(run_dir)
    assert s["ranks"] == n and s["sync_mode"] == MODES[mode]["mode"]
    assert s["test_accuracy"] > 0.8  # 3 classes: chance is 1/3
    if mode == "none":
        assert len(set(s["replica_hashes"])) == n  # independent ranks really do drift apart
    else:
        assert len(set(s["replica_hashes"])) == 1
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in epochs if r["kind"] == "epoch"] == [0, 1]
    assert all(len(r["rank_losses"]) == n for r in epochs if r["kind"] == "window")
    # the windows count every sample trained: each rank's full batches of 16 (a partial last batch is dropped)
    assert sum(r["samples"] for r in epochs if r["kind"] == "window" and r["epoch"] == 1) == n * s["steps_per_epoch"] * 16
    assert s["bytes_sent_per_step_min"] <= s["bytes_sent_per_step"] <= s["bytes_sent_per_step_max"]
    if mode == "allreduce":
        assert s["bytes_sent_per_step"] == s["n_params"] * 4 == s["bytes_sent_per_step_max"]
    if mode.startswith("sharing"):
        windows = [r for r in epochs if r["kind"] == "window"]
        assert all(r["tau"] > 0 and 0 <= r["sparsity"] <= 1 for r in windows)
        assert s["bytes_sent_per_step"] < s["n_params"] * 4
        exchange = MODES[mode].get("exchange", "allgather")  # auto keeps allgather on a few ranks
        assert all(r["exchange"] == exchange and r[f"{exchange}_steps"] > 0 for r in windows)
        assert sum(r["allgather_steps"] + r["split_steps"] + r["recursive_steps"]
                   for r in windows) == s["steps_per_epoch"] * s["epochs"]
    if mode == "averaging-3":  # one parameter averaging every 3 steps (and at each epoch end)
        assert s["bytes_sent_per_step"] < s["n_params"] * 4 / 2


@pytest.fixture(scope="module", params=[2, 4])
def allreduce_checks(request) -> tuple[int, str]:
    """ranks/allreduce_equivalence.py's cases, with and without clipping, in one job of n ranks: (n, its output)."""
    n = request.param
    cases = ["sgd", "adam", "sgd:0.05", "adam:0.05"]
    result = mpiexec(n, sys.executable, os.path.join(RANK_SCRIPTS, "allreduce_equivalence.py"), *cases)
    assert result.returncode == 0, result.stdout + result.stderr
    return n, result.stdout


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_allreduce_equals_one_process_with_n_times_the_batch(allreduce_checks, optimizer):
    n, out = allreduce_checks
    assert f"OK {n} {optimizer}\n" in out, out


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_allreduce_clips_the_averaged_gradient(allreduce_checks, optimizer):
    n, out = allreduce_checks
    assert f"OK {n} {optimizer}:0.05\n" in out, out


@pytest.mark.parametrize("n", [2, 4])
def test_overlapped_allreduce_equals_blocking_for_every_bucket_cut(n):
    result = mpiexec(n, sys.executable, os.path.join(RANK_SCRIPTS, "overlap_checks.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    for model in ("mlp", "bn-cnn"):
        for cut in ("one bucket larger than the buffer", "one bucket per layer", "buckets smaller than a layer"):
            lines = [line for line in result.stdout.splitlines() if line.startswith(f"OK {model}, {cut}")]
            assert len(lines) == 3 and all(line.endswith(f" {n}") for line in lines), result.stdout
            for check in ("overlapped equals blocking", "every bucket but the last posted during backward",
                          "replicas identical"):
                assert any(check in line for line in lines), result.stdout
    assert "OK staged buckets equal blocking, with two copies per bucket per step" in result.stdout


def test_overlapped_training_run_equals_blocking_and_reports_its_communication(tmp_path):
    make_dataset(tmp_path / "data", n_train=480)
    summaries = {}
    for overlap in (True, False):
        config = write_config(tmp_path / f"{overlap}.yaml", tmp_path / "data", run_dir=str(tmp_path / f"run-{overlap}"),
                              sync={"mode": "allreduce", "overlap": overlap, "bucket_mb": 0})
        result = mpiexec(2, MPITRAIN, "train", config)
        assert result.returncode == 0, result.stderr
        summaries[overlap] = summary(tmp_path / f"run-{overlap}")
    assert summaries[True]["replica_hashes"] == summaries[False]["replica_hashes"]
    for s in summaries.values():
        assert s["nodes"] == 1 and s["ranks_per_node"] == 2
        assert 0 < s["comm_ms_per_step"] and 0 < s["mpi_ms_per_step"] < 1e3 * s["wall_s"] / s["steps_per_epoch"]
    # blocking: the last rank to arrive communicates for less than the ranks' mean time inside MPI
    assert summaries[False]["comm_ms_per_step"] <= summaries[False]["mpi_ms_per_step"]
    records = [json.loads(line) for line in (tmp_path / "run-True" / "metrics.jsonl").read_text().splitlines()]
    assert all(w["comm_ms_per_step"] > 0 and w["mpi_ms_per_step"] > 0 for w in records if w["kind"] == "window")
    assert all(r["nodes"] == 1 and r["ranks_per_node"] == 2 for r in records if r["kind"] == "epoch")


EXCHANGES = ["allgather", "split", "recursive"]


@pytest.fixture(scope="module", params=[2, 4])
def sharing_checks(request) -> tuple[int, str]:
    """ranks/sharing_checks.py with every exchange in one job of n ranks: (n, its output)."""
    result = mpiexec(request.param, sys.executable, os.path.join(RANK_SCRIPTS, "sharing_checks.py"), *EXCHANGES)
    assert result.returncode == 0, result.stdout + result.stderr
    return request.param, result.stdout


@pytest.mark.parametrize("exchange", EXCHANGES)
def test_sharing_keeps_its_promises(sharing_checks, exchange):
    n, out = sharing_checks
    for check in ("replicas identical after every step", "nothing lost with a fixed tau",
                  "adaptive tau falls when too sparse", "adaptive tau rises when too dense",
                  "adaptive tau stays inside the band", "mixed sparse and bitmap messages decode exactly",
                  "the merged residual keeps the pending updates and every rank's state",
                  "a resumed synchronizer starts every rank from the saved residual, tau and step count",
                  "on as many ranks each rank gets its own residual back"):
        assert f"OK {check} [{exchange}] {n}" in out, out


@pytest.mark.parametrize("n", [2, 3, 4, 8])  # 8: oversubscribed on a small machine, every rank in the core
def test_summing_exchanges_agree_with_allgather_and_auto_chooses_alike_everywhere(n):
    result = mpiexec(n, sys.executable, os.path.join(RANK_SCRIPTS, "exchange_checks.py"), timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = [f"{exchange} and allgather agree to float tolerance ({label})"
              for exchange, label in (("split", "n=1001"), ("split", "n=40"), ("recursive", "n=1001"),
                                      ("recursive", "n=1001, float64"), ("recursive", "n=40"))]
    checks += [check.replace("and allgather agree to float tolerance", "keeps the replicas identical after every step")
               for check in checks]
    checks += [f"{exchange} sends no more than a ring allreduce plus headers ({case})"
               for exchange in ("split", "recursive") for case in ("1% sparse", "bitmaps", "every element")]
    checks += [f"a NaN on one rank stops every rank ({exchange})" for exchange in ("split", "recursive", "auto")]
    checks += ["recursive sends 2 log2 P' messages per rank per step (+1 folding, 1 when folded)",
               "auto keeps allgather with the default network, bit for bit",
               "auto leaves allgather on a slow link with dense messages, alike on every rank"]
    for check in checks:
        assert f"OK {check} {n}" in result.stdout, result.stdout


def recorded_rows(folder) -> dict:
    """{(epoch, step): {rank: rows}} from the debug hook's files (MPITRAIN_DEBUG_ROWS)."""
    steps = {}
    for path in sorted(folder.glob("rows-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault((record["epoch"], record["step"]), {})[rank] = record["rows"]
    return steps


def test_every_row_once_per_epoch_and_the_same_global_batches_on_1_2_3_4_ranks(tmp_path):
    """1103 rows in 5 shards (max_rows cuts one), a window of a few global batches of 12."""
    make_dataset(tmp_path / "data", n_train=1200, n_test=10, shards=5)
    batches = {}
    for n in (1, 2, 3, 4):
        rows = tmp_path / f"rows-{n}"
        config = write_config(tmp_path / f"exp{n}.yaml", tmp_path / "data", run_dir=str(tmp_path / f"run{n}"),
                              train={"global_batch_size": 12, "epochs": 2}, data={"max_rows": 1103, "buffer_mb": 0.05})
        result = mpiexec(n, MPITRAIN, "train", config, timeout=120,
                         env={**os.environ, "MPITRAIN_DEBUG_ROWS": str(rows)})
        assert result.returncode == 0, result.stderr
        steps = recorded_rows(rows)
        assert set(steps) == {(e, k) for e in (0, 1) for k in range(1103 // 12)}
        assert all(sorted(ranks) == list(range(n)) and all(len(r) == 12 // n for r in ranks.values())
                   for ranks in steps.values())
        for epoch in (0, 1):
            seen = [row for (e, _), ranks in steps.items() if e == epoch for r in ranks.values() for row in r]
            assert len(seen) == len(set(seen)) == 1103 // 12 * 12 and max(seen) < 1103
        batches[n] = {key: sorted(row for r in ranks.values() for row in r) for key, ranks in steps.items()}
        assert summary(tmp_path / f"run{n}")["data_read_per_epoch"] < 1 + 0.5 * n
    assert batches[1] == batches[2] == batches[3] == batches[4]
    assert batches[1][(0, 0)] != batches[1][(1, 0)]


def test_an_exception_on_one_rank_aborts_the_job():
    started = time.monotonic()
    result = mpiexec(2, sys.executable, os.path.join(RANK_SCRIPTS, "crash_on_one_rank.py"), timeout=60)
    assert result.returncode != 0
    assert "[rank 1] RuntimeError: deliberate failure on rank 1" in result.stderr
    assert "got past the barrier" not in result.stdout
    assert time.monotonic() - started < 30


def test_a_corrupt_shard_of_one_rank_fails_every_rank_cleanly(tmp_path):
    make_dataset(tmp_path / "data", n_train=400, shards=4)
    shard = tmp_path / "data" / "train" / "shard-00003.h5"
    flip_a_byte_in_a_chunk(shard)  # read by one rank, mid-epoch
    started = time.monotonic()
    result, run_dir = train(tmp_path, 2, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("the chunk fails its checksum") == 1 and str(shard) in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 30
    assert not (run_dir / "summary.json").exists()


def test_config_error_exits_nonzero_on_every_rank(tmp_path):
    make_dataset(tmp_path / "data", n_train=40)
    result, _ = train(tmp_path, 2, timeout=60, sync={"mode": "ring"})
    assert result.returncode == 2
    assert result.stderr.count("sync.mode is 'ring'") == 1


def test_data_settings_that_do_not_fit_are_one_line_before_anything_is_written(tmp_path):
    make_dataset(tmp_path / "data", n_train=40)
    for sections, message in (({"train": {"batch_size": 16}}, "the global batch size is 64, but split 'train' has "
                                                               "only 40 rows"),
                              ({"train": {"global_batch_size": 10}}, "the global batch size 10 is not divisible by "
                                                                     "the 4 ranks"),
                              ({"data": {"buffer_mb": 0.0001}, "train": {"global_batch_size": 8}},
                               "data.buffer_mb is 0.0001: it holds"),
                              ({"data": {"path": "gs://bucket/fashion"}}, "gs://bucket/fashion: gs:// needs a package "
                                                                          "that is not installed")):
        result, run_dir = train(tmp_path, 4, timeout=60, **sections)
        assert result.returncode == 2 and result.stderr.count(message) == 1, result.stderr
        assert not run_dir.exists()


def test_augmenting_rows_that_are_not_images_is_an_error(tmp_path):
    make_dataset(tmp_path / "data", n_train=40, shape=(16,))
    result, _ = train(tmp_path, 2, timeout=60, data={"augment": True})
    assert result.returncode == 2
    assert result.stderr.count("data.augment flips and shifts images") == 1 and "(16,)" in result.stderr


def test_eval_and_predict_after_training_and_resume_on_other_rank_count(tmp_path):
    make_dataset(tmp_path / "data", n_train=480)
    result, run_dir = train(tmp_path, 2, train={"epochs": 1})
    assert result.returncode == 0, result.stderr
    first = summary(run_dir)
    result = mpiexec(2, MPITRAIN, "eval", run_dir, "--split", "test", timeout=60)
    assert result.returncode == 0, result.stderr
    evaluation = json.loads((run_dir / "eval-test.json").read_text())
    assert evaluation["accuracy"] == pytest.approx(first["test_accuracy"])
    assert evaluation["rows"] == 200 and sum(map(sum, evaluation["confusion"])) == 200
    result = mpiexec(3, MPITRAIN, "predict", run_dir, "--split", "test", timeout=60)
    assert result.returncode == 0, result.stderr
    with h5py.File(run_dir / "predictions-test.h5") as f:
        assert f["predicted"].shape == (200,) and f["probabilities"].shape == (200, 3)
        hits = (f["predicted"][...] == f["label"][...]).mean()
        probabilities, labels = f["probabilities"][...], f["label"][...]
    assert hits == pytest.approx(first["test_accuracy"])
    # eval's class metrics are scikit-learn's of the same predictions (written by 3 ranks, float32)
    from sklearn.metrics import f1_score, log_loss, roc_auc_score
    assert evaluation["auc_macro"] == pytest.approx(roc_auc_score(labels, probabilities, multi_class="ovr"), rel=1e-4)
    assert evaluation["log_loss"] == pytest.approx(log_loss(labels, probabilities, labels=[0, 1, 2]), rel=1e-4)
    assert evaluation["f1"] == pytest.approx(list(f1_score(labels, probabilities.argmax(1), average=None)))
    # a second run of the same config with more epochs resumes after epoch 1, here on 4 ranks
    result, run_dir = train(tmp_path, 4, train={"epochs": 2})
    assert result.returncode == 0, result.stderr
    assert "resuming from" in result.stderr and "ckpt-0001-000000.h5" in result.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [0, 1]
    assert summary(run_dir)["ranks"] == 4
    # resume: never refuses to write over the checkpoints of that run
    result, run_dir = train(tmp_path, 2, timeout=60, resume="never")
    assert result.returncode == 2 and "holds checkpoints of an earlier run" in result.stderr
    assert len(list((run_dir / "checkpoints").iterdir())) == 2


@pytest.mark.parametrize("n", [2, 4])
def test_compressed_allreduce_overlapped_or_not_and_averaging_keep_identical_replicas_near_float32(n):
    result = mpiexec(n, sys.executable, os.path.join(RANK_SCRIPTS, "compression_checks.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    for codec in ("bf16", "fp16"):
        assert sum(line.startswith(f"OK {codec}: the compressed mean") and line.endswith(f" {n}")
                   for line in result.stdout.splitlines()) == 3, result.stdout
        for check in (f"allreduce {codec}: replicas identical", f"allreduce {codec}: 0.5",
                      f"allreduce {codec} overlapped by layer: every bucket posted in backward",
                      f"allreduce {codec} overlapped by layer, staged through host buffers: every bucket posted",
                      f"averaging {codec}: replicas identical after every averaging"):
            assert f"OK {check}" in result.stdout, result.stdout
    for rank in (1, 2):
        assert f"OK allreduce powersgd rank {rank}: replicas identical" in result.stdout, result.stdout
        assert f"OK allreduce powersgd rank {rank} overlapped by layer: every bucket" in result.stdout, result.stdout
    assert "OK averaging powersgd: replicas identical after every averaging" in result.stdout, result.stdout


@pytest.mark.parametrize("mode, compression", [("allreduce", "powersgd"), ("averaging", "bf16"),
                                               ("averaging", "powersgd")])
def test_a_compressed_run_resumed_mid_epoch_ends_bit_for_bit_as_one_that_was_not(tmp_path, mode, compression):
    """The compression's state (powersgd's Q and each rank's error, averaging's reference) is in the checkpoints:
    a run resumed from one taken mid-epoch, between averagings (every 3 steps, checkpoints every 5), ends equal."""
    import shutil

    import numpy as np

    from mpitrain.rundir.checkpoint import list_checkpoints
    make_dataset(tmp_path / "data", n_train=320, n_test=64)

    def run(name):
        config = write_config(tmp_path / f"{name}.yaml", tmp_path / "data", run_dir=str(tmp_path / name),
                              train={"epochs": 2, "batch_size": 16},
                              sync={"mode": mode, "compression": compression, "frequency": 3},
                              checkpoint={"unit": "step", "every": 5, "keep": 100})
        result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        with h5py.File(list_checkpoints(str(tmp_path / name))[-1]) as f:
            return f["params"][...]

    full = run("full")
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "full" / "checkpoints" / "ckpt-0000-000005.h5", tmp_path / "resumed" / "checkpoints")
    np.testing.assert_array_equal(run("resumed"), full)
