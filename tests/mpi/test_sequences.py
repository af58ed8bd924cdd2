"""Sequence models end to end on 2 ranks (real mpiexec): LSTM, GRU and Conv1D models, and a graph of two sequence
columns beside fixed features, train on ragged sequences with a known rule, `mpitrain predict` gives the same
predictions whatever the batches' padding, the exported ONNX graph gives them too, and a run stopped mid-epoch
resumes to the uninterrupted run's parameters (bit for bit on the same rank count, within float32 rounding on
another)."""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest

from mpitrain.data.reader import DatasetReader
from mpitrain.rundir.checkpoint import list_checkpoints
from mpitrain.testing.datasets import write_config
from mpitrain.testing.launch import MPITRAIN, command, mpiexec, train_each
from mpitrain.testing.sequences import make_mixed_dataset, make_sequence_dataset

TOKENS = [{"type": "token_embedding", "dim": 8}, {"type": "lstm", "units": 12}, {"type": "dense", "units": 3}]
MODELS = {
    "bidirectional-lstm": [{"type": "lstm", "units": 12, "bidirectional": True}, {"type": "dense", "units": 4}],
    "gru-sequence-pooled": [{"type": "gru", "units": 12, "return_sequences": True}, {"type": "global_avg_pool"},
                            {"type": "dense", "units": 4}],
    "conv1d": [{"type": "conv1d", "filters": 16, "kernel": 4, "activation": "relu"}, {"type": "global_max_pool"},
               {"type": "dense", "units": 4}],
    "transformer": [{"type": "dense", "units": 16}, {"type": "positional"},
                    {"type": "transformer", "heads": 2, "ff_units": 32, "rate": 0.1}, {"type": "layernorm"},
                    {"type": "global_avg_pool"}, {"type": "dense", "units": 4}],
}
TRAIN = {"epochs": 4, "batch_size": 16, "seed": 2, "log_every": 10}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("sequences") / "data"
    make_sequence_dataset(path, n_train=640, n_test=160, shards=2, lengths=(6, 70))
    return path


def train(tmp_path, dataset, name: str, ranks: int = 2, run_dir=None, **sections):
    run_dir = run_dir or tmp_path / name
    config = write_config(tmp_path / f"{name}.yaml", dataset, run_dir=str(run_dir),
                          **{"model": {"layers": MODELS["bidirectional-lstm"]}, "train": TRAIN,
                             "optimizer": {"type": "adam", "lr": 0.01}, **sections})
    result = mpiexec(ranks, MPITRAIN, "train", config, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def predictions(run_dir, batch_size: int) -> np.ndarray:
    result = mpiexec(2, MPITRAIN, "predict", run_dir, "--split", "test", "--batch-size", batch_size, "--overwrite",
                     timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    with h5py.File(run_dir / "predictions-test.h5") as f:
        return f["probabilities"][...], f["label"][...]


class _Rank:
    rank, size = 0, 1


@pytest.fixture(scope="module")
def sequence_models(data, tmp_path_factory) -> dict:
    """Each model of MODELS trained on 2 ranks, the four in turn in one job (as a Python script would:
    ranks/train_each.py); {model: run directory}."""
    folder = tmp_path_factory.mktemp("models")
    configs = [write_config(folder / f"{model}.yaml", data, run_dir=str(folder / model), model={"layers": layers},
                            train=TRAIN, optimizer={"type": "adam", "lr": 0.01}) for model, layers in MODELS.items()]
    result = train_each(2, *configs, timeout=360)
    assert result.returncode == 0, result.stderr[-3000:]
    return {model: folder / model for model in MODELS}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_sequence_model_learns_and_predicts_alike_in_any_batch_and_in_onnx(data, sequence_models, tmp_path, model):
    import onnxruntime
    run_dir = sequence_models[model]
    probabilities, labels = predictions(run_dir, 64)
    assert (probabilities.argmax(axis=1) == labels).mean() > 0.6  # 4 classes: chance is 0.25
    other, _ = predictions(run_dir, 7)  # other companions, other padded lengths
    np.testing.assert_allclose(other, probabilities, rtol=0, atol=1e-6)

    exported = command(MPITRAIN, "export", run_dir, "--out", tmp_path / f"{model}.onnx")
    assert exported.returncode == 0, exported.stderr
    session = onnxruntime.InferenceSession(str(tmp_path / f"{model}.onnx"))
    assert [i.name for i in session.get_inputs()] == ["x", "lengths"]
    rows = 0
    for x, _ in DatasetReader(str(data), _Rank()).eval_rows("test").batches(50):
        got = session.run(None, {"x": x.values, "lengths": x.lengths})[0]
        np.testing.assert_allclose(got, probabilities[rows:rows + len(got)], rtol=0, atol=1e-5)
        rows += len(got)
    assert rows == len(probabilities)


def final_params(run_dir) -> np.ndarray:
    with h5py.File(list_checkpoints(str(run_dir))[-1]) as f:
        return f["params"][...]


@pytest.mark.parametrize("layers", [[{"type": "lstm", "units": 8}, {"type": "dense", "units": 4}],
                                    # no dropout: its masks are keyed by rank, so 1 rank draws other ones
                                    [{"type": "positional"}, {"type": "transformer", "heads": 1, "ff_units": 8},
                                     {"type": "global_avg_pool"}, {"type": "dense", "units": 4}]],
                         ids=["lstm", "transformer"])
def test_a_mid_epoch_stop_resumes_to_the_uninterrupted_run_on_any_rank_count(data, tmp_path, layers):
    sections = {"train": {**TRAIN, "epochs": 2, "global_batch_size": 32},
                "checkpoint": {"unit": "step", "every": 7, "keep": 100},
                "data": {"buffer_mb": 0.15},  # windows of a few global batches
                # float64: another rank count sums in another order, and float32's rounding grows step by step
                "model": {"layers": layers, "dtype": "float64"}}
    full = train(tmp_path, data, "full", **sections)
    for name, ranks in (("same", 2), ("one", 1)):
        run_dir = tmp_path / name
        (run_dir / "checkpoints").mkdir(parents=True)
        shutil.copy(full / "checkpoints" / "ckpt-0000-000014.h5", run_dir / "checkpoints")
        train(tmp_path, data, name, ranks, run_dir=run_dir, **sections)
        if ranks == 2:
            np.testing.assert_array_equal(final_params(run_dir), final_params(full))
        else:
            np.testing.assert_allclose(final_params(run_dir), final_params(full), rtol=1e-7, atol=1e-9)


def test_a_class_per_step_trains_evaluates_predicts_and_exports(tmp_path):
    import onnxruntime
    data = tmp_path / "tagged-data"
    make_sequence_dataset(data, n_train=1200, n_test=200, shards=2, lengths=(5, 40), rule="tagged")
    layers = [{"type": "lstm", "units": 12, "return_sequences": True}, {"type": "dense", "units": 2}]
    run_dir = train(tmp_path, data, "tagged", model={"layers": layers}, train={**TRAIN, "epochs": 3})
    probabilities, labels = predictions(run_dir, 64)
    reader = DatasetReader(str(data), _Rank())
    steps = sum(int(x.lengths.sum()) for x, _ in reader.eval_rows("test").batches(50))
    assert len(labels) == steps  # a row per valid step
    accuracy = (probabilities.argmax(axis=1) == labels).mean()
    assert accuracy > 0.8  # the running sum's sign: 2 classes
    evaluated = command(MPITRAIN, "eval", run_dir, "--split", "test")
    assert evaluated.returncode == 0, evaluated.stderr
    assert abs(json.loads((run_dir / "eval-test.json").read_text())["accuracy"] - accuracy) < 1e-9

    exported = command(MPITRAIN, "export", run_dir, "--out", tmp_path / "tagged.onnx")
    assert exported.returncode == 0, exported.stderr
    session, rows = onnxruntime.InferenceSession(str(tmp_path / "tagged.onnx")), 0
    for x, _ in reader.eval_rows("test").batches(50):
        got = session.run(None, {"x": x.values, "lengths": x.lengths})[0]
        valid = np.arange(x.values.shape[1])[None, :] < x.lengths[:, None]
        np.testing.assert_allclose(got[valid], probabilities[rows:rows + valid.sum()], rtol=0, atol=1e-5)
        rows += valid.sum()


def test_a_token_model_learns_which_keyword_and_exports(tmp_path):
    import onnxruntime
    data = tmp_path / "tokens-data"
    make_sequence_dataset(data, n_train=960, n_test=160, shards=2, lengths=(5, 40), rule="tokens")
    run_dir = train(tmp_path, data, "tokens", model={"layers": TOKENS})
    probabilities, labels = predictions(run_dir, 64)
    assert (probabilities.argmax(axis=1) == labels).mean() > 0.8  # 3 classes
    exported = command(MPITRAIN, "export", run_dir, "--out", tmp_path / "tokens.onnx")
    assert exported.returncode == 0, exported.stderr
    session, rows = onnxruntime.InferenceSession(str(tmp_path / "tokens.onnx")), 0
    assert session.get_inputs()[0].type == "tensor(int64)"  # a column of integers: int64 ids
    for x, _ in DatasetReader(str(data), _Rank()).eval_rows("test").batches(50):
        assert x.values.dtype == np.int32  # as stored
        got = session.run(None, {"x": x.values.astype(np.int64), "lengths": x.lengths})[0]
        np.testing.assert_allclose(got, probabilities[rows:rows + len(got)], rtol=0, atol=1e-5)
        rows += len(got)


@pytest.mark.parametrize("sections, message", [
    ({"pretrain": {"layers": [8]}, "data": {"normalize": False}},
     "pretrain.layers: a deep belief net reads rows of fixed size, the dataset has sequence columns ['readings']"),
    ({"model": {"layers": [{"type": "lstm", "units": 4, "return_sequences": True}, {"type": "batchnorm"},
                           {"type": "global_max_pool"}, {"type": "dense", "units": 4}]}},
     "model.layers[1] (batchnorm)"),
    ({"model": {"layers": [{"type": "lstm", "units": 4, "return_sequences": True}, {"type": "dense", "units": 4}]}},
     "model.layers: the last layer gives outputs of shape [None, 4], expected [4]"),
])
def test_a_model_that_cannot_read_the_sequences_is_one_error_on_every_rank(data, tmp_path, sections, message):
    config = write_config(tmp_path / "bad.yaml", data, run_dir=str(tmp_path / "bad"),
                          **{"model": {"layers": MODELS["conv1d"]}, "train": TRAIN, **sections})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("mpitrain train: error:")]
    assert result.returncode == 2 and errors and all(message in line for line in errors), result.stderr[-2000:]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    path = tmp_path_factory.mktemp("tagged") / "data"
    make_sequence_dataset(path, n_train=1200, n_test=200, shards=2, lengths=(5, 40), rule="tagged")
    return path


TAGGER = [{"type": "lstm", "units": 12, "return_sequences": True}, {"type": "dense", "units": 2}]


def test_truncated_bptt_learns_a_class_per_step_with_replicas_identical(tagged, tmp_path):
    """Segments of 4 steps over sequences of 5-40 (2 to 10 segments; the ranks' longest sequences differ in many
    steps, so one rank runs segments the other has no steps for): the running sum's sign is learnt through the
    carried states, each segment updates, and the replicas stay identical."""
    run_dir = train(tmp_path, tagged, "tbptt", model={"layers": TAGGER}, train={**TRAIN, "epochs": 3, "tbptt_steps": 4})
    probabilities, labels = predictions(run_dir, 64)
    assert (probabilities.argmax(axis=1) == labels).mean() > 0.8
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["replica_hashes"]) == 2 and len(set(summary["replica_hashes"])) == 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(len(set(r["replica_hashes"])) == 1 for r in records if "replica_hashes" in r)
    with h5py.File(list_checkpoints(str(run_dir))[-1]) as f:
        updates = int(f.attrs["iteration"])
    steps = summary["steps_per_epoch"] * 3
    assert 5 * steps < updates <= 10 * steps  # a sync step per segment: ceil(longest of the global batch / 4)


def test_truncated_bptt_on_a_target_per_sequence_is_one_line_and_exit_2_on_every_rank(data, tmp_path):
    config = write_config(tmp_path / "exp.yaml", data, run_dir=str(tmp_path / "run"), train={**TRAIN, "tbptt_steps": 8},
                          model={"layers": [{"type": "lstm", "units": 4, "return_sequences": True},
                                            {"type": "dense", "units": 4}]})
    result = mpiexec(2, MPITRAIN, "train", config, timeout=60)
    message = f"train.tbptt_steps is 8, but {data} has no class per step"
    assert result.returncode == 2 and result.stderr.count(message) == 1, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run" / "checkpoints").exists()


def test_truncated_bptt_resumes_mid_epoch_to_the_uninterrupted_run(tagged, tmp_path):
    """A step is one batch and no state outlives it, so a checkpoint between steps is all a resume needs."""
    sections = {"train": {**TRAIN, "epochs": 2, "tbptt_steps": 6}, "checkpoint": {"unit": "step", "every": 7, "keep": 100},
                "model": {"layers": TAGGER}}
    full = train(tmp_path, tagged, "full", **sections)
    run_dir = tmp_path / "resumed"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "checkpoints" / "ckpt-0000-000014.h5", run_dir / "checkpoints")
    train(tmp_path, tagged, "resumed", run_dir=run_dir, **sections)
    np.testing.assert_array_equal(final_params(run_dir), final_params(full))


MIXED_GRAPH = [{"name": "r", "type": "lstm", "input": "readings", "units": 12},
               {"name": "s", "type": "conv1d", "input": "events", "filters": 8, "kernel": 4, "activation": "relu"},
               {"name": "ps", "type": "global_max_pool", "input": "s"},
               {"name": "j", "type": "concat", "inputs": ["r", "ps", "numeric"]},
               {"name": "h", "type": "dense", "input": "j", "units": 16, "activation": "relu"},
               {"name": "out", "type": "dense", "input": "h", "units": 4}]


def test_a_graph_of_two_sequence_columns_and_fixed_features_learns_predicts_alike_and_exports(tmp_path):
    """The class needs both columns and a fixed feature (`mixed_inputs`): the graph learns it on 2 ranks, predicts
    alike in batches of other padding, and its ONNX graph (inputs x, readings, readings_lengths, events,
    events_lengths) gives mpitrain predict's probabilities; `--embeddings` reads a node of one vector per row and
    refuses one of a sequence in one line."""
    import onnxruntime
    data = tmp_path / "mixed-data"
    make_mixed_dataset(data, n_train=800, n_test=160, shards=2, lengths=((8, 60), (5, 40)))
    run_dir = train(tmp_path, data, "mixed", model={"graph": MIXED_GRAPH, "layers": []}, train={**TRAIN, "epochs": 5})
    probabilities, labels = predictions(run_dir, 64)
    assert (probabilities.argmax(axis=1) == labels).mean() > 0.6  # 4 classes: chance is 0.25
    other, _ = predictions(run_dir, 7)
    np.testing.assert_allclose(other, probabilities, rtol=0, atol=1e-6)

    exported = command(MPITRAIN, "export", run_dir, "--out", tmp_path / "mixed.onnx")
    assert exported.returncode == 0, exported.stderr
    session = onnxruntime.InferenceSession(str(tmp_path / "mixed.onnx"))
    assert [i.name for i in session.get_inputs()] == ["x", "readings", "readings_lengths", "events", "events_lengths"]
    rows = 0
    for x, _ in DatasetReader(str(data), _Rank()).eval_rows("test").batches(50):
        feeds = {"x": x.x, **{name: batch.values for name, batch in x.columns.items()},
                 **{f"{name}_lengths": batch.lengths for name, batch in x.columns.items()}}
        got = session.run(None, feeds)[0]
        np.testing.assert_allclose(got, probabilities[rows:rows + len(got)], rtol=0, atol=1e-5)
        rows += len(got)
    assert rows == len(probabilities)

    joined = mpiexec(2, MPITRAIN, "predict", run_dir, "--embeddings", "j", timeout=120)
    assert joined.returncode == 0, joined.stderr[-3000:]
    with h5py.File(run_dir / "embeddings-test.h5") as f:
        assert f["embeddings"].shape == (160, 12 + 8 + 2)  # the lstm's last state, the pooled conv1d, x
    refused = mpiexec(2, MPITRAIN, "predict", run_dir, "--embeddings", "s", timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "error: --embeddings 's': the node gives a sequence" in refused.stderr
