"""Where the ranks of a Spark barrier stage run (mpitrain.spark.hydra.Placement), what mpiexec is asked, and
how a failed job is told in one line (mpitrain.spark.task.describe_failure), for the several-host placements
that the system tests' one host cannot show."""
import pytest

from mpitrain.base.errors import MpitrainError
from mpitrain.spark.hydra import Placement, launcher_command, read_proxy_commands
from mpitrain.spark.task import describe_failure


def test_one_rank_per_task_hosts_in_the_order_of_their_first_task():
    placement = Placement.of_tasks(["b", "a", "b", "c", "a"])
    assert placement == Placement(("b", "a", "c"), (2, 2, 1), (0, 1, 3))
    assert [placement.host_of_rank(r) for r in range(5)] == ["b", "b", "a", "a", "c"]
    assert list(placement.ranks_of_host("a")) == [2, 3]
    assert launcher_command("mpiexec", placement, "/work", ["python", "-m", "mpitrain", "train", "x.yaml"]) == [
        "mpiexec", "-launcher", "manual", "-localhost", "b", "-hosts", "b:2,a:2,c:1", "-n", "5", "-wdir", "/work",
        "python", "-m", "mpitrain", "train", "x.yaml"]


def test_proxy_commands_are_read_up_to_the_end_marker_or_refused_with_what_mpiexec_said():
    lines = ["HYDRA_LAUNCH: /bin/hydra_pmi_proxy --control-port b:1 --proxy-id 0\n",
             "HYDRA_LAUNCH: /bin/hydra_pmi_proxy --control-port b:1 --proxy-id 1\n", "HYDRA_LAUNCH_END\n", "later\n"]
    assert read_proxy_commands(iter(lines)) == [["/bin/hydra_pmi_proxy", "--control-port", "b:1", "--proxy-id", "0"],
                                                ["/bin/hydra_pmi_proxy", "--control-port", "b:1", "--proxy-id", "1"]]
    with pytest.raises(MpitrainError, match=r"ended without printing its proxy commands: .*unrecognized argument"):
        read_proxy_commands(iter(["[mpiexec@b] unrecognized argument launcher\n"]))


PLACEMENT = Placement.of_tasks(["a", "b", "a", "b"])  # ranks 0, 1 on a; 2, 3 on b
QUIET = [{"proxy_status": 0, "ranks": {}}] * 4


def test_a_failure_names_the_rank_and_host_from_the_output_or_the_tasks_reports():
    raised = ["[rank 3] Traceback (most recent call last):", "[rank 3] ValueError: bad", "Abort(1) on node 3"]
    assert describe_failure(raised, 1, PLACEMENT, QUIET) == "rank 3 on b failed: ValueError: bad"
    killed = ["=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "=   PID 4242 RUNNING AT b",
              "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)"]
    reports = [QUIET[0], {"proxy_status": 9, "ranks": {"4241": 2, "4242": 3}}, QUIET[0], QUIET[0]]
    assert describe_failure(killed, 9, PLACEMENT, reports) == "rank 3 on b ended: Killed (signal 9)"
    proxy = [QUIET[0], {"proxy_status": 137, "ranks": {}}, QUIET[0], QUIET[0]]
    assert describe_failure(["lost contact"], 7, PLACEMENT, proxy) == \
        "the MPI proxy on b (ranks 2, 3) was killed by signal 9"
    assert describe_failure(["", "something else", ""], 7, PLACEMENT, QUIET) == \
        "mpiexec exited with status 7: something else"
