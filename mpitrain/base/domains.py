"""Number domains written as intervals, "(0, 1]" ("[" and "]" include an end, "(" and ")" exclude it): the config's
keys declare theirs beside their defaults (`mpitrain.base.options.option`), the ETL's options beside theirs.

    check_number("--test-fraction", 1.5, "[0, 1)")   # ConfigError: --test-fraction 1.5: expected a number in [0, 1)
"""
from __future__ import annotations

import math

from mpitrain.base.errors import ConfigError


def in_domain(value, domain: str) -> bool:
    """Whether the number `value` lies in the interval `domain` ("(0, 1]"); NaN lies in none."""
    low, high = (float(end) for end in domain[1:-1].split(","))
    above = value > low if domain[0] == "(" else value >= low
    below = value < high if domain[-1] == ")" else value <= high
    return above and below


def check_number(name: str, value, domain: str, integer: bool = False):
    """`value` when it is a finite number (an integer, with `integer`) in `domain`; else a ConfigError naming `name`
    (an option, `--test-fraction`) and its range, in one line."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and in_domain(value, domain) and (isinstance(value, int) or not integer)):
        shown = f"{value:g}" if isinstance(value, float) else value  # as typed: 1, not 1.0
        raise ConfigError(f"{name} {shown}: expected {'an integer' if integer else 'a number'} in {domain}")
    return value
