"""YAML that a user wrote, read in one place: a config file, a `--set` value, and any YAML a later tool reads from
its user. A mistake is one line, `FILE:LINE:COLUMN: what is wrong` (a `--set` value: `--set KEY=VALUE: at
character N of the value: ...`), instead of PyYAML's three to five lines, and a key given twice in one mapping is
refused (PyYAML keeps the last one, silently).

    raw = read_yaml(text, "configs/exp.yaml")             # configs/exp.yaml:3:1: found character '\\t' ...
    value = read_yaml("[1, 2", "--set model.units=[1, 2", in_file=False)
    raw = read_yaml_file("study.yaml", "study file")         # the file's contents; {} for an empty file
"""
from __future__ import annotations

from collections.abc import Hashable

import yaml

from mpitrain.base.errors import ConfigError

# What a few of PyYAML's problems usually mean, said beside them.
HINTS = {"found character '\\t' that cannot start any token": "YAML indents with spaces, not tabs",
         "mapping values are not allowed here": "a `key: value` where a plain value belongs: check the indentation, "
                                                "or quote a value that holds ': '"}


def read_yaml(text, where: str, in_file: bool = True):
    """The value of the YAML `text` (a str or a stream); `where` names it in an error: a file's path (`in_file`:
    positions as PATH:LINE:COLUMN) or a `--set` override (positions as a column of its value). A ConfigError of
    one line for text that is not YAML or holds a key twice."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as e:
        problem = e.problem or str(e).splitlines()[0]
        hint = HINTS.get(problem)
        context = f", {e.context} that starts at {_position(e.context_mark, in_file)}" \
            if e.context and e.context_mark else ""
        raise ConfigError(f"{_place(where, e.problem_mark, in_file)}: not valid YAML: {problem}{context}"
                          + (f" ({hint})" if hint else "")) from None
    except _DuplicateKey as e:
        raise ConfigError(f"{_place(where, e.mark, in_file)}: {e.reason}") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (a binary file)
        character = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise ConfigError(f"{where}: not valid YAML: the character {character} at byte {e.position} is not "
                          "allowed; expected a YAML text") from None


def read_yaml_file(path: str, what: str):
    """The YAML document in the file `path` ({} for an empty one), read by `read_yaml`; a file that cannot be read is
    one ConfigError naming `path` and `what` it should be ("config file", "study file")."""
    try:
        with open(path) as f:
            return read_yaml(f, path) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder; expected a YAML {what}") from None
    except PermissionError:
        raise ConfigError(f"{path}: not readable (permission denied)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file; expected a YAML {what}") from None


def _position(mark, in_file: bool) -> str:
    return f"{mark.line + 1}:{mark.column + 1}" if in_file else f"character {mark.column + 1} of the value"


def _place(where: str, mark, in_file: bool) -> str:
    if mark is None:
        return where
    return f"{where}:{_position(mark, True)}" if in_file else f"{where}: at {_position(mark, False)}"


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, reason: str, mark):
        super().__init__(reason)
        self.reason, self.mark = reason, mark


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last, silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise _DuplicateKey(f"{key!r} appears twice (also at line {seen[key] + 1}); PyYAML would keep only "
                                    "the last, so the first would be ignored: merge them", key_node.start_mark)
            if isinstance(key, Hashable):
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)
