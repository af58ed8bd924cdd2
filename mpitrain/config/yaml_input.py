"""YAML that a user wrote, read in one place: a config file, a `--set` value, and any YAML a later tool reads from
its user. A mistake is one line, `FILE:LINE:COLUMN: what is wrong` (a `--set` value: `--set KEY=VALUE: at
character N of the value: ...`), instead of PyYAML's three to five lines, and a key given twice in one mapping is
refused (PyYAML keeps the last one, silently). So are documents that only aliases make dangerous: a value that holds
itself (`&a [*a]`: every later walk of the config would recurse without end), aliases of aliases that expand a few
hundred bytes into billions of values (a "billion laughs": an error message's repr of it would never end), and
nesting deeper than PyYAML's recursion can read.

    raw = read_yaml(text, "configs/exp.yaml")             # configs/exp.yaml:3:1: found character '\\t' ...
    value = read_yaml("[1, 2", "--set model.units=[1, 2", in_file=False)
    raw = read_yaml_file("study.yaml", "study file")         # the file's contents; {} for an empty file
"""
from __future__ import annotations

from collections.abc import Hashable

import yaml

from mpitrain.base.errors import ConfigError

# How many values aliases may add to a document beyond those written in it: far above any config's use of
# anchors, far below a "billion laughs" (nine aliases of nine aliases ... of a list: 9^9 values from 500 bytes).
MAX_ALIASED_VALUES = 100_000

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
    except _Refused as e:
        raise ConfigError(f"{_place(where, e.mark, in_file)}: {e.reason}") from None
    except RecursionError:  # PyYAML composes nested values recursively
        raise ConfigError(f"{where}: nested too deeply for PyYAML to read (hundreds of levels of [ "
                          "or {); expected a config of a few levels") from None
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


class _Refused(yaml.YAMLError):
    """A YAML text refused for its shape, not its syntax: `reason`, at `mark` (None: the whole document)."""

    def __init__(self, reason: str, mark):
        super().__init__(reason)
        self.reason, self.mark = reason, mark


def _check_aliases(root) -> None:
    """Refuse a composed document (`root`, PyYAML's node graph, where an alias is its anchored node again) whose
    aliases make a value hold itself, or expand it by more than MAX_ALIASED_VALUES values. One walk, with a stack
    instead of recursion, counting each node once (`sizes`: the values under it, aliases expanded)."""
    sizes, path = {}, set()  # path: the nodes whose walk is under way, each an ancestor of the next one popped
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        children = [item for pair in node.value for item in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        if done:
            path.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
        elif id(node) in path:
            raise _Refused("this anchored value holds itself through an alias; expected a value that does not "
                           "contain itself", node.start_mark)
        elif id(node) not in sizes:
            path.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children)
    if sizes[id(root)] - len(sizes) > MAX_ALIASED_VALUES:
        raise _Refused(f"its aliases expand the {len(sizes):,} values written into {sizes[id(root)]:,}; expected at "
                       f"most {MAX_ALIASED_VALUES:,} values more than written (aliases of aliases: a 'billion "
                       "laughs')", None)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last, silently), and a
    document whose aliases hold or multiply themselves (`_check_aliases`)."""

    def construct_document(self, node):
        _check_aliases(node)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise _Refused(f"{key!r} appears twice (also at line {seen[key] + 1}); PyYAML would keep only "
                                    "the last, so the first would be ignored: merge them", key_node.start_mark)
            if isinstance(key, Hashable):
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)
