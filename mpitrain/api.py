"""mpitrain from Python, for people who script rather than write YAML; `import mpitrain` gives these names.

    # mpiexec -n 2 python examples/mlp_sharing.py
    import mpitrain

    comm = mpitrain.init(backend="numpy")              # every rank: communicator + backend; errors end the job
    reader = mpitrain.DatasetReader("data/fashion", comm)
    model = mpitrain.Sequential([mpitrain.Dense(256, activation="relu"), mpitrain.Dense(10)],
                                reader.manifest.feature_shape, xp=comm.backend.xp)
    sync = mpitrain.create_synchronizer(mpitrain.SyncConfig(mode="sharing"), comm)
    config = mpitrain.Config(optimizer=mpitrain.OptimizerConfig(lr=0.05, momentum=0.9),
                             train=mpitrain.TrainConfig(epochs=2), run_dir="runs/mlp_sharing")
    summary = mpitrain.train(config, comm, reader=reader, model=model, sync=sync)

A graph model (a table's named inputs, embeddings, merges: docs/tables.md) is built from its
config for the dataset: `mpitrain.build_network(mpitrain.ModelConfig(graph=[...],
loss="binary_cross_entropy"), reader.manifest, comm.backend.xp)`.

`mpitrain train CONFIG` runs the same `train`, with every part built from the YAML config;
a part built here replaces the config's, and the run directory's config.yaml records it, so
`mpitrain eval RUN_DIR` and `predict` work on a scripted run as on any other. Every call
that takes `comm` is a collective: every rank makes it, in the same order.

Each entry point checks its arguments first (`mpitrain.arguments`): `train(config, None)` says
to call `mpitrain.init()` first, in one MpitrainError line. Parts that hold a run's state are
reset, not refused, when another run gets them: `train` re-initializes the model from the seed
(or resumes it from the run directory), a synchronizer resets its run state (sharing's tau and
residual) when a run starts it, and a reader that a run closed opens its shards again. So one
script may train several runs with one reader, model and synchronizer, each as with fresh ones.
"""
from __future__ import annotations

from mpitrain import arguments as a
from mpitrain.base.logs import setup_logging
from mpitrain.config.sections import (
    CheckpointConfig,
    CommConfig,
    Config,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    PretrainConfig,
    SyncConfig,
    TrainConfig,
)
from mpitrain.data.reader import DatasetReader
from mpitrain.nn import graph, model
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import AvgPool2D, Conv2D, MaxPool2D
from mpitrain.nn.embedding import Embedding
from mpitrain.nn.graph import Graph
from mpitrain.nn.layers import Dense, Dropout, Flatten, ReLU, Sigmoid, Tanh
from mpitrain.nn.merge import Add, Concat
from mpitrain.nn.model import Sequential
from mpitrain.parallel import sync
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.launch import install_abort_hook
from mpitrain.rundir import directory, export
from mpitrain.training import evaluation, loop, run, trained

# The entry points, each checking its arguments first (`mpitrain.arguments`): what they take, what to call first.
RUN_PARTS = {"config": a.CONFIG, "comm": a.COMM, "reader": a.READER.or_none(), "model": a.MODEL.or_none(),
             "sync": a.SYNC.or_none()}
load_config = a.checked(directory.load_run_config, "load_config", path=a.PATH, overrides=a.OVERRIDES)
train = a.checked(loop.train, "train", **RUN_PARTS)
setup_run = a.checked(run.setup_run, "setup_run", **RUN_PARTS)
create_synchronizer = a.checked(sync.create_synchronizer, "create_synchronizer", config=a.SYNC_CONFIG, comm=a.COMM)
build_model = a.checked(model.build_model, "build_model", config=a.MODEL_CONFIG)
build_network = a.checked(graph.build_network, "build_network", config=a.MODEL_CONFIG, manifest=a.MANIFEST)
evaluate = a.checked(evaluation.evaluate, "evaluate", model=a.MODEL, rows=a.ROWS, to_input=a.TO_INPUT, comm=a.COMM,
                     backend=a.BACKEND)
predict = a.checked(evaluation.predict, "predict", model=a.MODEL, rows=a.ROWS, to_input=a.TO_INPUT, backend=a.BACKEND)
evaluate_run = a.checked(trained.evaluate_run, "evaluate_run", run_dir=a.PATH, comm=a.COMM,
                         checkpoint=a.PATH.or_none())
predict_run = a.checked(trained.predict_run, "predict_run", run_dir=a.PATH, comm=a.COMM, out=a.PATH.or_none(),
                        checkpoint=a.PATH.or_none())
export_onnx = a.checked(export.export_onnx, "export_onnx", model=a.MODEL, manifest=a.MANIFEST, path=a.PATH)

__all__ = ["init", "setup_logging", "Communicator", "Config", "DataConfig", "ModelConfig", "OptimizerConfig",
           "TrainConfig", "SyncConfig", "CheckpointConfig", "CommConfig", "PretrainConfig", "load_config",
           "DatasetReader", "Sequential", "build_model", "Graph", "build_network", "Embedding", "Concat", "Add", "Dense", "Conv2D", "MaxPool2D", "AvgPool2D", "Flatten",
           "Dropout", "BatchNorm", "ReLU", "Tanh", "Sigmoid", "create_synchronizer", "setup_run", "train",
           "evaluate", "predict", "evaluate_run", "predict_run", "export_onnx"]


def init(backend: str = "auto", cuda_aware="auto", mpi_comm=None, device_collectives="auto") -> Communicator:
    """Start mpitrain on this rank and return the communicator for `backend` (numpy | cupy | auto).

    A collective (call it once, on every rank, before anything else of mpitrain's): an
    uncaught exception on any rank then ends the whole job (MPI_Abort) instead of leaving
    the others waiting; mpitrain logs at INFO on rank 0. `mpi_comm` defaults to COMM_WORLD.
    `cuda_aware` and `device_collectives` are the config's `comm.cuda_aware` and `comm.device_collectives`.
    """
    from mpitrain.parallel.backend import create_backend
    install_abort_hook()
    comm = Communicator(mpi_comm)
    setup_logging(comm.rank)
    return comm.for_backend(create_backend(backend, comm.local_rank, comm.local_size), cuda_aware, device_collectives)


