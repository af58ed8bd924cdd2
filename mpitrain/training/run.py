"""Setting up a run: the parts that training, evaluation and prediction share, built in one place.

    run = setup_run(load_config("configs/fashion_mlp.yaml"), Communicator())
    run.model, run.reader.manifest, run.checkpointer.paths()

`setup_run` picks the array backend and the communicator variant for it (host staging or
not), opens the dataset, builds the model and the run's checkpointer. `mpitrain.train`
goes on to train; `mpitrain eval` and `predict` restore a checkpoint into the same model.
"""
from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass

from mpitrain.base.errors import ConfigError, describe
from mpitrain.base.files import dangling_link
from mpitrain.config.resolved import resolve
from mpitrain.config.sections import Config
from mpitrain.data.reader import Batches, DatasetReader, ModelInput
from mpitrain.data.storage import is_url
from mpitrain.nn.graph import build_network, model_outputs
from mpitrain.nn.losses import check_loss_fits
from mpitrain.nn.model import Budget, Network, rank_memory_bytes
from mpitrain.nn.updaters import state_copies
from mpitrain.parallel.backend import Backend, create_backend
from mpitrain.parallel.sharded_tables import attach_sharded_tables
from mpitrain.rundir.checkpointer import Checkpointer
from mpitrain.rundir.directory import FileLock, RunDir, check_run_dir_outside_datasets
from mpitrain.training.pretrain import dbn_layers
from mpitrain.training.tbptt import check_dataset


@dataclass
class Run:
    """A run's parts: its config, the communicator for its backend, its dataset, model and checkpoints."""

    config: Config
    comm: object  # mpitrain.parallel.comm.Communicator, the variant for `backend`
    backend: Backend
    reader: DatasetReader
    model: Network
    checkpointer: Checkpointer

    @property
    def target(self) -> str:
        """What the model learns to give: the dataset's target kind (`Manifest.target`), or `reconstruction` (an
        autoencoder's, `model.target`)."""
        return "reconstruction" if self.config.model.target == "reconstruction" else self.reader.manifest.target

    @contextmanager
    def owned(self):
        """Hold the run directory for this job while the block runs (a collective).

        Rank 0 refuses it inside a dataset folder, creates it and takes its lock
        (`mpitrain.rundir.directory`): a second job on the same run directory is refused at once,
        naming this one, instead of interleaving its files with ours. A folder that cannot be written is one error on every rank.
        """
        run_dir = self.config.run_dir
        lock = FileLock(RunDir(run_dir).lock)
        with self.comm.agreed_errors():
            if self.comm.is_root:
                check_run_dir_outside_datasets(run_dir)
                try:
                    os.makedirs(run_dir, exist_ok=True)
                    owner = lock.take()
                except OSError as e:
                    link = dangling_link(run_dir)
                    why = f"{'it' if link == run_dir else link} is a symbolic link to {os.readlink(link)}, which " \
                          "leads nowhere (a missing path or a loop of links)" if link else describe(e)
                    raise ConfigError(f"{run_dir}: {why}; expected a folder this job can write (run_dir)") from None
                if owner is not None:
                    raise ConfigError(f"{run_dir}: in use by another job ({owner}); a run directory belongs to one "
                                      "job at a time: wait for it to end, or use another run_dir")
        try:
            yield self
        finally:
            lock.release()

    def train_batches(self, window: int = 0) -> Batches:
        """Batches of this rank's training rows as the config's data and train sections say, in the window
        `data.buffer_mb` allows (or `window` rows: a resumed epoch's). A ConfigError when they do not fit."""
        data, train = self.config.data, self.config.train
        rows = self.reader.train_rows(data.train_split, train.global_batch(self.comm.size), data.buffer_mb,
                                      train.seed, data.shuffle, window)
        return Batches(rows, self.reader.manifest, self.backend, self.config.model.dtype, train.seed, self.comm.rank,
                       normalize=data.normalize, augment=data.augment,
                       prefetch=data.prefetch and not train.trace_allocations,  # traced: steps alone (allocations.py)
                       ws=self.model.workspace.part("batches"), record=debug_rows_hook(self.comm.rank),
                       standardize_targets=data.standardize_targets,
                       augment_rows=self.config.sync.deterministic_rows if self.config.sync.deterministic else 0)

    def model_input(self) -> ModelInput:
        """Stored rows to model input, as training normalizes them (evaluation and prediction)."""
        data = self.config.data
        return ModelInput(self.reader.manifest, self.backend, self.config.model.dtype, data.normalize,
                          self.model.workspace.part("batches"), data.standardize_targets)


def debug_rows_hook(rank: int):
    """With MPITRAIN_DEBUG_ROWS=FOLDER, a recorder appending each batch's row numbers to FOLDER/rows-RANK.jsonl as
    {"epoch", "step", "rows"} (a debugging aid: which rows each rank trained on); else None."""
    folder = os.environ.get("MPITRAIN_DEBUG_ROWS")
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rows-{rank}.jsonl")

    def record(epoch: int, step: int, rows) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"epoch": epoch, "step": step, "rows": [int(r) for r in rows]}) + "\n")
    return record


def on_backend(comm, config: Config):
    """`comm` if a backend was already chosen for it (`mpitrain.init`), else the variant for
    `config.backend` (a collective)."""
    if comm.backend is None:
        backend = create_backend(config.backend, comm.local_rank, comm.local_size)  # before any allocation
        comm = comm.for_backend(backend, config.comm.cuda_aware, config.comm.device_collectives)
    return comm


def setup_run(config: Config, comm, *, reader: DatasetReader | None = None, model: Network | None = None,
              sync=None) -> Run:
    """Build the parts of the run `config` describes on every rank of `comm` (a collective), and resolve the config.

    A `reader`, `model` or `sync` (a Synchronizer) built by the caller (the Python API) replaces
    the config's. The run's config is resolved here, once (`mpitrain.config.resolved`): it
    describes those parts, the backend that runs, a deep belief net's layers and absolute
    paths, so the run directory's config.yaml rebuilds the same model for `mpitrain eval`. A
    user error on any rank is raised on every rank.
    """
    decided = {}
    if reader is not None:
        decided["data.path"] = reader.path
    if model is not None:
        decided.update({**model.config_entries(), "model.loss": model.loss,
                        "model.loss_options": model.loss_options,
                        "model.dtype": str(model.params.dtype)})
    if sync is not None:
        decided["sync"] = sync.config  # the run's config.yaml and summary say which mode ran
    config = resolve(config, decided, "the config")
    if not config.run_dir:
        raise ConfigError("the config: run_dir is empty; expected the run directory, e.g. Config(run_dir='runs/x')")
    check_configs_agree(config, comm)
    comm = on_backend(comm, config)
    data_path = config.data.path if is_url(config.data.path) else os.path.abspath(config.data.path)
    decided = {"run_dir": os.path.abspath(config.run_dir), "data.path": data_path,
               "backend": comm.backend.name}
    with comm.agreed_errors():
        if reader is None:
            reader = DatasetReader(decided["data.path"], comm, verify_checksums=config.data.verify_checksums,
                                   max_rows=config.data.max_rows, storage_options=config.data.storage_options)
        elif (reader.rank, reader.size) != (comm.rank, comm.size):
            raise ConfigError(f"the DatasetReader was built for rank {reader.rank} of {reader.size}, but this is rank "
                              f"{comm.rank} of {comm.size}; build it with the communicator mpitrain.init() returned")
        manifest = reader.manifest
        decided["model.layers"] = model_layers(config, manifest)
        config = resolve(config, decided, "the config")
        if config.model.target != "reconstruction":  # its losses are checked with the config
            check_loss_fits(config.model.loss, manifest.target, reader.path)
        check_dataset(config.train.tbptt_steps, manifest, reader.path)  # before a per-step model meets the target
        if model is None:
            micro_batch = config.train.global_batch(comm.size) // (comm.size * config.train.accumulate)
            memory = rank_memory_bytes(comm.local_size)
            if any(node.get("shard") == "auto" for node in config.model.graph):  # one choice on every rank
                memory = -int(comm.max(-memory))
            model = build_network(config.model, manifest, comm.backend.xp,
                                  Budget(micro_batch, memory, comm.size, state_copies(config.optimizer)))
            graph = model.config_entries()["model.graph"]
            if graph != config.model.graph:  # `shard: auto` decided: recorded
                config = resolve(config, {"model.graph": graph}, "the config")
        else:
            _check_fits(model, config.model, manifest, comm.backend)
    attach_sharded_tables(model, comm)
    checkpointer = Checkpointer(config.run_dir, comm, comm.backend, reader.manifest_sha256, reader.path,
                                keep=config.checkpoint.keep, resume=config.resume)
    return Run(config, comm, comm.backend, reader, model, checkpointer)


def check_configs_agree(config: Config, comm) -> None:
    """Every rank must train one config (a collective of a digest, the run's first: ranks of other configs, another
    file or other --set options per rank, would wait in different collectives until the watchdog). Where they differ,
    a ConfigError on every rank naming the first key that differs and each rank's value."""
    flat = _flat(config.to_dict())
    text = json.dumps(flat, sort_keys=True, default=str)
    if len(set(comm.allgather_obj(hashlib.sha256(text.encode()).hexdigest()))) == 1:
        return
    configs = [json.loads(c) for c in comm.allgather_obj(text)]
    keys = sorted(key for key in set().union(*configs) if len({json.dumps(c.get(key)) for c in configs}) > 1)
    ranks_of = {}
    for rank, c in enumerate(configs):
        ranks_of.setdefault(json.dumps(c.get(keys[0])), []).append(rank)
    values = " but ".join(f"{value} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
                          for value, ranks in ranks_of.items())
    others = f" (and {len(keys) - 1} more key(s): {', '.join(keys[1:4])}{', ...' if len(keys) > 4 else ''})" \
        if len(keys) > 1 else ""
    raise ConfigError(f"the ranks' configs differ: {keys[0]} is {values}{others}; expected one config on every rank "
                      f"(the same file and --set options)")


def _flat(config: dict) -> dict:
    """{section.key: value} of a config's sections, and its top-level keys as they are."""
    flat = {}
    for name, value in config.items():
        if isinstance(value, dict):
            flat.update({f"{name}.{key}": v for key, v in value.items()})
        else:
            flat[name] = value
    return flat


def model_layers(config: Config, manifest) -> list:
    """The layers of the model `config` describes for the dataset of `manifest`: `model.layers`, or a deep belief
    net's built from `pretrain.layers` when `model.layers` is empty."""
    if config.pretrain.layers and manifest.sequences:
        raise ConfigError(f"pretrain.layers: a deep belief net reads rows of fixed size, the dataset has sequence "
                          f"columns {[c['name'] for c in manifest.sequences]}; expected no pretraining")
    if config.pretrain.layers and not config.model.layers:
        return dbn_layers(config.pretrain.layers, manifest.outputs)
    return config.model.layers


def _check_fits(model: Network, model_config, manifest, backend) -> None:
    """A caller's model must live on the run's backend and map the dataset's rows to its classes (an autoencoder's,
    `model.target: reconstruction`: back to its rows, `model.reconstruct_inputs()` done here)."""
    if model.xp is not backend.xp:
        raise ConfigError(f"the model's arrays are {model.xp.__name__} arrays, but the run's backend is "
                          f"{backend.name}; build it with xp=comm.backend.xp")
    outputs, what = model_outputs(model_config, manifest)
    if model.input_shape != manifest.input_shape or \
            model.output_shape != ((None, outputs) if manifest.step_target else (outputs,)):
        raise ConfigError(f"the model maps inputs of shape {list(model.input_shape)} to {list(model.output_shape)}, "
                          f"but the dataset has rows of shape {list(manifest.input_shape)} and "
                          f"{outputs} outputs ({what})")
    if model_config.target == "reconstruction":
        model.reconstruct_inputs()
