"""Stragglers (mpitrain/training/stragglers.py): a rank above factor x the median busy time in 3 windows in a row is
named once per streak, with its host; a slow window that breaks the streak, or an even spread, names nobody."""
from mpitrain.training.stragglers import Stragglers, spread


def test_a_rank_slow_in_three_windows_in_a_row_is_named_once_per_streak():
    s = Stragglers(1.5, ["n1", "n1", "n2", "n2"])
    assert [s.observe([10, 11, 30, 10]) for _ in range(2)] == [None, None]
    assert s.observe([10, 11, 30, 10]) == {"rank": 2, "host": "n2", "busy_ms": 30.0, "median_ms": 10.5,
                                           "ratio": 2.857}
    assert s.observe([10, 11, 30, 10]) is None  # named once for this streak
    assert s.observe([10, 11, 12, 10]) is None and s.observe([10, 11, 31, 10]) is None  # the streak broken
    assert s.named == [{"rank": 2, "host": "n2", "busy_ms": 30.0, "median_ms": 10.5, "ratio": 2.857}]


def test_an_even_spread_or_a_slow_window_now_and_then_names_nobody():
    s = Stragglers(1.5, ["n1"] * 3)
    for busy in ([10, 11, 12], [10, 30, 12], [10, 11, 12], [10, 30, 12], [14, 14, 14]):
        assert s.observe(busy) is None
    assert spread([4.0, 9.0, 1.0]) == {"min": 1.0, "median": 4.0, "max": 9.0, "slowest": 1}
