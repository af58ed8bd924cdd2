"""Run configuration: YAML sections validated into dataclasses, with `--set section.key=value` overrides.

Every error names the config file (or, for a key a `--set` gave, that `--set`: `Origin`) and the dotted key, and
says what was expected; a misspelt key gets the nearest of every dotted key. The YAML itself is read by
`mpitrain.config.yaml_input.read_yaml`, the one reader of a user's YAML. Each
field carries its meaning and its domain (a choice's allowed values, taken from the registry
that implements them, or a number's interval) in its metadata: `mpitrain.config.reference`
turns them into docs/configuration.md, and `validate` checks them when the config is loaded,
after checking that every number in the config, nested ones included, is finite.
"""
from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import typing
from dataclasses import dataclass, field

import yaml

from mpitrain.base.errors import ConfigError
from mpitrain.base.options import (
    ALLOWED,
    AT_EPOCH_END,
    REFUSED,
    Options,
    check_value,
    coerce,
    option,
    optional_feature,
    origin_of,
    section,
    shown,
)
from mpitrain.config.yaml_input import read_yaml, read_yaml_file
from mpitrain.data.augment import AUGMENT_DEFAULTS
from mpitrain.data.storage import is_url
from mpitrain.nn.graph import GRAPH_TYPES, check_node_spec
from mpitrain.nn.layers import INIT_SCHEMES
from mpitrain.nn.losses import LOSS_OPTIONS, LOSS_TARGETS, LOSSES, RECONSTRUCTION_LOSSES, check_loss_options
from mpitrain.nn.model import LAYER_TYPES, MAX_UNITS, check_layer_spec
from mpitrain.nn.rbm import VISIBLE_UNITS
from mpitrain.nn.schedules import UNITS as SCHEDULE_UNITS
from mpitrain.nn.schedules import ScheduleOptions
from mpitrain.nn.segments import check_layers
from mpitrain.nn.updaters import UPDATERS
from mpitrain.parallel.backend import BACKENDS
from mpitrain.parallel.sync import SYNCHRONIZERS
from mpitrain.parallel.sync.base import options_of
from mpitrain.parallel.sync.compression import COMPRESSIONS

log = logging.getLogger("mpitrain")

PROPAGATE = ("mean", "sample")


@dataclass(frozen=True)
class DataConfig(Options):
    path: str = option("", "The dataset written by `mpitrain etl` (it holds manifest.json): a folder, relative to "
                           "the current folder, or a URL read through fsspec (s3://bucket/prefix, https://...; "
                           "`pip install 'mpitrain[remote]'`).", on_resume=ALLOWED)
    storage_options: dict = option({}, "Options of the fsspec filesystem of a URL data.path, as they are (s3: "
                                       "{endpoint_url, key, secret, ...}); empty: the standard AWS variables "
                                       "(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).",
                                   on_resume=ALLOWED)
    buffer_mb: float = option(256.0, "The memory, in MB (2**20 bytes), that training rows may take on one rank: "
                                     "two shuffle windows (the one in use, the next being read) when one rank "
                                     "trains, a 1/N share of them on each of N ranks. It sets the shuffle window, "
                                     "so it is part of the epoch order (docs/architecture.md, Data order).",
                                     domain="(0, 1e7]", on_resume=ALLOWED)
    train_split: str = option("train", "The split trained on.", on_resume=AT_EPOCH_END)
    test_split: str = option("test", "The split evaluated after every epoch.", on_resume=ALLOWED)
    normalize: bool = option(True, "Standardize inputs with the manifest's mean and std (after its scale and offset); "
                                   "false keeps scale * stored + offset.")
    standardize_targets: bool = option(True, "A regression target is trained standardized, by its train split's "
                                             "mean and std per column (the manifest's target_mean and target_std, "
                                             "which `mpitrain etl` records); eval's metrics, predict, the ONNX "
                                             "export and Spark scoring give values in the target's own units. "
                                             "false trains on the target as stored (docs/recipes.md).")
    verify_checksums: bool = option(True, "Verify the rows read: shards with per-chunk Fletcher-32 checksums are "
                                          "checked chunk by chunk as they arrive (always, by HDF5); older shards "
                                          "by their whole file's sha256 when first opened (this switch).",
                                   on_resume=ALLOWED)
    shuffle: bool = option(True, "Shuffle the training rows every epoch across all shards: blocks in a random "
                                 "order, then a stratified shuffle inside each window, seeded by (seed, epoch); "
                                 "false: a fixed order.", on_resume=AT_EPOCH_END)
    max_rows: int = option(0, "Use only the first max_rows rows of each split (0: all rows).", domain="[0, 1e15]",
                           on_resume=AT_EPOCH_END)
    prefetch: bool = option(True, "Prepare the next batch in a thread while this one trains.", on_resume=ALLOWED)
    augment: typing.Union[bool, dict] = option(
        False, "Training images only: false, true (the defaults) or a mapping {flip, shift}: mirror each image "
               "left-right with probability 1/2 (flip: true) and move it by up to `shift` pixels (default 2), "
               "drawn by (seed, epoch, rank, step) so a resume sees the same images.", on_resume=ALLOWED)

    def validate(self, where):
        check_value(self.path != "", where, "data.path", self.path, "the dataset folder written by `mpitrain etl`")
        self.check_domains(where, "data.")
        check_value(isinstance(self.storage_options, dict), where, "data.storage_options", self.storage_options,
               "a mapping of fsspec options")
        augment = optional_feature(self.augment, AUGMENT_DEFAULTS, where, "data.augment")
        if augment:
            check_value(0 <= augment["shift"] <= 1024, where, "data.augment.shift", augment["shift"],
                   "a number of pixels in [0, 1024]")
        return dataclasses.replace(self, augment=augment)


@dataclass(frozen=True)
class ModelConfig(Options):
    layers: list = option([], "The layers in order, each a mapping {type: NAME, ...its arguments}; a dense or "
                              "conv2d layer's `activation` adds that activation layer after it. Layer types: "
                              + ", ".join(f"`{name}`" for name in LAYER_TYPES) + ". `freeze: true` on a layer "
                              "keeps its parameters as they start (no step, no bytes; docs/recipes.md). Left out "
                              "with `pretrain.layers`, the deep belief net's layers are built from those.")
    graph: list = option([], "Instead of `layers`: named nodes, each {name: NAME, type: TYPE, input: NAME} (concat and "
                             "add: `inputs: [NAME, ...]`) plus the type's arguments, reading the dataset's column "
                             "groups (`numeric`, `categorical`) or nodes above; the last node is the output; "
                             "`freeze: true` keeps a node's parameters. Types: "
                             "those of `layers` and " + ", ".join(f"`{name}`" for name in GRAPH_TYPES
                                                                  if name not in LAYER_TYPES) + " (see "
                             "docs/tables.md).")
    target: str = option("labels", "What the model learns to give: `labels`, the dataset's target (its kind from the "
                                   "manifest); `reconstruction`, its own input (an autoencoder: the last layer gives "
                                   "one output per input feature, the loss is " + " or ".join(RECONSTRUCTION_LOSSES)
                                   + "; see docs/models.md).", ("labels", "reconstruction"))
    loss: str = option("softmax_cross_entropy", "The loss on the last layer's outputs; it must fit the dataset's "
                                                "target kind: " + ", ".join(f"{loss} ({kind})" for loss, kind
                                                                             in LOSS_TARGETS.items()) + ".", LOSSES)
    loss_options: dict = option({}, "The loss's options: " + "; ".join(
        f"{loss}: {', '.join(names)}" for loss, names in LOSS_OPTIONS.items() if names) + ". pos_weight (> 0, "
        "default 1) multiplies the positive term of the sigmoid cross-entropy; class_weights (a list of positive "
        "numbers, one per class) weigh each row by its label's weight (the mean is sum w * loss / sum w); "
        "label_smoothing (in [0, 1), default 0) trains towards (1 - eps) onehot + eps / classes, as PyTorch's; "
        "delta (> 0, default 1) is where Huber's loss turns from quadratic to linear.")
    init: str = option("xavier", "Initial weights: Glorot uniform (xavier) or He normal (he); a layer's own "
                                 "`init` wins.", INIT_SCHEMES, on_resume=ALLOWED)
    dtype: str = option("float32", "The floating-point type of parameters and activations.", ("float32", "float64"))
    init_from: str = option("", "Fine-tuning: a trained run (RUN_DIR: its best checkpoint, else its newest) or a "
                                "checkpoint file whose arrays start this model. Every parameter and running "
                                "statistic of the same name (a list's layer by position and type, 00_dense/W; a "
                                "graph's node by its name) and shape is copied, the rest start fresh; the log "
                                "names both. Read when the run starts from scratch (docs/recipes.md).",
                            on_resume=ALLOWED)

    def validate(self, where):
        self.check_domains(where, "model.")
        if self.target == "reconstruction" and self.loss not in RECONSTRUCTION_LOSSES:
            raise ConfigError(f"{where}: model.loss is {self.loss}, but model.target is reconstruction (the input is "
                              f"the target); expected {' or '.join(RECONSTRUCTION_LOSSES)}")
        try:
            for i, spec in enumerate(self.layers):
                check_layer_spec(spec, f"model.layers[{i}]")
            for i, spec in enumerate(self.graph):
                check_node_spec(spec, f"model.graph[{i}]")
            loss_options = check_loss_options(self.loss, self.loss_options, "model.loss_options")
        except ConfigError as e:  # e names the key: model.layers[i]..., model.graph[i]..., model.loss_options...
            raise ConfigError(f"{origin_of(where, str(e).split(' ')[0])}: {e}") from None
        return dataclasses.replace(self, loss_options=loss_options)


@dataclass(frozen=True)
class OptimizerConfig(Options):
    ON_RESUME = ALLOWED

    type: str = option("sgd", "The updater: SGD (with momentum or Nesterov momentum), AdaGrad, RMSProp, Adam, AdamW "
                              "(Adam with decoupled weight decay) or NAdam (Adam with Nesterov momentum), each as "
                              "PyTorch's (docs/recipes.md).", UPDATERS, on_resume=REFUSED)
    lr: float = option(0.01, "The learning rate.", domain="(0, 1000]")
    lr_decay: float = option(1.0, "Per-epoch decay: epoch e (from 0) runs at lr * lr_decay**e.", domain="(0, 1]")
    momentum: float = option(0.0, "SGD's momentum (0: plain SGD).", domain="[0, 1)")
    nesterov: bool = option(False, "SGD: Nesterov momentum instead of classical momentum.")
    l2: float = option(0.0, "L2 weight decay on weights (never on biases or batch-norm scales), added to the gradient "
                            "(PyTorch's weight_decay of SGD and Adam).", domain="[0, 1000]")
    weight_decay: float = option(0.01, "adamw: decoupled weight decay on weights (never on biases or batch-norm "
                                       "scales): each step takes lr weight_decay p from them, apart from the "
                                       "gradient (PyTorch's AdamW weight_decay).", domain="[0, 1000]")
    beta1: float = option(0.9, "Adam, AdamW, NAdam: decay of the first-moment estimate.", domain="[0, 1)")
    beta2: float = option(0.999, "Adam, AdamW, NAdam: decay of the second-moment estimate.", domain="[0, 1)")
    rho: float = option(0.95, "RMSProp: decay of the mean squared gradient.", domain="[0, 1)")
    eps: float = option(1e-8, "AdaGrad, RMSProp, Adam, AdamW, NAdam: added to the denominator.", domain="(0, 1]")
    amsgrad: bool = option(False, "adam, adamw: AMSGrad, dividing by the largest second moment so far (a third "
                                  "slot of updater state).", on_resume=REFUSED)
    momentum_decay: float = option(0.004, "nadam: the momentum of step t is beta1 (1 - 0.96^(t momentum_decay) / 2).",
                                   domain="[0, 1]")
    schedule: ScheduleOptions = section(ScheduleOptions, "How the learning rate moves during training: a schedule "
                                                         "(`type`) with its options, and a linear warm-up "
                                                         "(docs/recipes.md).")

    def validate(self, where):
        self.check_domains(where, "optimizer.")
        schedule = self.schedule.validate(where, "optimizer.schedule.")
        check_value(not self.amsgrad or self.type in ("adam", "adamw"), where, "optimizer.amsgrad", self.amsgrad,
                    f"false with optimizer.type {self.type} (AMSGrad is Adam's and AdamW's)")
        check_value(self.lr_decay == 1 or schedule.type == "constant", where, "optimizer.lr_decay", self.lr_decay,
                    f"1 with optimizer.schedule.type {schedule.type} (lr_decay is the exponential schedule by epoch: "
                    f"schedule {{type: exponential, gamma: {self.lr_decay}}}; set one of them)")
        return dataclasses.replace(self, schedule=schedule)


@dataclass(frozen=True)
class EarlyStoppingOptions(Options):
    """`train.early_stopping`: off while `monitor` is empty."""

    ON_RESUME = ALLOWED

    monitor: str = option("", "The metric of the evaluation of data.test_split that decides (loss, accuracy, auc, "
                              "average_precision, f1, r2, rmse, mae, ...); empty: no early stopping "
                              "(docs/recipes.md).")
    patience: int = option(3, "Evaluations without improvement before training stops.", domain="[1, 1e6]")
    min_delta: float = option(0.0, "The least change of the metric that counts as an improvement (absolute).",
                              domain="[0, 1e9]")
    every: int = option(1, "Evaluate every this many units.", domain="[1, 1e9]")
    unit: str = option("epoch", "What `every` counts: epoch (the evaluation at each epoch's end) or step (an "
                                "evaluation of its own after that step).", SCHEDULE_UNITS)

    def validate(self, where, prefix):
        self.check_domains(where, prefix)
        check_value(self.monitor == "" or self.monitor.isidentifier(), where, f"{prefix}monitor", self.monitor,
                    "the name of a metric, e.g. loss or accuracy")
        return self


@dataclass(frozen=True)
class TrainConfig(Options):
    ON_RESUME = ALLOWED

    epochs: int = option(1, "Epochs to train (a resumed run continues up to this many).", domain="[1, 1e6]")
    batch_size: int = option(64, "Rows of each forward and backward on each rank (a micro-batch, with accumulate): "
                                 "N ranks train on N x accumulate x batch_size rows per step (when "
                                 "global_batch_size is 0).", domain="[1, 16777216]", on_resume=AT_EPOCH_END)
    global_batch_size: int = option(0, "Rows per step (per parameter update) over all ranks; N ranks (N x "
                                       "accumulate must divide it) train on global_batch_size / N rows each, and "
                                       "step k's rows are the same on any number of ranks. 0: batch_size x "
                                       "accumulate x the number of ranks.",
                                       domain="[0, 1073741824]", on_resume=AT_EPOCH_END)
    accumulate: int = option(1, "Gradient accumulation: each step is this many micro-batches of batch_size rows on "
                                "each rank, their gradients averaged before one update (and one synchronization, "
                                "in every sync mode): the step of a batch this many times larger, in the memory of "
                                "one micro-batch (docs/recipes.md). 1: none.", domain="[1, 65536]",
                             on_resume=AT_EPOCH_END)
    seed: int = option(0, "Seeds initial weights, shuffling, dropout and augmentation.",
                       domain="[0, 1e18]", on_resume=AT_EPOCH_END)
    clip_norm: float = option(0.0, "Gradient clipping by norm: each step's gradient, as the sync mode hands it to the "
                                   "updater (allreduce: the ranks' average; the other modes: a rank's own), is scaled "
                                   "so that its L2 norm over all parameters is at most this (PyTorch's "
                                   "clip_grad_norm_). 0: no clipping.", domain="[0, 1e6]")
    tbptt_steps: int = option(0, "Truncated backpropagation through time (a class per step, model.layers): each "
                                 "batch's sequences cut into segments of this many steps, each a forward from the "
                                 "recurrent states the segment before ended with, a backward over the segment alone "
                                 "and a parameter update; the states start at zero with each batch, and a step is "
                                 "still one batch (docs/sequences.md). 0: the whole sequence at once.",
                              domain="[0, 1e6]")
    log_every: int = option(50, "Steps per metrics window (a record in metrics.jsonl, a log line on rank 0).",
                            domain="[1, 1e9]")
    watchdog_s: float = option(1800.0, "Abort the job when a rank makes no progress for this many seconds, printing "
                                       "which rank is not where the others are (the roll-call; each rank's "
                                       "collectives and stacks in RUN_DIR/forensics/).", domain="(0, 1e7]")
    straggler_factor: float = option(1.5, "Name a rank a straggler (in the log, metrics.jsonl and the report) when "
                                          "its step time less its time inside MPI is more than this many times the "
                                          "median rank's in 3 metrics windows in a row.", domain="(1, 1e6]")
    requeue: typing.Union[bool, str] = option(
        "auto", "After SIGUSR1 (the time limit's warning) stopped training (at a step with a checkpoint, or "
                "before the first step), rank 0 runs "
                "`scontrol requeue $SLURM_JOB_ID`: auto does so inside a Slurm job. Never after SIGTERM (scancel, "
                "or preemption, which Slurm requeues itself).", ("auto", True, False))
    cuda_graph: typing.Union[bool, str] = option(
        "auto", "On a GPU, record each batch shape's forward and backward as a CUDA graph after its first steps and "
                "replay it (one launch for the step's dozens of kernels); the collectives and the update run "
                "between graphs. auto: where the model allows it (no dropout, embedding table or sharded table; "
                "one pass per step), else uncaptured, saying why; true: refuse to train otherwise. Needs "
                "nvmath-python (docs/gpus.md#cuda-graphs).", ("auto", True, False))
    early_stopping: EarlyStoppingOptions = section(EarlyStoppingOptions, "Stop training once a metric of the "
                                                                         "evaluation has stopped improving, keeping "
                                                                         "the best checkpoint (docs/recipes.md).")
    trace_allocations: bool = option(False, "Measure with tracemalloc what each training step and each evaluation "
                                            "allocates after the first ones (summary.json's allocated_bytes; 0 "
                                            "but for a few Python objects: a step writes into preallocated "
                                            "workspaces). Slows training, and batches are made between the steps instead of "
                                            "in the prefetch thread: for diagnosis.")

    def global_batch(self, ranks: int) -> int:
        """The rows of one step (one parameter update) over `ranks` ranks."""
        return self.global_batch_size or self.batch_size * self.accumulate * ranks

    def validate(self, where):
        self.check_domains(where, "train.")
        return dataclasses.replace(self, early_stopping=self.early_stopping.validate(where, "train.early_stopping."))


@dataclass(frozen=True)
class SyncKeys(Options):
    """The keys of `sync` every mode reads; `SyncConfig` adds each mode's own beside them."""

    ON_RESUME = ALLOWED

    mode: str = option("allreduce", "How the ranks keep one model: allreduce (gradients every step), averaging "
                                    "(parameters every `frequency` steps), sharing (threshold-encoded updates) or "
                                    "none. See docs/sync-modes.md.", SYNCHRONIZERS)
    embeddings: str = option("auto", "allreduce and averaging: an embedding table goes by the rows the ranks "
                                     "touched (ids and values: an Allgatherv) whenever that is fewer bytes than an "
                                     "Allreduce of the table (auto), or always whole (dense). averaging sends rows "
                                     "only under an updater without state (plain SGD). See docs/tables.md.",
                             ("auto", "dense"))
    compression: str = option("none", "allreduce and averaging: the dense values on the wire: none (float32), bf16 "
                                      "or fp16 (16 bits each, summed in float32 by the rank that owns each chunk; "
                                      "fp16 scaled by a power of two per message against overflow). allreduce "
                                      "sends the gradients so (by bucket with overlap), averaging each "
                                      "rank's change since the last averaging. powersgd: each weight matrix's "
                                      "gradient (averaging: change) as rank-`powersgd_rank` factors with error "
                                      "feedback. Embedding tables go exact. See "
                                      "docs/sync-modes.md#compression.", ("none", *COMPRESSIONS, "powersgd"))
    powersgd_rank: int = option(1, "compression powersgd: the rank of each weight matrix's factors (PyTorch's "
                                   "matrix_approximation_rank; 1 sends the least, 2-4 lose less).", domain="[1, 64]")
    deterministic: bool = option(False, "allreduce: sums that do not depend on the number of ranks, so the same "
                                        "config on 1, 2, 3 or 4 ranks (train.global_batch_size fixed) ends with "
                                        "byte-identical parameters: each step's rows as micro-batches of "
                                        "`deterministic_rows`, their gradients summed exactly (int64 fixed point), "
                                        "batch norm per micro-batch, dropout and augmentation keyed by the "
                                        "micro-batch's place in the global batch. Slower; see "
                                        "docs/sync-modes.md#deterministic.")
    deterministic_rows: int = option(8, "sync.deterministic: the rows of each micro-batch; it must divide the rows "
                                        "each rank trains on per step (train.global_batch_size / ranks) at every "
                                        "rank count you compare.", domain="[1, 1e6]")
    check_replicas: bool = option(True, "Compare a hash of the parameters across ranks at every epoch end (modes "
                                        "that promise identical replicas).")

    def validate(self, where, key: str = "sync"):
        """Every key checked, each mode's by its own `Options.validate` (whichever mode runs: a run's config.yaml
        holds them all), and normalized (`true` options as their defaults)."""
        self.check_domains(where, f"{key}.")
        check_value(not (key == "pretrain.sync" and self.mode == "auto"), where, f"{key}.mode", self.mode,
                    "allreduce, averaging, sharing or none (auto chooses among a network's modes at epoch ends)")
        check_value(not self.deterministic or key == "sync", where, f"{key}.deterministic", self.deterministic,
                    "false (pretraining's sums are not made exact)")
        check_value(not self.deterministic or self.mode == "allreduce", where, f"{key}.mode", self.mode,
                    "allreduce with sync.deterministic: true (the mode whose sums it makes exact)")
        check_value(not self.deterministic or self.compression == "none", where, f"{key}.compression",
                    self.compression, "none with sync.deterministic: true (exact sums of rounded values would "
                                      "not be the same on every rank count)")
        normalized = {}
        for synchronizer in SYNCHRONIZERS.values():
            options = options_of(synchronizer.Options, self).validate(where, f"{key}.")
            normalized.update({f.name: getattr(options, f.name) for f in dataclasses.fields(options)})
        return dataclasses.replace(self, **normalized)


def _sync_config():
    """SyncConfig: `SyncKeys` and every mode's own keys (`Synchronizer.Options`, declared beside the mode), flat
    under `sync` as a user writes them; a key whose option leaves its rule on resume to its class gets that class's
    (`Options.ON_RESUME`)."""
    fields = []
    for synchronizer in SYNCHRONIZERS.values():
        hints = typing.get_type_hints(synchronizer.Options)
        for f in dataclasses.fields(synchronizer.Options):
            metadata = {**f.metadata, "on_resume": f.metadata["on_resume"] or synchronizer.Options.ON_RESUME}
            fields.append((f.name, hints[f.name], field(default=f.default, default_factory=f.default_factory,
                                                        metadata=metadata)))
    cls = dataclasses.make_dataclass("SyncConfig", fields, bases=(SyncKeys,), frozen=True)
    cls.__module__, cls.__doc__ = __name__, "How the ranks keep one model: every key of `sync`."
    return cls


SyncConfig = _sync_config()


@dataclass(frozen=True)
class PretrainConfig(Options):
    """Greedy layer-wise RBM pretraining of a deep belief net (mpitrain.training.pretrain); off while `layers` is empty."""

    ON_RESUME = ALLOWED

    layers: list = option([], "Hidden units per RBM, e.g. [500, 500, 2000]; empty: no pretraining.",
                          on_resume=REFUSED)
    epochs: int = option(10, "Epochs per layer.", domain="[1, 1e6]")
    cd_k: int = option(1, "Gibbs steps of contrastive divergence (CD-k).", domain="[1, 1000]")
    persistent: bool = option(False, "Persistent CD: fantasy particles kept between batches.")
    lr: float = option(0.1, "The RBMs' learning rate (SGD).", domain="(0, 1000]")
    momentum: float = option(0.5, "The RBMs' SGD momentum.", domain="[0, 1)")
    weight_decay: float = option(2.0e-4, "L2 on the RBMs' weights.", domain="[0, 1000]")
    sparsity_target: float = option(0.0, "Target mean activation of the hidden units (0: no sparsity penalty).",
                                    domain="[0, 1)")
    sparsity_cost: float = option(0.1, "Weight of the sparsity penalty.", domain="[0, 1000]")
    visible: str = option("bernoulli", "The first RBM's visible units: bernoulli (inputs in [0, 1]) or gaussian "
                                       "(standardized inputs).", VISIBLE_UNITS)
    sample_visible: bool = option(False, "Sample the visible units in the Gibbs chain (else use their means).")
    propagate: str = option("mean", "The next layer trains on the layers below's mean activations, or samples of "
                                    "them.", PROPAGATE)
    monitor_rows: int = option(2000, "Rows per rank for the per-epoch reconstruction error (0: all).",
                               domain="[0, 1e15]")
    pll_max_visible: int = option(100, "Pseudo-log-likelihood for Bernoulli RBMs of up to this many visible units.",
                                  domain="[0, 16777216]")
    sync: SyncConfig = section(SyncConfig, "How the ranks keep one RBM (the keys of `sync`; default averaging once "
                                           "per epoch).", lambda: SyncConfig(mode="averaging", frequency="epoch"))

    def validate(self, where):
        ok = all(isinstance(units, int) and not isinstance(units, bool) and 1 <= units <= MAX_UNITS
                 for units in self.layers)
        check_value(ok, where, "pretrain.layers", self.layers,
               f"a list of hidden-unit counts in [1, {MAX_UNITS}], e.g. [500, 500, 2000]")
        self.check_domains(where, "pretrain.")
        return dataclasses.replace(self, sync=self.sync.validate(where, "pretrain.sync"))


@dataclass(frozen=True)
class CheckpointConfig(Options):
    ON_RESUME = ALLOWED

    every: int = option(1, "Checkpoint every this many units.", domain="[1, 1e9]")
    unit: str = option("epoch", "What `every` counts: epochs or steps (a mid-epoch checkpoint resumes at its step).",
                       ("epoch", "step", "steps"))
    keep: int = option(3, "Keep the newest this many checkpoints (the last one of a run is always written).",
                       domain="[1, 1e6]")

    def validate(self, where):
        self.check_domains(where, "checkpoint.")
        return dataclasses.replace(self, unit="step" if self.unit == "steps" else self.unit)


@dataclass(frozen=True)
class CommConfig(Options):
    ON_RESUME = ALLOWED

    cuda_aware: typing.Union[bool, str] = option(
        "auto", "Whether MPI reads device (GPU) buffers itself: auto asks the MPI library; false stages collectives "
                "through pinned host memory.", ("auto", True, False))
    device_collectives: str = option(
        "auto", "How device (GPU) buffers are summed and broadcast: nccl through NCCL (each rank needs a GPU of its "
                "own), mpi through MPI, auto NCCL where every rank of every node has its own GPU and cupy has NCCL. "
                "The other collectives always go through MPI.", ("auto", "nccl", "mpi"))

    def validate(self, where):
        self.check_domains(where, "comm.")
        return self


@dataclass(frozen=True)
class Config(Options):
    ON_RESUME = ALLOWED

    data: DataConfig = section(DataConfig, "The dataset and how batches are made of it.")
    model: ModelConfig = section(ModelConfig, "The network.")
    optimizer: OptimizerConfig = section(OptimizerConfig, "The updater (each rank's step from its gradient).")
    train: TrainConfig = section(TrainConfig, "The training loop.")
    sync: SyncConfig = section(SyncConfig, "How the ranks keep one model.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "When checkpoints are written and how many are kept.")
    comm: CommConfig = section(CommConfig, "Collectives.")
    pretrain: PretrainConfig = section(PretrainConfig, "Greedy RBM pretraining of a deep belief net.")
    backend: str = option("numpy", "The array backend: numpy (CPU), cupy (GPU), or auto (cupy when a GPU is "
                                   "available).", BACKENDS)
    run_dir: str = option("", "The run directory (default: runs/NAME for a config file NAME.yaml).")
    resume: str = option("auto", "auto: continue from the run directory's newest good checkpoint (damaged ones are "
                                 "set aside as *.damaged; left with only those, the run is refused until you say "
                                 "never); never: start from scratch, refusing a run directory that holds good "
                                 "checkpoints. A start from scratch moves an earlier run's records to "
                                 "RUN_DIR/earlier-N.", ("auto", "never"))
    report: bool = option(True, "Rank 0 draws RUN_DIR/report.png and report.html at the end of training.")

    def validate(self, where) -> Config:
        """The config with every section checked against its domain and normalized (a new object: configs are
        frozen); a value out of its domain is a ConfigError naming `where` and the key."""
        _check_finite(self, where, "")
        config = dataclasses.replace(self, **{name: getattr(self, name).validate(where) for name in SECTIONS})
        config.check_domains(where, "")
        model, pretrain = config.model, config.pretrain
        check_value(len(model.layers) > 0 or len(pretrain.layers) > 0 or len(model.graph) > 0, where, "model.layers",
               model.layers, "a non-empty list of layers (or model.graph's nodes, or pretrain.layers, from which a "
                             "deep belief net's layers are built)")
        check_value(not (model.layers and model.graph), where, "model.graph", f"{len(model.graph)} nodes",
               "empty beside model.layers (a model is a list of layers or a graph of nodes, not both)")
        check_value(not (model.graph and pretrain.layers), where, "pretrain.layers", pretrain.layers,
               "empty with model.graph (a deep belief net is pretrained for a list of dense layers)")
        check_value(config.train.cuda_graph is not True or config.backend != "numpy", where, "train.cuda_graph", True,
                    "auto or false with backend: numpy (a CUDA graph is a GPU's)")
        check_value(config.train.accumulate == 1 or not config.train.tbptt_steps, where, "train.accumulate",
                    config.train.accumulate, "1 with train.tbptt_steps (truncated BPTT updates after each segment)")
        if config.sync.deterministic:
            for key, value, default, why in (
                    ("train.accumulate", config.train.accumulate, 1, "its micro-batches are sync.deterministic_rows"),
                    ("train.tbptt_steps", config.train.tbptt_steps, 0, "segments are not cut into exact sums"),
                    ("pretrain.layers", pretrain.layers, [], "pretraining is not deterministic across rank counts")):
                check_value(value == default, where, key, value, f"{default} with sync.deterministic: true ({why})")
        for i, node in enumerate(model.graph):
            if isinstance(node, dict) and node.get("shard") == "rows":
                _check_sharded(config, where, f"model.graph[{i}]", node)
        try:
            check_layers(config.train.tbptt_steps, model.layers, model.graph)
        except ConfigError as e:
            raise ConfigError(f"{origin_of(where, 'train.tbptt_steps')}: {e}") from None
        if pretrain.layers and pretrain.visible == "bernoulli":
            check_value(not config.data.normalize, where, "data.normalize", config.data.normalize,
                   "false with pretrain.visible: bernoulli (Bernoulli units take inputs in [0, 1]; "
                   "or use pretrain.visible: gaussian for standardized inputs)")
        return config

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = ("data", "model", "optimizer", "train", "sync", "checkpoint", "comm", "pretrain")


def _check_sharded(config: Config, where, key: str, node: dict) -> None:
    """Refuse what a node with `shard: rows` (`key`) does not train with in this version (docs/tables.md), naming the
    key that must change and why."""
    for name, value, expected, why in (
            ("sync.deterministic", config.sync.deterministic, False, "its micro-batches would exchange rows each"),
            ("train.accumulate", config.train.accumulate, 1, "its micro-batches would exchange rows each"),
            ("train.tbptt_steps", config.train.tbptt_steps, 0, "a table reads no sequence"),
            ("train.clip_norm", config.train.clip_norm, 0.0, "the norm would need every rank's rows"),
            ("backend", config.backend, "numpy", "sharded rows live in host memory in this version"),
            ("model.init_from", config.model.init_from, "", "its rows would start fresh: not copied yet"),
            (f"{key}.freeze", node.get("freeze", False), False, "a frozen table is read whole, so keep it unsharded")):
        check_value(value == expected, where, name, value, f"{shown(expected)} with {key}.shard: rows ({why})")


def load_config(path: str, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config, apply `section.key=value` overrides, validate, resolve paths.

    `run_dir` defaults to `runs/<config file stem>`; `--set run_dir=...` wins over the file's.
    `data.path` and `run_dir` become absolute, so the saved `RUN_DIR/config.yaml` works from any
    directory. (What a run's own config.yaml trains is the run directory's rule:
    `mpitrain.rundir.directory.load_run_config`.)
    """
    raw = read_yaml_file(path, "config file")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    where = Origin(path)
    for override in overrides:
        _apply_override(raw, override, where)
    config = _build(Config, raw, where, "").validate(where)
    run_dir = config.run_dir or os.path.join("runs", os.path.splitext(os.path.basename(path))[0])
    return dataclasses.replace(config, run_dir=os.path.abspath(run_dir),
                               data=dataclasses.replace(config.data, path=config.data.path if is_url(config.data.path)
                                                        else os.path.abspath(config.data.path)))


def ignored_options(config: Config) -> list[str]:
    """The options a config sets (away from their defaults) for a sync mode it does not use, e.g. sync.threshold
    under allreduce: training warns about them."""
    ignored = []
    for key, sync, default in (("sync", config.sync, SyncConfig()),
                               ("pretrain.sync", config.pretrain.sync, PretrainConfig().sync)):
        default = dataclasses.replace(default, mode=sync.mode).validate(key)
        ignored += [f"{key}.{f.name} (read by {mode} only; {key}.mode is {sync.mode})"
                    for mode, synchronizer in SYNCHRONIZERS.items() if mode != sync.mode
                    for f in dataclasses.fields(synchronizer.Options)
                    if getattr(sync, f.name) != getattr(default, f.name)]
    return ignored


def recorded_config(text: str, where: str, overrides: typing.Sequence[str] = ()) -> Config:
    """The config a checkpoint records (`config_yaml`'s text: resolved, its paths absolute), with `overrides`
    (`section.key=value`) applied, validated; a record that does not read back is a ConfigError naming `where`."""
    origin = Origin(where)
    raw = read_yaml(text, f"{where}: its recorded config", in_file=False)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: its recorded config is not a mapping of sections")
    for override in overrides:
        _apply_override(raw, override, origin)
    return _build(Config, raw, origin, "").validate(origin)


def config_yaml(config: Config) -> str:
    """`config` as YAML, as RUN_DIR/config.yaml and every checkpoint store it."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


class Origin(str):
    """A config file's path that knows which keys `--set` overrides gave: a problem with one of those keys names
    the override (`--set train.epochs=abc: ...`), not the file."""

    def __new__(cls, path: str):
        origin = super().__new__(cls, path)
        origin.overrides = {}
        return origin

    def of(self, key: str) -> str:
        """Where `key` (dotted) got its value: `--set KEY=VALUE` for a key an override set (or one inside it), else
        the file."""
        for set_key, override in reversed(self.overrides.items()):
            if key == set_key or key.startswith((set_key + ".", set_key + "[")):
                return f"--set {override}"
        return str(self)


def _apply_override(raw: dict, override: str, where: Origin) -> None:
    key, sep, text = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {override}: expected section.key=value")
    value = read_yaml(text, f"--set {override}", in_file=False)
    where.overrides.pop(key, None)  # the last override of a key wins, and names it
    where.overrides[key] = override
    *sections, last = key.split(".")
    node = raw
    for part in sections:  # a number indexes a list: model.layers.0.units
        node = _item(node, part, override) if isinstance(node, list) else node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"--set {override}: {part!r} is not a section")
    if isinstance(node, list):
        _item(node, last, override)
        node[int(last)] = value
    else:
        node[last] = value


def _item(items: list, index: str, override: str):
    """`items[index]` for a --set key's list index, or a ConfigError saying which indexes there are."""
    if not index.isdigit() or int(index) >= len(items):
        raise ConfigError(f"--set {override}: {index!r} is not an index of a list of {len(items)} items "
                          f"(expected 0 to {len(items) - 1})")
    return items[int(index)]


def config_keys(cls=None, prefix: str = "") -> list[str]:
    """Every dotted key of the config (sections and their keys), for did-you-mean."""
    keys = []
    for f in dataclasses.fields(cls or Config):
        keys.append(prefix + f.name)
        kind = typing.get_type_hints(cls or Config)[f.name]
        if dataclasses.is_dataclass(kind):
            keys += config_keys(kind, f"{prefix}{f.name}.")
    return keys


def _build(cls, raw, where: str, prefix: str, base=None):
    """Turn a mapping into dataclass `cls` (keys missing from it keep `base`'s values, or the class defaults),
    rejecting unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin_of(where, prefix[:-1])}: {prefix or 'config'} is {shown(raw)}, expected a mapping")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        key = prefix + str(unknown[0])
        close = difflib.get_close_matches(key, [prefix + name for name in known], n=1) or \
            difflib.get_close_matches(key, config_keys(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{origin_of(where, key)}: unknown key {key!r}; {hint}expected one of {sorted(known)}")
    base = base if base is not None else cls()
    values = {}
    for name, value in raw.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            values[name] = _build(kind, value, where, f"{prefix}{name}.", getattr(base, name))
        else:
            values[name] = coerce(value, kind, where, prefix + name)
    return dataclasses.replace(base, **values)


def _check_finite(value, where: str, key: str) -> None:
    """Every number anywhere in a config (sections, option mappings, layer and node entries) must be finite: the
    range checks beside each key compare with <, which .inf passes and .nan fails silently."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            _check_finite(getattr(value, f.name), where, f"{key}{f.name}.")
    elif isinstance(value, dict):
        for name, item in value.items():
            _check_finite(item, where, f"{key}{name}.")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, where, f"{key[:-1]}[{i}].")
    elif isinstance(value, float):
        check_value(math.isfinite(value), where, key[:-1], value, "a finite number (not .inf or .nan)")
