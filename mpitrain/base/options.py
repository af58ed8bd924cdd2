"""Declared options: dataclass fields that carry their meaning, domain and rule on resume, and the checks they share.

    @dataclass(frozen=True)
    class AveragingOptions(Options):                       # a sync mode's own options, beside the mode
        frequency: int = option(1, "Steps between averagings.", domain="[1, 1e9]")

    AveragingOptions(frequency=0).check_domains("run.yaml", "sync.")   # ConfigError: run.yaml: sync.frequency is 0,
                                                                       # expected an integer in [1, 1e9]

The config's sections (`mpitrain.config.sections`) and each sync mode's options (`Synchronizer.Options`) are made
of these. An error names `where` (a config file, or an object whose `of(key)` says which `--set` gave the key) and
the dotted key, and says what was expected.
"""
from __future__ import annotations

import dataclasses
import reprlib
import types
import typing
from dataclasses import field

from mpitrain.base.domains import in_domain
from mpitrain.base.errors import ConfigError

# Whether a key may change when a run resumes (`option(on_resume=...)`, else its class's `ON_RESUME`):
REFUSED = "refused"  # it gives a checkpoint's numbers their meaning: a resume that changes it is refused
AT_EPOCH_END = "at an epoch's end"  # it sets the epoch's order: refused when resuming a mid-epoch checkpoint
ALLOWED = "allowed"  # it takes effect from the resumed step
ON_RESUME = (REFUSED, AT_EPOCH_END, ALLOWED)


def option(default, doc: str, choices: typing.Iterable | None = None, domain: str | None = None,
           on_resume: str | None = None):
    """A config field: its default, what it means, and its domain: for a choice the allowed values, for a number
    the interval it must lie in, e.g. "(0, 1]" ("[" and "]" include an end, "(" and ")" exclude it; every number
    must also be finite, and every interval has a finite upper end: a sane bound); and whether it may change on
    resume (one of `ON_RESUME`; None: as its class's `ON_RESUME` says)."""
    assert on_resume in (None, *ON_RESUME), on_resume
    metadata = {"doc": doc, "choices": tuple(choices) if choices is not None else None, "domain": domain,
                "on_resume": on_resume}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(cls, doc: str, factory=None):
    """A config section (a nested dataclass) and what it is for."""
    return field(default_factory=factory or cls, metadata={"doc": doc, "choices": None, "domain": None})


class Options:
    """Base of the options dataclasses: checks each field against the domain its `option` declares. `ON_RESUME` is
    whether a key may change on resume where its `option` does not say: refused unless a class says otherwise, so
    a new key is kept until someone decides it may change."""

    ON_RESUME: typing.ClassVar[str] = REFUSED

    def check_domains(self, where: str, prefix: str) -> None:
        for f in dataclasses.fields(self):
            value, choices, domain = getattr(self, f.name), f.metadata.get("choices"), f.metadata.get("domain")
            check_value(choices is None or value in choices, where, prefix + f.name, value, f"one of {choices}")
            if domain and isinstance(value, (int, float)) and not isinstance(value, bool):
                kind = "an integer" if isinstance(value, int) else "a number"
                check_value(in_domain(value, domain), where, prefix + f.name, value, f"{kind} in {domain}")

    def validate(self, where: str, prefix: str):
        """These options checked against their domains and normalized (a new object where anything changes); a
        class with checks beyond the domains adds them here."""
        self.check_domains(where, prefix)
        return self


def origin_of(where, key: str) -> str:
    """What gave `key` its value: the override that set it (`where.of(key)`, a config's `Origin`), or `where` (the
    file, or the caller's words)."""
    return where.of(key) if hasattr(where, "of") else where


def shown(value) -> str:
    """`value`'s repr for an error line, cut short (`...`) past 2 levels, 8 items of a list or mapping, or 200
    characters of a string or number: a long list in a config stays one readable line."""
    short = reprlib.Repr()  # its limits as attributes: Python 3.11's takes no arguments
    short.maxlevel, short.maxlist, short.maxdict = 2, 8, 8
    short.maxstring = short.maxlong = short.maxother = 200
    return short.repr(value)


def check_value(ok: bool, where, key: str, value, expected: str) -> None:
    """A ConfigError naming `where`, `key` and `value` and saying what was `expected`, unless `ok`."""
    if not ok:
        raise ConfigError(f"{origin_of(where, key)}: {key} is {shown(value)}, expected {expected}")


def coerce(value, kind, where, key: str):
    """`value` as the type `kind` (a union: the first of its types that fits) allows: an int where a float is
    expected becomes one, and so does a string that reads as a number (PyYAML reads `1e-3` as a string); else a
    ConfigError naming the key and the types expected."""
    allowed = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    for each in allowed:
        each = typing.get_origin(each) or each
        if each is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if each is float and isinstance(value, str):
            try:
                return float(value)  # PyYAML reads `1e-3` (no dot) as a string
            except ValueError:
                pass
        if isinstance(value, each) and not (each is int and isinstance(value, bool)):
            return value
    names = " or ".join(getattr(a, "__name__", str(a)) for a in allowed)
    raise ConfigError(f"{origin_of(where, key)}: {key} is {shown(value)}, expected {names}")


def optional_feature(value, defaults: dict, where, key: str):
    """An optional feature: false stays false, true -> the defaults, a mapping -> the defaults updated by it."""
    if value is False:
        return False
    if value is True:
        return dict(defaults)
    unknown = sorted(set(value) - set(defaults))
    if unknown:
        raise ConfigError(f"{origin_of(where, key)}: unknown key {key}.{unknown[0]}; expected one of "
                          f"{sorted(defaults)}")
    merged = dict(defaults)
    for name, item in value.items():
        merged[name] = coerce(item, type(defaults[name]), where, f"{key}.{name}")
    return merged
