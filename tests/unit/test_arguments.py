"""The Python API's entry points check their arguments: the wrong kind of argument (None before `mpitrain.init()`, a
path where a Config belongs) is one line saying what was expected and what to call first, before anything runs.
On one process (COMM_SELF); two runs of one process's parts: tests/mpi/test_api.py."""
import inspect
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

import mpitrain
from mpitrain import api
from mpitrain.base.errors import MpitrainError
from mpitrain.testing.datasets import make_dataset

COMM_FIRST = r"expected the Communicator that mpitrain.init\(\) returns \(call comm = mpitrain.init\(\) first"


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api")
    make_dataset(folder / "data", n_train=64, n_test=16)
    comm = mpitrain.Communicator(MPI.COMM_SELF)
    reader = mpitrain.DatasetReader(str(folder / "data"), comm)
    model = mpitrain.Sequential([mpitrain.Dense(3)], reader.manifest.feature_shape)
    return SimpleNamespace(folder=folder, comm=comm, reader=reader, model=model,
                           config=mpitrain.Config(run_dir=str(folder / "run"),
                                                  model=mpitrain.ModelConfig(layers=[{"type": "dense", "units": 3}])))


CASES = [
    ("train(config, None)", lambda p: mpitrain.train(p.config, None), r"mpitrain.train: comm is None; " + COMM_FIRST),
    ("train(path, comm)", lambda p: mpitrain.train("exp.yaml", p.comm),
     r"mpitrain.train: config is 'exp.yaml' \(a str\); expected a Config \(mpitrain.load_config\(path\)"),
    ("train(reader=path)", lambda p: mpitrain.train(p.config, p.comm, reader="data"),
     r"reader is 'data' \(a str\); expected a DatasetReader \(mpitrain.DatasetReader\(path, comm\)\)"),
    ("train(model=config)", lambda p: mpitrain.train(p.config, p.comm, model=p.config.model),
     r"model is ModelConfig\(.*\(a ModelConfig\); expected a model \(mpitrain.Sequential"),
    ("train(sync=SyncConfig)", lambda p: mpitrain.train(p.config, p.comm, sync=mpitrain.SyncConfig()),
     r"sync is SyncConfig\(.*; expected a synchronizer \(mpitrain.create_synchronizer\(sync_config, comm\)\)"),
    ("train()", lambda p: mpitrain.train(), r"mpitrain.train: missing a required argument: 'config'"),
    ("setup_run(config, None)", lambda p: mpitrain.setup_run(p.config, None), "mpitrain.setup_run: comm is None"),
    ("create_synchronizer(Config)", lambda p: mpitrain.create_synchronizer(p.config, p.comm),
     r"mpitrain.create_synchronizer: config is Config\(.*; expected a SyncConfig"),
    ("create_synchronizer(sync, None)", lambda p: mpitrain.create_synchronizer(mpitrain.SyncConfig(), None),
     "mpitrain.create_synchronizer: comm is None; " + COMM_FIRST),
    ("evaluate(None, ...)", lambda p: mpitrain.evaluate(None, None, None, 16, p.comm, 3, None),
     "mpitrain.evaluate: model is None; expected a model"),
    ("evaluate(rows=None)", lambda p: mpitrain.evaluate(p.model, None, None, 16, p.comm, 3, None),
     r"mpitrain.evaluate: rows is None; expected a split's rows \(reader.eval_rows\(split\)\)"),
    ("predict(rows, to_input=None)", lambda p: mpitrain.predict(p.model, p.reader.eval_rows("test"), None, 16, None),
     r"mpitrain.predict: to_input is None; expected the rows' ModelInput"),
    ("evaluate_run(run, None)", lambda p: mpitrain.evaluate_run(str(p.folder), None),
     "mpitrain.evaluate_run: comm is None; " + COMM_FIRST),
    ("predict_run(None, comm)", lambda p: mpitrain.predict_run(None, p.comm),
     r"mpitrain.predict_run: run_dir is None; expected a path"),
    ("export_onnx(model, None, path)", lambda p: mpitrain.export_onnx(p.model, None, str(p.folder / "m.onnx")),
     r"mpitrain.export_onnx: manifest is None; expected a dataset's Manifest \(reader.manifest\)"),
    ("build_network(Config)", lambda p: mpitrain.build_network(p.config, p.reader.manifest, np),
     r"mpitrain.build_network: config is Config\(.*; expected a ModelConfig"),
    ("load_config(path, str)", lambda p: mpitrain.load_config("exp.yaml", "train.epochs=3"),
     r"mpitrain.load_config: overrides is 'train.epochs=3' \(a str\); expected a list of overrides \(e.g. "),
    ("build_model(None)", lambda p: mpitrain.build_model(None, (16,), 3, np), "mpitrain.build_model: config is None"),
    ("DatasetReader(path, None)", lambda p: mpitrain.DatasetReader(str(p.folder / "data"), None),
     r"DatasetReader\('.*data', comm\): comm is None; " + COMM_FIRST),
    ("DatasetReader(None, comm)", lambda p: mpitrain.DatasetReader(None, p.comm),
     r"DatasetReader: path is None; expected the dataset's folder or URL"),
    ("reader of another rank count", lambda p: mpitrain.setup_run(
        p.config, p.comm, reader=mpitrain.DatasetReader(str(p.folder / "data"), SimpleNamespace(rank=0, size=2))),
     r"the DatasetReader was built for rank 0 of 2, but this is rank 0 of 1; build it with the communicator"),
]


@pytest.mark.parametrize("call, pattern", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_wrong_argument_is_one_line_naming_it_and_what_to_pass(parts, call, pattern):
    with pytest.raises(MpitrainError, match=pattern) as raised:
        call(parts)
    assert "\n" not in str(raised.value)
    assert not (parts.folder / "run").exists() and not (parts.folder / "m.onnx").exists()


def test_every_api_function_that_takes_a_run_part_checks_its_arguments():
    parts = {"config", "comm", "reader", "model", "sync", "manifest", "rows", "run_dir"}
    takes = [name for name in api.__all__ if inspect.isfunction(getattr(api, name))
             and parts & set(inspect.signature(getattr(api, name)).parameters)]
    assert {"train", "setup_run", "create_synchronizer", "evaluate", "predict", "evaluate_run", "predict_run",
            "export_onnx", "build_network", "build_model"} <= set(takes)
    assert [name for name in takes if not hasattr(getattr(api, name), "__wrapped__")] == []
