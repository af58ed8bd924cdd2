"""The suite's time against its budget (mpitrain.testing.suite_time): the budget read from pyproject.toml's lines, each
test's layer from its path, and a warning naming the slowest files only once a run's layers pass their sum."""
import pytest

from mpitrain.testing.suite_time import layer_of, parse_budget, seconds_by_file, summary_lines, waits_by_layer


def test_the_budget_is_read_per_layer_and_a_bad_line_is_named():
    assert parse_budget(["unit 120", "mpi 600"]) == {"unit": 120.0, "mpi": 600.0}
    for line in ("unit", "gpu 10", "mpi ten", "system 5 s"):
        with pytest.raises(ValueError, match=f"time_budget: '{line}' is not 'LAYER SECONDS'"):
            parse_budget([line])


def test_a_test_s_layer_is_its_folder_under_tests():
    assert layer_of("tests/mpi/test_tune.py::test_a[x]") == "mpi"
    assert layer_of("tests/unit/nn/test_conv.py::test_b") == "unit"
    assert layer_of("tests/harness/launch.py::x") is None
    assert layer_of("other/unit/test_x.py::y") is None


class Report:
    def __init__(self, nodeid, duration, when="call", user_properties=()):
        self.nodeid, self.duration, self.when, self.user_properties = nodeid, duration, when, list(user_properties)


def test_within_the_budget_one_line_over_it_the_slowest_files_by_their_seconds():
    by_file = seconds_by_file([Report("tests/mpi/test_a.py::t1", 30.0), Report("tests/mpi/test_a.py::t1", 5.0),
                               Report("tests/mpi/test_b.py::t2", 50.0), Report("tests/unit/test_c.py::t3", 2.0)])
    assert by_file == {"tests/mpi/test_a.py": 35.0, "tests/mpi/test_b.py": 50.0, "tests/unit/test_c.py": 2.0}
    budget = {"unit": 10.0, "mpi": 100.0, "system": 1000.0}

    lines, over = summary_lines(80.0, by_file, budget)
    assert not over and lines == ["suite time: 80 s wall (unit 2 s, mpi 85 s in tests) against a budget of 110 s for "
                                  "unit+mpi (pyproject.toml time_budget)"]

    lines, over = summary_lines(130.0, by_file, budget, slowest=2)  # the system layer did not run: not its budget
    assert over and lines[1] == ("over the budget by 20 s; the slowest files: tests/mpi/test_b.py (50 s), "
                                 "tests/mpi/test_a.py (35 s)")


def test_the_waits_for_the_machine_are_summed_per_layer_once_per_test_and_printed_last():
    waited = [("machine_wait_s", 4.0)]  # a test's report of each phase carries its user properties
    reports = [Report("tests/mpi/test_a.py::t1", 1.0, when, waited) for when in ("setup", "call", "teardown")]
    reports += [Report("tests/system/test_b.py::t2", 1.0, "setup", [("machine_wait_s", 2.5)]),
                Report("tests/system/test_b.py::t3", 1.0, "setup", [("machine_wait_s", 0.5)]),
                Report("tests/unit/test_c.py::t4", 1.0, "setup")]  # a run of one process records no wait
    assert waits_by_layer(reports) == {"mpi": 4.0, "system": 3.0}
    lines, _ = summary_lines(10.0, seconds_by_file(reports), {"mpi": 100.0, "system": 100.0, "unit": 10.0},
                             waits=waits_by_layer(reports))
    assert lines[-1] == "waited for the machine share (an `alone` test, or the tests beside one): mpi 4 s, system 3 s"
    for waits in ({}, {"unit": 0.2, "mpi": 0.3}):  # none, or the moments every test takes to hold the machine
        assert len(summary_lines(10.0, seconds_by_file(reports), {"mpi": 100.0}, waits=waits)[0]) == 1
