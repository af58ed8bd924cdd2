"""What a test run cost against the suite's time budget (pyproject.toml's `time_budget`, docs/testing.md).

The budget is seconds of wall-clock time per layer of the suite (unit, mpi, system) on a 2-core machine; a run's
budget is the sum over the layers it ran. Going over it prints a warning naming the slowest files, never a
failure: a timed test is flaky on a slower machine.
"""
from __future__ import annotations

import os
from collections import defaultdict

LAYERS = ("unit", "mpi", "system")
MACHINE_WAIT = "machine_wait_s"  # a test's user property: seconds it waited for the machine share


def parse_budget(lines) -> dict[str, float]:
    """{layer: seconds} from the ini lines "LAYER SECONDS"; a line that is not one is a ValueError naming it."""
    budget = {}
    for line in lines:
        fields = line.split()
        if len(fields) != 2 or fields[0] not in LAYERS or not fields[1].isdigit():
            raise ValueError(f"pyproject.toml time_budget: {line!r} is not 'LAYER SECONDS' with LAYER one of "
                             f"{', '.join(LAYERS)}")
        budget[fields[0]] = float(fields[1])
    return budget


def layer_of(nodeid: str) -> str | None:
    """The layer of a test from its node id or its file's path (tests/LAYER/...), None outside the layers."""
    parts = nodeid.split("::")[0].replace(os.sep, "/").split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in LAYERS else None


def seconds_by_file(reports) -> dict[str, float]:
    """Seconds spent in each test file (set-up, call and teardown of its tests, wherever a worker ran them)."""
    spent = defaultdict(float)
    for report in reports:
        spent[report.nodeid.split("::")[0]] += report.duration
    return dict(spent)


def waits_by_layer(reports) -> dict[str, float]:
    """Seconds each layer's tests waited for the machine share before their set-up (tests/conftest.py records it in
    a test's `user_properties` as `machine_wait_s`; runs of one process record nothing)."""
    waited = defaultdict(float)
    for report in reports:
        seconds = dict(report.user_properties).get(MACHINE_WAIT)
        if seconds is not None and report.when == "setup":
            waited[layer_of(report.nodeid)] += seconds
    return {layer: waited[layer] for layer in LAYERS if layer in waited}


def summary_lines(wall_s: float, by_file: dict[str, float], budget: dict[str, float], slowest: int = 5,
                  waits: dict[str, float] | None = None) -> tuple[list[str], bool]:
    """The lines that say what the run cost against the budget of the layers it ran, and whether it went over; with
    `waits` (`waits_by_layer`), a line of what each layer's tests waited for the machine share."""
    by_layer = defaultdict(float)
    for path, seconds in by_file.items():
        layer = layer_of(path)
        if layer:
            by_layer[layer] += seconds
    ran = [layer for layer in LAYERS if layer in by_layer]
    allowed = sum(budget.get(layer, 0.0) for layer in ran)
    parts = ", ".join(f"{layer} {by_layer[layer]:.0f} s" for layer in ran)
    lines = [f"suite time: {wall_s:.0f} s wall ({parts} in tests) against a budget of {allowed:.0f} s for "
             f"{'+'.join(ran) or 'no layer'} (pyproject.toml time_budget)"]
    over = bool(ran) and wall_s > allowed
    if over:
        files = sorted(by_file.items(), key=lambda item: -item[1])[:slowest]
        lines.append(f"over the budget by {wall_s - allowed:.0f} s; the slowest files: "
                     + ", ".join(f"{path} ({seconds:.0f} s)" for path, seconds in files))
    if waits and sum(waits.values()) >= 1:  # no line for a run without `alone` tests
        lines.append("waited for the machine share (an `alone` test, or the tests beside one): "
                     + ", ".join(f"{layer} {seconds:.0f} s" for layer, seconds in waits.items()))
    return lines, over
