"""mpitrain: Spark ETL to HDF5 shards, then data-parallel training over MPI.

`import mpitrain` gives the Python API (`mpitrain.api`: `init`, `Config`, `DatasetReader`,
`Sequential`, `create_synchronizer`, `train`, ...). Its names load on first use, so tools
that need no MPI (the ETL, `mpitrain info`) never start it.

Importing it first sizes the thread pools of numba and BLAS for the ranks on this node, before
either loads (`mpitrain.base.threads`): every entry point passes through here.
"""
from mpitrain.base.threads import thread_plan

THREADS = thread_plan()  # before anything imports numpy or numba

__version__ = "0.1.0"


def __getattr__(name: str):
    """The Python API's names (`mpitrain.api.__all__`, the one list of them), loaded on first use."""
    if not name.startswith("_"):
        import importlib
        api = importlib.import_module("mpitrain.api")  # not `from mpitrain import api`: that asks this hook again
        if name in getattr(api, "__all__", ()):  # (absent while api itself is being imported)
            return getattr(api, name)
    raise AttributeError(f"module 'mpitrain' has no attribute {name!r}")
