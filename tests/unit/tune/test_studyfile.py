"""A study file is checked when it is read: each mistake is one line naming the file and the key, and
`mpitrain tune` with a bad study file exits 2 having started nothing (no study folder)."""
import pytest
import yaml

from mpitrain.base.errors import ConfigError
from mpitrain.cli import main
from mpitrain.config.sections import load_config
from mpitrain.testing.datasets import make_digits_dataset, write_config
from mpitrain.tune.studyfile import load_study

GOOD = {"base": "base.yaml", "objective": {"metric": "validation.accuracy", "direction": "maximize"}, "trials": 12,
        "sampler": "tpe", "pruner": "median",
        "space": {"optimizer.lr": {"float": [0.001, 0.3], "log": True}, "model.layers.0.units": {"int": [8, 64]},
                  "sync.mode": {"choice": ["allreduce", "sharing"]}}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("study")
    make_digits_dataset(folder / "data", validation_fraction=0.2)
    write_config(folder / "base.yaml", folder / "data")
    return folder


def write_study(folder, name="study.yaml", **changes) -> str:
    study = {**GOOD, **changes}
    for key in [key for key, value in changes.items() if value is None]:
        del study[key]
    path = folder / name
    path.write_text(yaml.safe_dump(study))
    return str(path)


def test_the_issue_s_study_file_loads_with_its_defaults(folder, monkeypatch):
    monkeypatch.chdir(folder)
    study = load_study(write_study(folder))
    assert study.folder == str(folder / "study") and study.base == str(folder / "base.yaml")
    assert (study.objective.split, study.objective.metric, study.objective.direction) == \
        ("validation", "accuracy", "maximize")
    assert study.trials == 12 and study.sampler == {"type": "tpe"} and study.pruner == {"type": "median"}
    config = study.trial_config({"optimizer.lr": 0.01, "model.layers.0.units": 40, "sync.mode": "sharing"}, "r")
    assert (config.optimizer.lr, config.model.layers[0]["units"], config.sync.mode) == (0.01, 40, "sharing")
    assert config.data.test_split == "validation"  # every epoch's evaluation is the objective's split


def test_a_grid_study_s_budget_is_its_points(folder, monkeypatch):
    monkeypatch.chdir(folder)
    study = load_study(write_study(folder, sampler="grid", trials=None,
                                   space={"optimizer.lr": {"choice": [0.01, 0.1]}, "model.layers.0.units":
                                          {"int": [4, 8], "step": 2}}))
    assert study.trials == 6 and len({tuple(p.values()) for p in study.grid}) == 6


@pytest.mark.parametrize("changes, line", [
    ({"budget": 3}, "unknown key 'budget'"),
    ({"objective": {"metric": "validation.accuracy", "goal": "max"}}, "unknown key 'objective.goal'"),
    ({"space": {"optimizer.lr": {"float": [0.3, 0.001]}}}, "space.optimizer.lr.float is [0.3, 0.001], expected a "
                                                          "range that is not empty: low < high"),
    ({"space": {"optimizer.lr": {"float": [0.1, 0.1]}}}, "expected a range that is not empty"),
    ({"space": {"sync.mode": {"choice": []}}}, "space.sync.mode.choice is [], expected a non-empty list"),
    ({"objective": {"metric": "validation.f1"}}, "objective.metric is 'validation.f1', expected SPLIT.METRIC with "
                                                 "METRIC one of ['accuracy', 'loss']"),
    ({"objective": {"metric": "holdout.accuracy"}}, "has no split 'holdout'"),
    ({"objective": {"metric": "test.accuracy"}}, "objective.metric test.accuracy tunes on the test split"),
    ({"space": {"optimizer.rate": {"float": [0.1, 0.2]}}}, "space.optimizer.rate: "),
    ({"space": {"optimizer.lr": {"float": [0.1, 5000.0]}}}, "optimizer.lr is 5000.0, expected a number in"),
    ({"space": {"model.layers.5.units": {"int": [2, 4]}}}, "'5' is not an index of a list of 2 items"),
    ({"sampler": "cmaes"}, "sampler is 'cmaes', expected one of ['grid', 'random', 'tpe']"),
    ({"pruner": {"type": "median", "patience": 2}}, "unknown key 'pruner.patience'"),
    ({"trials": 0}, "trials is 0, expected the number of trials"),
    ({"sampler": "grid"}, "space.optimizer.lr is {'float': [0.001, 0.3], 'log': True}, expected choice"),
    ({"base": "missing.yaml"}, "missing.yaml: no such config file"),
])
def test_a_bad_study_file_is_one_line_naming_the_key_and_nothing_starts(folder, monkeypatch, capsys, changes, line):
    monkeypatch.chdir(folder)
    path = write_study(folder, "bad.yaml", **changes)
    with pytest.raises(ConfigError, match=None) as raised:
        load_study(path)
    assert line in str(raised.value) and str(raised.value).startswith(path) and "\n" not in str(raised.value)
    assert main(["tune", path, "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"mpitrain tune: error: {raised.value}"]
    assert not (folder / "bad").exists()  # no study folder, no journal: nothing started


def test_the_test_split_is_tuned_on_only_when_asked_by_name(folder, monkeypatch):
    monkeypatch.chdir(folder)
    study = load_study(write_study(folder, objective={"metric": "test.loss", "allow_test_split": True}))
    assert (study.objective.split, study.objective.direction) == ("test", "minimize")


def test_set_indexes_a_list_by_number(folder):
    config = load_config(str(folder / "base.yaml"), ["model.layers.1.units=10", "model.layers.0.activation=tanh"])
    assert [layer["units"] for layer in config.model.layers] == [16, 10]
    assert config.model.layers[0]["activation"] == "tanh"
    with pytest.raises(ConfigError, match="'x' is not an index of a list of 2 items"):
        load_config(str(folder / "base.yaml"), ["model.layers.x.units=10"])
