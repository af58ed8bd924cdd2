"""Every numeric config key has a domain beside its default; generated values outside it (inf, nan, below, above)
are a ConfigError naming the key, and a model beyond a rank's memory is refused before anything is allocated."""
import dataclasses
import math
import re
import typing

import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import Config, ModelConfig, load_config
from mpitrain.nn import flat
from mpitrain.nn.graph import build_graph
from mpitrain.nn.model import MAX_UNITS, Budget, build_model, cgroup_memory_limit, check_memory, rank_memory_bytes

BASE = "data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\n"


def numeric_keys(cls=Config, prefix=""):
    """(dotted key, field) of every field of the config sections whose type admits a number."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            yield from numeric_keys(kind, f"{prefix}{f.name}.")
        elif {int, float} & set(typing.get_args(kind) or (kind,)):
            yield prefix + f.name, f


def bad_values(f) -> list[str]:
    """YAML texts outside the field's domain: not finite, and just beyond each end of its interval."""
    domain = f.metadata["domain"]
    low, high = (float(end) for end in domain[1:-1].split(","))
    if f.type in ("int", int) or "int" in str(f.type):
        below, above = int(low) - (0 if domain[0] == "(" else 1), int(high) + (0 if domain[-1] == ")" else 1)
    else:
        below = low if domain[0] == "(" else low - 1
        above = high if domain[-1] == ")" else high * 2
    return [".inf", "-.inf", ".nan", repr(below), repr(above)]


KEYS = list(numeric_keys())


def test_every_numeric_key_declares_a_bounded_domain():
    assert len(KEYS) > 25
    for key, f in KEYS:
        domain = f.metadata.get("domain")
        assert domain, f"{key} declares no domain"
        assert math.isfinite(float(domain[1:-1].split(",")[1])), f"{key}'s domain has no upper bound"


@pytest.mark.parametrize("key, f", KEYS, ids=[key for key, _ in KEYS])
def test_values_outside_a_keys_domain_name_the_key(tmp_path, key, f):
    path = tmp_path / "exp.yaml"
    path.write_text(BASE)
    for value in bad_values(f):
        with pytest.raises(ConfigError, match=rf"^--set {re.escape(f'{key}={value}')}: {key} is ") as error:
            load_config(str(path), [f"{key}={value}"])
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("overrides, message", [
    (["optimizer.lr=.inf"], r"optimizer.lr is inf, expected a finite number"),
    (["model.layers=[{type: dense, units: 1000000000}]"],
     rf"model.layers\[0\].units is 1000000000, expected an integer in \[1, {MAX_UNITS}\]"),
    (["model.layers=[{type: dropout, rate: .nan}, {type: dense, units: 2}]"], r"model.layers\[0\].rate is nan"),
    (["model.layers=[{type: conv2d, filters: 2, kernel: 5000}]"], r"model.layers\[0\].kernel is 5000"),
    (["model.layers=[]", "model.graph=[{name: e, type: embedding, input: categorical, dim: 100000000}]"],
     r"model.graph\[0\].dim is 100000000"),
    (["model.loss=huber", "model.loss_options={delta: .inf}"], r"model.loss_options.delta is inf, expected a finite"),
    (["sync.adaptive={decay: .nan}"], r"sync.adaptive.decay is nan, expected a finite"),
])
def test_nested_numbers_are_finite_and_layer_sizes_bounded(tmp_path, overrides, message):
    path = tmp_path / "exp.yaml"
    path.write_text(BASE)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path), overrides)


def test_a_huge_model_is_refused_before_allocating(monkeypatch):
    def allocates(*args, **kwargs):
        raise AssertionError("FlatModel allocated")
    monkeypatch.setattr(flat.FlatModel, "__init__", allocates)
    config = ModelConfig(layers=[{"type": "dense", "units": 10**7}, {"type": "dense", "units": 10}])
    with pytest.raises(ConfigError, match=r"model.layers: the model needs about 132,320,406,688 bytes per rank "
                                          r"\(7,950,000,010 parameters x 4 copies, 64 rows x 10,000,794 activations "
                                          r"x 2\), expected at most the 1,073,741,824 bytes a rank has"):
        build_model(config, (784,), 10, np, budget=Budget(64, 2**30))


def test_a_huge_graph_is_refused_before_allocating(monkeypatch):
    class Group:
        shape = (784,)
    monkeypatch.setattr(flat.FlatModel, "__init__", lambda *a, **k: pytest.fail("FlatModel allocated"))
    config = ModelConfig(graph=[{"name": "h", "type": "dense", "input": "numeric", "units": 10**7},
                                {"name": "out", "type": "dense", "input": "h", "units": 10}])
    with pytest.raises(ConfigError, match=r"model.graph: the model needs about [0-9,]+ bytes per rank"):
        build_graph(config, {"numeric": Group()}, (784,), 10, np, budget=Budget(64, 2**30))


def test_a_model_within_the_budget_is_built():
    config = ModelConfig(layers=[{"type": "dense", "units": 8}, {"type": "dense", "units": 3}])
    model = build_model(config, (4,), 3, np, budget=Budget(16, rank_memory_bytes(1)))
    assert model.params.size == 4 * 8 + 8 + 8 * 3 + 3
    check_memory("model.layers", 10**9, 0, 4, None)  # no budget: nothing checked


def test_a_rank_has_its_share_of_the_node():
    node = rank_memory_bytes(1)
    assert 0 < rank_memory_bytes(4) <= node // 4 + 1 and node <= 2**60


def test_the_memory_limit_is_the_least_on_this_processs_cgroup_and_those_above_it(tmp_path):
    def limit(folder, name, value):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / name).write_text(f"{value}\n")
    own = tmp_path / "cgroup"
    # cgroup v1: a Slurm step's cgroup, without a limit of its own, under its job's (a host without cgroup namespaces)
    own.write_text("5:cpu,cpuacct:/\n4:memory:/slurm/uid_0/job_7/step_0\n0::/\n")
    limit("memory", "memory.limit_in_bytes", 9223372036854771712)  # the root: none
    limit("memory/slurm/uid_0/job_7", "memory.limit_in_bytes", 6 * 2**30)
    limit("memory/slurm/uid_0/job_7/step_0", "memory.limit_in_bytes", 9223372036854771712)
    assert cgroup_memory_limit(str(own), str(tmp_path)) == 6 * 2**30
    # cgroup v2: memory.max "max" in the process's own, a number above it
    own.write_text("0::/user.slice/job.scope\n")
    limit("user.slice/job.scope", "memory.max", "max")
    limit("user.slice", "memory.max", 3 * 2**30)
    assert cgroup_memory_limit(str(own), str(tmp_path)) == 3 * 2**30
    own.write_text("0::/elsewhere\n")
    assert cgroup_memory_limit(str(own), str(tmp_path / "none")) is None
    assert cgroup_memory_limit(str(tmp_path / "no such file")) is None
