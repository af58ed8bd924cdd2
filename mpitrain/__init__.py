"""mpitrain: Spark ETL to HDF5 shards, then data-parallel training over MPI.

`import mpitrain` gives the Python API (`mpitrain.api`: `init`, `Config`, `DatasetReader`,
`Sequential`, `create_synchronizer`, `train`, ...). Its names load on first use, so tools
that need no MPI (the ETL, `mpitrain info`) never start it.

Importing it first sizes the thread pools of numba and BLAS for the ranks on this node, before
either loads (`mpitrain.threads`): every entry point passes through here.
"""
from mpitrain.threads import size_thread_pools

THREADS = size_thread_pools()  # before anything imports numpy or numba

__version__ = "0.1.0"

API = ("init", "setup_logging", "Communicator", "Config", "DataConfig", "ModelConfig", "OptimizerConfig",
       "TrainConfig", "SyncConfig", "CheckpointConfig", "CommConfig", "PretrainConfig", "load_config",
       "DatasetReader", "Sequential", "build_model", "Dense", "Conv2D", "MaxPool2D", "AvgPool2D", "Flatten",
       "Dropout", "BatchNorm", "ReLU", "Tanh", "Sigmoid", "create_synchronizer", "setup_run", "train",
       "evaluate", "predict", "export_onnx")


def __getattr__(name: str):
    if name in API:
        from mpitrain import api
        return getattr(api, name)
    raise AttributeError(f"module 'mpitrain' has no attribute {name!r}")
