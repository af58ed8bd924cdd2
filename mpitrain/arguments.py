"""The Python API's argument checks: an entry point of `mpitrain.api` given the wrong kind of argument (None where
the communicator belongs, before `mpitrain.init()`; a path where a Config belongs) says in one line what it
expected and what to call first (an MpitrainError), instead of an AttributeError from deep inside a collective.

    train = checked(loop.train, "train", config=CONFIG, comm=COMM, reader=READER.or_none(), ...)

Not a collective: each rank checks its own arguments before the entry point's first collective, so a mistake made
on every rank (ranks run one script) ends every rank alike, and none waits for another.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os

from mpitrain.base.errors import MpitrainError
from mpitrain.config.sections import Config, ModelConfig, SyncConfig
from mpitrain.data.reader import DatasetReader, ModelInput
from mpitrain.data.shards import Manifest
from mpitrain.data.stream import EvalRows
from mpitrain.nn.model import Network
from mpitrain.parallel.backend import Backend
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import Synchronizer


@dataclasses.dataclass(frozen=True)
class Expected:
    """What one argument must be: an instance of `kinds` (or None, when `optional`), named `what` to the user, with
    `how` saying where one comes from."""

    kinds: tuple
    what: str
    how: str
    optional: bool = False

    def or_none(self) -> Expected:
        """The same, where None (the parameter's default: the config builds the part) is allowed too."""
        return dataclasses.replace(self, optional=True)

    def check(self, value, where: str) -> None:
        if not (value is None and self.optional) and not isinstance(value, self.kinds):
            raise MpitrainError(f"{where} is {_described(value)}; expected {self.what} ({self.how})")


COMM = Expected((Communicator,), "the Communicator that mpitrain.init() returns",
                "call comm = mpitrain.init() first, on every rank")
CONFIG = Expected((Config,), "a Config", "mpitrain.load_config(path) or mpitrain.Config(...)")
SYNC_CONFIG = Expected((SyncConfig,), "a SyncConfig", "mpitrain.SyncConfig(mode=...), or config.sync of a Config")
MODEL_CONFIG = Expected((ModelConfig,), "a ModelConfig", "mpitrain.ModelConfig(layers=[...]), or config.model")
READER = Expected((DatasetReader,), "a DatasetReader", "mpitrain.DatasetReader(path, comm)")
MODEL = Expected((Network,), "a model", "mpitrain.Sequential([...], input_shape, xp=comm.backend.xp) or "
                                        "mpitrain.build_network(model_config, reader.manifest, comm.backend.xp)")
SYNC = Expected((Synchronizer,), "a synchronizer", "mpitrain.create_synchronizer(sync_config, comm)")
MANIFEST = Expected((Manifest,), "a dataset's Manifest", "reader.manifest")
ROWS = Expected((EvalRows,), "a split's rows", "reader.eval_rows(split)")
TO_INPUT = Expected((ModelInput,), "the rows' ModelInput", "mpitrain.setup_run(config, comm).model_input()")
BACKEND = Expected((Backend,), "an array Backend", "comm.backend, after mpitrain.init()")
PATH = Expected((str, os.PathLike), "a path", "a str or pathlib.Path")
OVERRIDES = Expected((list, tuple), "a list of overrides", "e.g. ['train.epochs=3'], as --set takes them")


def checked(function, name: str, **expected: Expected):
    """`function` (the API's `mpitrain.NAME`) with its arguments checked first: each keyword of `expected` names a
    parameter and what it must be; a missing or unknown argument is the same one-line error."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError as e:
            raise MpitrainError(f"mpitrain.{name}: {e}; see help(mpitrain.{name})") from None
        for parameter, expect in expected.items():
            expect.check(arguments.get(parameter, signature.parameters[parameter].default),
                         f"mpitrain.{name}: {parameter}")
        return function(*args, **kwargs)
    return call


def _described(value) -> str:
    if value is None:
        return "None"
    text = repr(value)
    return f"{text if len(text) <= 60 else text[:57] + '...'} (a {type(value).__name__})"
