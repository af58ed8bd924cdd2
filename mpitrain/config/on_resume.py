"""What may change when a run resumes: each key's rule, declared once beside it, and the first change a resume makes.

    rules = resume_rules()                                   # {"data.normalize": "refused", "train.epochs": ...}
    change = first_change(saved, now, mid_epoch=True)        # ("data.normalize", True, False, "refused"), or None

Each key's rule is its `option(on_resume=...)`, else its section's `ON_RESUME` (`mpitrain.config.sections`):
`refused` for what gives a checkpoint's numbers their meaning (the model, its loss and dtype, the input transforms,
the optimizer's type, the RBMs' layers), `at an epoch's end` for what sets an epoch's order (the split trained on,
shuffling, max_rows, the seed, the batch size), `allowed` for the rest (epochs, the learning rate and its
schedule, sync modes, checkpoint cadence, logging, the watchdog, where the dataset lies: its identity, the
manifest's sha256, is checked apart). A section's default is `refused`, so a new key is kept until someone decides
that it may change. `mpitrain.config.reference` shows the rules in docs/configuration.md; the checkpointer refuses
a resume by `first_change` of the checkpoint's recorded config and this run's.

The global batch is the one order key compared by its effect, not its keys: a mid-epoch checkpoint continues on
any number of ranks that gives the same global batch (`train.batch_size` x ranks, or `train.global_batch_size`),
so `global_batch_change` names the key that changed it.
"""
from __future__ import annotations

import dataclasses
import json

from mpitrain.config.sections import AT_EPOCH_END, REFUSED, Config

BY_GLOBAL_BATCH = ("train.batch_size", "train.global_batch_size", "train.accumulate")  # by the global batch they give
UNSET = type("Unset", (), {"__repr__": lambda self: "unset"})()  # an option mapping's entry one side lacks


def resume_rules(section=Config, prefix: str = "") -> dict[str, str]:
    """{dotted key: REFUSED, AT_EPOCH_END or ALLOWED} for every key of the config (sections' keys included)."""
    rules = {}
    for f in dataclasses.fields(section):
        if "on_resume" not in f.metadata:  # a nested section (`mpitrain.config.sections.section`)
            rules.update(resume_rules(type(f.default_factory()), f"{prefix}{f.name}."))
        else:
            rules[prefix + f.name] = f.metadata["on_resume"] or section.ON_RESUME
    return rules


def first_change(saved: dict, now: dict, mid_epoch: bool) -> tuple[str, object, object, str] | None:
    """The first key a resume may not change that differs between the config a checkpoint recorded (`saved`, a
    mapping as config.yaml holds it) and this run's (`now`): (the key, named down to the differing entry, e.g.
    `model.layers[1].rate`, its saved value, its value now, its rule), or None. Keys `saved` lacks (a checkpoint
    of an older version) are not compared; nor are `BY_GLOBAL_BATCH` (see `global_batch_change`)."""
    kept = (REFUSED, AT_EPOCH_END) if mid_epoch else (REFUSED,)
    for key, rule in resume_rules().items():
        if rule not in kept or key in BY_GLOBAL_BATCH:
            continue
        found, value = _get(saved, key)
        if found:
            difference = _difference(key, value, _get(now, key)[1])
            if difference:
                return (*difference, rule)
    return None


def global_batch_change(saved: dict, now: dict, saved_batch: int, batch: int, ranks: int) -> str | None:
    """How this run's global batch (`batch` rows on `ranks` ranks) differs from the `saved_batch` a mid-epoch
    checkpoint stopped in, naming the key that changed it (`saved`, `now`: the configs); None when it does not."""
    if saved_batch in (0, batch):
        return None
    train = {key: _get(now, key)[1] for key in BY_GLOBAL_BATCH}
    changed = [key for key in BY_GLOBAL_BATCH if _get(saved, key)[0] and _get(saved, key)[1] != train[key]]
    accumulated = f" x train.accumulate {train['train.accumulate']}" if (train["train.accumulate"] or 1) > 1 else ""
    how = f"train.global_batch_size {train['train.global_batch_size']}" if train["train.global_batch_size"] else \
        f"train.batch_size {train['train.batch_size']}{accumulated} x {ranks} ranks"
    if changed:
        what = f"{changed[-1]} was {_get(saved, changed[-1])[1]}, so this run's is"
    else:  # the same keys on another number of ranks, or a checkpoint that recorded no config
        what = "the number of ranks changed, so this run's is" if _get(saved, "train")[0] else "this run's is"
    return f"a global batch of {saved_batch} rows; {what} {batch} ({how})"


def shown(value) -> str:
    """A config value as one short line of YAML flow style (JSON is a subset); `UNSET` as "unset"."""
    text = repr(value) if value is UNSET else json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _get(config: dict, key: str) -> tuple[bool, object]:
    """(whether `config` has the dotted `key`, its value)."""
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _difference(key: str, saved, now) -> tuple[str, object, object] | None:
    """The first entry where `saved` and `now` differ, named from `key` down (a list's item, a mapping's key)."""
    if isinstance(saved, dict) and isinstance(now, dict):
        for name in list(saved) + [name for name in now if name not in saved]:
            found = _difference(f"{key}.{name}", saved.get(name, UNSET), now.get(name, UNSET))
            if found:
                return found
        return None
    if isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now):
        for index, (a, b) in enumerate(zip(saved, now)):
            found = _difference(f"{key}[{index}]", a, b)
            if found:
                return found
        return None
    return None if saved == now else (key, saved, now)


def set_back(key: str, saved) -> str:
    """What to do to keep `key` as a checkpoint recorded it (`saved`)."""
    return f"remove {key}" if saved is UNSET else f"set it back to {shown(saved)}"
