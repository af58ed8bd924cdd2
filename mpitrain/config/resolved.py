"""The resolved config: what the YAML and `--set` said, plus what set-up decided, in one frozen object.

    config = resolve(config, {"backend": "numpy", "model.layers": [...]}, "the config")

Configs are frozen dataclasses (`mpitrain.config.sections`): nothing writes into one. Set-up
(`mpitrain.training.run.setup_run`) is the one place that decides the rest: the backend that
`auto` became, a deep belief net's layers, a caller's model, dataset and synchronizer, absolute
paths. It calls `resolve`, and the run records and reads the result (RUN_DIR/config.yaml).
"""
from __future__ import annotations

import dataclasses

from mpitrain.config.sections import Config


def resolve(config: Config, decided: dict, where: str) -> Config:
    """A new config: `config` with each dotted key of `decided` ("backend", "data.path", "sync", ...) set to its
    value, checked against its domain (a ConfigError naming `where` otherwise)."""
    return _replaced(config, decided).validate(where)


def _replaced(section, values: dict):
    """`section` with `values` set; a dotted key reaches into the nested section it names."""
    own = {key: value for key, value in values.items() if "." not in key}
    nested = {}
    for key, value in values.items():
        if "." in key:
            head, rest = key.split(".", 1)
            nested.setdefault(head, {})[rest] = value
    own.update({head: _replaced(getattr(section, head), inner) for head, inner in nested.items()})
    return dataclasses.replace(section, **own)
