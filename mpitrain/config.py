"""Run configuration: YAML sections validated into dataclasses, with `--set section.key=value` overrides.

Every error names the config file and the dotted key, and says what was expected.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field

import yaml

from mpitrain.augment import AUGMENT_DEFAULTS
from mpitrain.backend import BACKENDS
from mpitrain.errors import ConfigError
from mpitrain.nn.rbm import VISIBLE_UNITS

SYNC_MODES = ("none", "allreduce", "averaging", "sharing")
ENCODINGS = ("auto", "sparse", "bitmap")
ADAPTIVE_DEFAULTS = {"min_sparsity": 1.0e-4, "max_sparsity": 1.0e-2, "decay": 0.965936}
RESIDUAL_CLIP_DEFAULTS = {"factor": 5.0, "every": 5}
OPTIMIZERS = ("sgd", "adagrad", "adam", "rmsprop")
PROPAGATE = ("mean", "sample")


@dataclass
class DataConfig:
    path: str = ""
    train_split: str = "train"
    test_split: str = "test"
    normalize: bool = True
    verify_checksums: bool = True
    shuffle: bool = True
    max_rows: int = 0  # use only the first max_rows rows of each split (0: all)
    prefetch: bool = True
    augment: typing.Union[bool, dict] = False  # training images: false, true (defaults) or {flip, shift}

    def validate(self, where):
        _check(self.path != "", where, "data.path", self.path, "the dataset folder written by `mpitrain etl`")
        _check(self.max_rows >= 0, where, "data.max_rows", self.max_rows, "0 (all rows) or a positive count")
        self.augment = _options(self.augment, AUGMENT_DEFAULTS, where, "data.augment")
        if self.augment:
            _check(self.augment["shift"] >= 0, where, "data.augment.shift", self.augment["shift"],
                   "a number of pixels >= 0")


@dataclass
class ModelConfig:
    layers: list = field(default_factory=list)
    loss: str = "softmax_cross_entropy"
    init: str = "xavier"
    dtype: str = "float32"

    def validate(self, where):
        _check(self.dtype in ("float32", "float64"), where, "model.dtype", self.dtype, "float32 or float64")


@dataclass
class OptimizerConfig:
    type: str = "sgd"
    lr: float = 0.01
    lr_decay: float = 1.0  # the learning rate of epoch e is lr * lr_decay**e
    momentum: float = 0.0
    nesterov: bool = False
    l2: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    rho: float = 0.95
    eps: float = 1e-8

    def validate(self, where):
        _check(self.type in OPTIMIZERS, where, "optimizer.type", self.type, f"one of {OPTIMIZERS}")
        _check(self.lr > 0, where, "optimizer.lr", self.lr, "a positive number")
        _check(0 < self.lr_decay <= 1, where, "optimizer.lr_decay", self.lr_decay, "a number in (0, 1]")
        for key in ("momentum", "beta1", "beta2", "rho"):
            value = getattr(self, key)
            _check(0 <= value < 1, where, f"optimizer.{key}", value, "a number in [0, 1)")
        _check(self.l2 >= 0, where, "optimizer.l2", self.l2, "a number >= 0")
        _check(self.eps > 0, where, "optimizer.eps", self.eps, "a positive number")


@dataclass
class TrainConfig:
    epochs: int = 1
    batch_size: int = 64  # per rank
    seed: int = 0
    log_every: int = 50  # steps per metrics window
    watchdog_s: float = 1800.0  # abort the job when a rank makes no progress for this long

    def validate(self, where):
        for key in ("epochs", "batch_size", "log_every"):
            _check(getattr(self, key) >= 1, where, f"train.{key}", getattr(self, key), "an integer >= 1")
        _check(self.watchdog_s > 0, where, "train.watchdog_s", self.watchdog_s, "a positive number of seconds")


@dataclass
class SyncConfig:
    mode: str = "allreduce"
    frequency: typing.Union[int, str] = 1  # steps between averagings, or "epoch"
    average_updater: bool = False
    check_replicas: bool = True
    threshold: float = 1.0e-3  # sharing: the initial tau
    adaptive: typing.Union[bool, dict] = True  # sharing: false, true (defaults) or {min_sparsity, ...}
    residual_clip: typing.Union[bool, dict] = True  # sharing: false, true (defaults) or {factor, every}
    encoding: str = "auto"  # sharing: auto | sparse | bitmap

    def validate(self, where, section: str = "sync"):
        _check(self.mode in SYNC_MODES, where, f"{section}.mode", self.mode, f"one of {SYNC_MODES}")
        ok = self.frequency == "epoch" or (isinstance(self.frequency, int) and self.frequency >= 1)
        _check(ok, where, f"{section}.frequency", self.frequency, "a number of steps >= 1, or 'epoch'")
        _check(self.threshold > 0, where, f"{section}.threshold", self.threshold, "a positive number")
        _check(self.encoding in ENCODINGS, where, f"{section}.encoding", self.encoding, f"one of {ENCODINGS}")
        self.adaptive = _options(self.adaptive, ADAPTIVE_DEFAULTS, where, f"{section}.adaptive")
        if self.adaptive:
            a = self.adaptive
            _check(0 < a["min_sparsity"] < a["max_sparsity"] <= 1, where, f"{section}.adaptive",
                   a, "0 < min_sparsity < max_sparsity <= 1")
            _check(0 < a["decay"] < 1, where, f"{section}.adaptive.decay", a["decay"], "a number in (0, 1)")
        self.residual_clip = _options(self.residual_clip, RESIDUAL_CLIP_DEFAULTS, where, f"{section}.residual_clip")
        if self.residual_clip:
            c = self.residual_clip
            _check(c["factor"] >= 1, where, f"{section}.residual_clip.factor", c["factor"], "a number >= 1")
            _check(isinstance(c["every"], int) and c["every"] >= 1, where, f"{section}.residual_clip.every",
                   c["every"], "an integer >= 1")


@dataclass
class PretrainConfig:
    """Greedy layer-wise RBM pretraining of a deep belief net (mpitrain.pretrain); off while `layers` is empty."""

    layers: list = field(default_factory=list)  # hidden units per RBM, e.g. [500, 500, 2000]
    epochs: int = 10  # per layer
    cd_k: int = 1
    persistent: bool = False  # persistent CD (fantasy particles kept between batches)
    lr: float = 0.1
    momentum: float = 0.5
    weight_decay: float = 2.0e-4  # L2 on the weights
    sparsity_target: float = 0.0  # 0: no sparsity penalty
    sparsity_cost: float = 0.1
    visible: str = "bernoulli"  # the first RBM's visible units: bernoulli (inputs in [0, 1]) or gaussian
    sample_visible: bool = False  # sample visible units in the Gibbs chain (else use their means)
    propagate: str = "mean"  # the next layer trains on the previous layers' mean activations, or samples
    monitor_rows: int = 2000  # rows per rank for the per-epoch reconstruction error (0: all)
    pll_max_visible: int = 100  # pseudo-log-likelihood for Bernoulli RBMs up to this many visible units
    sync: SyncConfig = field(default_factory=lambda: SyncConfig(mode="averaging", frequency="epoch"))

    def validate(self, where):
        ok = all(isinstance(units, int) and not isinstance(units, bool) and units >= 1 for units in self.layers)
        _check(ok, where, "pretrain.layers", self.layers, "a list of hidden-unit counts >= 1, e.g. [500, 500, 2000]")
        for key in ("epochs", "cd_k"):
            _check(getattr(self, key) >= 1, where, f"pretrain.{key}", getattr(self, key), "an integer >= 1")
        _check(self.lr > 0, where, "pretrain.lr", self.lr, "a positive number")
        _check(0 <= self.momentum < 1, where, "pretrain.momentum", self.momentum, "a number in [0, 1)")
        _check(self.weight_decay >= 0, where, "pretrain.weight_decay", self.weight_decay, "a number >= 0")
        _check(0 <= self.sparsity_target < 1, where, "pretrain.sparsity_target", self.sparsity_target,
               "a number in [0, 1) (0: no sparsity penalty)")
        _check(self.sparsity_cost >= 0, where, "pretrain.sparsity_cost", self.sparsity_cost, "a number >= 0")
        _check(self.visible in VISIBLE_UNITS, where, "pretrain.visible", self.visible, f"one of {VISIBLE_UNITS}")
        _check(self.propagate in PROPAGATE, where, "pretrain.propagate", self.propagate, f"one of {PROPAGATE}")
        for key in ("monitor_rows", "pll_max_visible"):
            _check(getattr(self, key) >= 0, where, f"pretrain.{key}", getattr(self, key), "an integer >= 0")
        self.sync.validate(where, "pretrain.sync")


@dataclass
class CheckpointConfig:
    every: int = 1
    unit: str = "epoch"
    keep: int = 3

    def validate(self, where):
        _check(self.every >= 1, where, "checkpoint.every", self.every, "an integer >= 1")
        _check(self.unit in ("epoch", "step", "steps"), where, "checkpoint.unit", self.unit, "'epoch' or 'steps'")
        self.unit = "step" if self.unit == "steps" else self.unit
        _check(self.keep >= 1, where, "checkpoint.keep", self.keep, "an integer >= 1")


@dataclass
class CommConfig:
    cuda_aware: typing.Union[bool, str] = "auto"  # MPI reads device buffers: auto (ask MPI) | true | false

    def validate(self, where):
        _check(self.cuda_aware in ("auto", True, False), where, "comm.cuda_aware", self.cuda_aware,
               "auto, true or false")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    backend: str = "numpy"  # numpy | cupy | auto (cupy when a GPU is available)
    run_dir: str = ""
    resume: str = "auto"
    report: bool = True  # rank 0 draws RUN_DIR/report.png and report.html at the end of training

    def validate(self, where):
        for section in (self.data, self.model, self.optimizer, self.train, self.sync, self.checkpoint, self.comm,
                        self.pretrain):
            section.validate(where)
        _check(self.backend in BACKENDS, where, "backend", self.backend, f"one of {BACKENDS}")
        _check(len(self.model.layers) > 0 or len(self.pretrain.layers) > 0, where, "model.layers", self.model.layers,
               "a non-empty list of layers (or pretrain.layers, from which a deep belief net's layers are built)")
        if self.pretrain.layers and self.pretrain.visible == "bernoulli":
            _check(not self.data.normalize, where, "data.normalize", self.data.normalize,
                   "false with pretrain.visible: bernoulli (Bernoulli units take inputs in [0, 1]; "
                   "or use pretrain.visible: gaussian for standardized inputs)")
        _check(self.resume in ("auto", "never"), where, "resume", self.resume, "'auto' or 'never'")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_config(path: str, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config, apply `section.key=value` overrides, validate, resolve paths.

    `run_dir` defaults to `runs/<config file stem>`; `data.path` and `run_dir` become
    absolute, so the saved `RUN_DIR/config.yaml` works from any directory.
    """
    try:
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    for override in overrides:
        _apply_override(raw, override, path)
    config = _build(Config, raw, path, "")
    config.validate(path)
    if not config.run_dir:
        config.run_dir = os.path.join("runs", os.path.splitext(os.path.basename(path))[0])
    config.run_dir = os.path.abspath(config.run_dir)
    config.data.path = os.path.abspath(config.data.path)
    return config


def save_config(config: Config, path: str) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(config.to_dict(), f, sort_keys=False)


def _apply_override(raw: dict, override: str, where: str) -> None:
    key, sep, text = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {override!r}: expected section.key=value")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {override!r}: value is not valid YAML ({e})") from None
    *sections, last = key.split(".")
    node = raw
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: --set {key}: {section!r} is not a section")
    node[last] = value


def _build(cls, raw, where: str, prefix: str, base=None):
    """Turn a mapping into dataclass `cls` (keys missing from it keep `base`'s values, or the class defaults),
    rejecting unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {prefix or 'config'} is {raw!r}, expected a mapping")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), known, n=1)
        hint = f"did you mean {prefix + close[0]!r}? " if close else ""
        raise ConfigError(f"{where}: unknown key {prefix + str(unknown[0])!r}; {hint}expected one of {sorted(known)}")
    base = base if base is not None else cls()
    values = {}
    for name, value in raw.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            values[name] = _build(kind, value, where, f"{prefix}{name}.", getattr(base, name))
        else:
            values[name] = _coerce(value, kind, where, prefix + name)
    return dataclasses.replace(base, **values)


def _coerce(value, kind, where: str, key: str):
    allowed = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    for option in allowed:
        option = typing.get_origin(option) or option
        if option is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if option is float and isinstance(value, str):
            try:
                return float(value)  # PyYAML reads `1e-3` (no dot) as a string
            except ValueError:
                pass
        if isinstance(value, option) and not (option is int and isinstance(value, bool)):
            return value
    names = " or ".join(getattr(a, "__name__", str(a)) for a in allowed)
    raise ConfigError(f"{where}: {key} is {value!r}, expected {names}")


def _options(value, defaults: dict, where: str, key: str):
    """An optional feature: false stays false, true -> the defaults, a mapping -> the defaults updated by it."""
    if value is False:
        return False
    if value is True:
        return dict(defaults)
    unknown = sorted(set(value) - set(defaults))
    if unknown:
        raise ConfigError(f"{where}: unknown key {key}.{unknown[0]}; expected one of {sorted(defaults)}")
    merged = dict(defaults)
    for name, item in value.items():
        merged[name] = _coerce(item, type(defaults[name]), where, f"{key}.{name}")
    return merged


def _check(ok: bool, where: str, key: str, value, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {key} is {value!r}, expected {expected}")
