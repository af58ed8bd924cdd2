"""The study file: a base config, a search space over the keys `--set` takes, an objective, a budget, a sampler and
a pruner; every key checked when it is read, each mistake one line naming the file and the key.

    base: configs/fashion_mlp.yaml
    objective: {metric: validation.accuracy, direction: maximize}
    trials: 12
    sampler: tpe          # tpe | random | grid, or {type: tpe, n_startup_trials: 4} (Optuna's arguments)
    pruner: median        # median | asha | none, or {type: median, n_startup_trials: 1}
    space:
      optimizer.lr: {float: [0.001, 0.3], log: true}
      model.layers.0.units: {int: [32, 256]}
      sync.mode: {choice: [allreduce, sharing]}

Each space key is tried on the base config at both ends of its range (every choice of a list) with
`load_config(base, overrides)`, so a key the config does not have, or a value outside its domain, is refused
here, before any trial starts. The objective is `SPLIT.METRIC` of the evaluation after every epoch
(`data.test_split` of a trial is SPLIT): the test split is refused unless `allow_test_split: true` says so,
since a model picked on its test score no longer has an unseen score.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import os
from dataclasses import dataclass

import yaml

from mpitrain.base.errors import ConfigError, MpitrainError
from mpitrain.config.sections import Config, load_config
from mpitrain.config.yaml_input import read_yaml_file
from mpitrain.data.shards import read_manifest

SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "grid": "GridSampler"}
PRUNERS = {"median": "MedianPruner", "asha": "SuccessiveHalvingPruner", "none": "NopPruner"}
METRICS = {"accuracy": "maximize", "loss": "minimize"}  # what the epoch's evaluation reports, and its natural way
KEYS = {"base", "objective", "trials", "sampler", "pruner", "space", "seed", "folder", "heartbeat_s", "retries"}
OBJECTIVE_KEYS = {"metric", "direction", "allow_test_split"}
KINDS = ("float", "int", "choice")
STUDY_FILE = "study.yaml"  # the folder's copy of the study file, with absolute paths: what workers read


@dataclass(frozen=True)
class Objective:
    split: str
    metric: str
    direction: str
    allow_test_split: bool = False


@dataclass(frozen=True)
class Study:
    """A checked study file: `space` maps a dotted config key to its {float|int|choice: ..., log, step} entry."""

    path: str
    folder: str
    base: str
    objective: Objective
    trials: int
    sampler: dict
    pruner: dict
    space: dict
    seed: int = 0
    heartbeat_s: float = 60.0
    retries: int = 3

    @property
    def grid(self) -> list[dict]:
        """Every point of a grid study, in a fixed order ([] for the other samplers)."""
        if self.sampler["type"] != "grid":
            return []
        axes = {key: grid_values(entry) for key, entry in self.space.items()}
        return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]

    def to_dict(self) -> dict:
        """The study as a study file says it (what the folder's study.yaml records)."""
        record = dataclasses.asdict(self)
        record.pop("path")
        objective = record["objective"]
        record["objective"] = {"metric": f"{objective['split']}.{objective['metric']}",
                               "direction": objective["direction"], "allow_test_split": objective["allow_test_split"]}
        return record

    def trial_config(self, params: dict, run_dir: str) -> Config:
        """The config of a trial with `params`, training into `run_dir` and evaluating the objective's split."""
        return load_config(self.base, overrides(params) + [f"data.test_split={self.objective.split}",
                                                             f"run_dir={run_dir}"])


def overrides(params: dict) -> list[str]:
    """`--set` strings for `params` (JSON is YAML, so every value reads back as it was)."""
    return [f"{key}={json.dumps(value)}" for key, value in params.items()]


def grid_values(entry: dict) -> list:
    if "choice" in entry:
        return list(entry["choice"])
    low, high = entry["int"]
    return list(range(low, high + 1, entry.get("step", 1)))


def load_study(path: str) -> Study:
    """Read and check a study file, or the `study.yaml` of a study folder; a ConfigError names the file and key."""
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, STUDY_FILE)):
        path = os.path.join(path, STUDY_FILE)
    raw = read_yaml_file(path, "study file")
    _known(raw, KEYS, path, "")
    for key in ("base", "objective", "space"):
        if key not in raw:
            raise ConfigError(f"{path}: {key} is missing; expected " + {
                "base": "the config file the trials start from, e.g. base: configs/fashion_mlp.yaml",
                "objective": "{metric: validation.accuracy, direction: maximize}",
                "space": "a mapping of config keys to {float: [low, high]}, {int: [low, high]} or {choice: [...]}"}[key])
    base = os.path.abspath(_typed(raw["base"], str, path, "base"))
    try:
        base_config = load_config(base)
    except MpitrainError as e:
        raise ConfigError(f"{path}: base: {e}") from None
    space = _space(raw["space"], path, base)
    sampler, pruner = _algorithm(raw.get("sampler", "tpe"), SAMPLERS, path, "sampler"), \
        _algorithm(raw.get("pruner", "median"), PRUNERS, path, "pruner")
    study = Study(path=path, folder=_folder(raw, path), base=base, objective=_objective(raw["objective"], path,
                                                                                         base_config),
                  trials=0, sampler=sampler, pruner=pruner, space=space,
                  seed=_typed(raw.get("seed", 0), int, path, "seed"),
                  heartbeat_s=float(_typed(raw.get("heartbeat_s", 60.0), (int, float), path, "heartbeat_s")),
                  retries=_typed(raw.get("retries", 3), int, path, "retries"))
    _check(study.heartbeat_s > 0, path, "heartbeat_s", study.heartbeat_s, "a number of seconds > 0")
    _check(study.retries >= 0, path, "retries", study.retries, "an integer >= 0")
    return dataclasses.replace(study, trials=_budget(raw.get("trials"), study, path))


def _known(raw, known: set, path: str, prefix: str) -> None:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {prefix.rstrip('.') or 'the study file'} is {raw!r}, expected a mapping")
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown key {prefix + str(unknown[0])!r}; expected one of {sorted(known)}")


def _typed(value, kind, path: str, key: str):
    if not isinstance(value, kind) or isinstance(value, bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ConfigError(f"{path}: {key} is {value!r}, expected {'a' if names[0] not in 'aeiou' else 'an'} {names}")
    return value


def _check(ok: bool, path: str, key: str, value, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {key} is {value!r}, expected {expected}")


def _folder(raw: dict, path: str) -> str:
    """The study's folder: `folder`, or the study file's path without its extension (studies/digits.yaml ->
    studies/digits)."""
    return os.path.abspath(_typed(raw["folder"], str, path, "folder") if "folder" in raw
                           else os.path.splitext(path)[0])


def _objective(raw, path: str, base_config: Config) -> Objective:
    _known(raw, OBJECTIVE_KEYS, path, "objective.")
    metric = _typed(raw.get("metric", ""), str, path, "objective.metric")
    split, _, name = metric.rpartition(".")
    _check(bool(split) and name in METRICS, path, "objective.metric", metric,
           f"SPLIT.METRIC with METRIC one of {sorted(METRICS)} (what the evaluation after every epoch reports), "
           "e.g. validation.accuracy")
    direction = raw.get("direction", METRICS[name])
    _check(direction in ("maximize", "minimize"), path, "objective.direction", direction, "maximize or minimize")
    allow = raw.get("allow_test_split", False)
    _check(isinstance(allow, bool), path, "objective.allow_test_split", allow, "true or false")
    manifest = read_manifest(base_config.data.path)
    if split not in manifest.splits:
        raise ConfigError(f"{path}: objective.metric {metric}: the dataset {base_config.data.path} has no split "
                          f"{split!r} (it has {sorted(manifest.splits)}); a validation split is carved by "
                          "`mpitrain etl --validation-fraction`")
    if split == base_config.data.test_split and not allow:
        raise ConfigError(f"{path}: objective.metric {metric} tunes on the test split, so the chosen model's test "
                          "score would no longer measure unseen rows; tune on validation (`mpitrain etl "
                          "--validation-fraction`), or set objective.allow_test_split: true to do it anyway")
    if name == "accuracy" and manifest.target == "regression":
        raise ConfigError(f"{path}: objective.metric {metric}: a regression target reports no accuracy; expected "
                          f"{split}.loss")
    return Objective(split, name, direction, allow)


def _space(raw, path: str, base: str) -> dict:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{path}: space is {raw!r}, expected a mapping of config keys to {{float: [low, high]}}, "
                          "{int: [low, high]} or {choice: [...]}")
    space = {}
    for key, entry in raw.items():
        where = f"space.{key}"
        _known(entry, {*KINDS, "log", "step"}, path, where + ".")
        kinds = [kind for kind in KINDS if kind in entry]
        _check(len(kinds) == 1, path, where, entry, "exactly one of float: [low, high], int: [low, high], "
                                                    "choice: [values]")
        kind, values = kinds[0], entry[kinds[0]]
        if kind == "choice":
            _check(isinstance(values, list) and len(values) > 0, path, f"{where}.choice", values,
                   "a non-empty list of values")
            for value in values:
                _check(value is None or isinstance(value, (bool, int, float, str)), path, f"{where}.choice", value,
                       "numbers, strings or booleans (Optuna's categorical values)")
            _check(set(entry) == {"choice"}, path, where, entry, "choice: [values] alone (log and step are for "
                                                                 "ranges)")
        else:
            number = int if kind == "int" else (int, float)
            _check(isinstance(values, list) and len(values) == 2
                   and all(isinstance(v, number) and not isinstance(v, bool) for v in values), path,
                   f"{where}.{kind}", values, f"[low, high], two {'integers' if kind == 'int' else 'numbers'}")
            _check(values[0] < values[1], path, f"{where}.{kind}", values, "a range that is not empty: low < high")
            log = entry.get("log", False)
            _check(isinstance(log, bool), path, f"{where}.log", log, "true or false")
            _check(not log or values[0] > 0, path, f"{where}.{kind}", values, "low > 0 with log: true")
            if "step" in entry:
                _check(isinstance(entry["step"], number) and entry["step"] > 0 and not log, path, f"{where}.step",
                       entry["step"], f"a positive {'integer' if kind == 'int' else 'number'}, without log: true")
        for value in grid_values(entry) if kind == "choice" else values:
            try:
                load_config(base, overrides({key: value}))
            except MpitrainError as e:
                raise ConfigError(f"{path}: {where}: {e}") from None
        space[key] = entry
    return space


def _algorithm(raw, names: dict, path: str, key: str) -> dict:
    """A sampler or pruner: its name, or {type: NAME, ...arguments of its Optuna class}, checked against the
    class's signature."""
    import optuna

    spec = {"type": raw} if isinstance(raw, str) else raw
    _check(isinstance(spec, dict) and spec.get("type") in names, path, key, raw,
           f"one of {sorted(names)}, or {{type: NAME, ...Optuna's arguments}}")
    module = optuna.samplers if key == "sampler" else optuna.pruners
    parameters = inspect.signature(getattr(module, names[spec["type"]])).parameters
    allowed = {name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD}
    allowed -= {"search_space", "seed"}  # the space and `seed` are the study's own keys
    _known(spec, allowed | {"type"}, path, key + ".")
    return spec


def _budget(raw, study: Study, path: str) -> int:
    """How many trials: `trials`; a grid's size when a grid study leaves it out (a grid runs each point once)."""
    if study.sampler["type"] == "grid":
        for key, entry in study.space.items():
            _check("float" not in entry, path, f"space.{key}", entry, "choice: [values] or int: [low, high] with "
                                                                        "sampler: grid (a grid has points)")
        grid = study.grid
        trials = raw if raw is not None else len(grid)
        _check(isinstance(trials, int) and 1 <= trials <= len(grid), path, "trials", trials,
               f"at most the grid's {len(grid)} points")
        return trials
    _check(isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1, path, "trials", raw,
           "the number of trials, an integer >= 1")
    return raw


def study_yaml(study: Study) -> str:
    """The study as its folder's study.yaml records it (absolute paths: workers read it from anywhere)."""
    return yaml.safe_dump(study.to_dict(), sort_keys=False)


def changed_keys(recorded: Study, study: Study) -> list[str]:
    """The keys of `study` that differ from the study its folder records, beside `trials` (which may grow)."""
    old, new = recorded.to_dict(), study.to_dict()
    return [key for key in new if key != "trials" and old.get(key) != new[key]]

