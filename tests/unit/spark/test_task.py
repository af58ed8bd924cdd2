"""The barrier task's GPU hand-off: each task's GPU (Spark's task resources) serves the one rank of that task."""
import pytest
from pyspark.resource import ResourceInformation

from mpitrain.spark.task import task_gpus, visible_devices


class TaskContext:
    """What `task_gpus` reads of pyspark's BarrierTaskContext: its resources()."""

    def __init__(self, resources: dict):
        self._resources = resources

    def resources(self) -> dict:
        return self._resources


def test_a_task_s_gpus_are_its_resource_addresses_and_none_without_the_resource():
    assert task_gpus(TaskContext({"gpu": ResourceInformation("gpu", ["3"])})) == ["3"]
    assert task_gpus(TaskContext({"gpu": ResourceInformation("gpu", ["0", "1"])})) == ["0", "1"]
    assert task_gpus(TaskContext({})) == []


def test_each_host_s_ranks_see_their_own_tasks_gpus_in_task_order():
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2"]
    gpus = [["3"], ["0"], ["1"], ["2"]]
    assert visible_devices(hosts, gpus, "10.0.0.1") == "3,1"  # tasks 0 and 2: local ranks 0 and 1
    assert visible_devices(hosts, gpus, "10.0.0.2") == "0,2"


@pytest.mark.parametrize("gpus", [[[], []], [["0", "1"], ["2", "3"]], [["0"], []]],
                         ids=["no gpus", "two per task", "one task without"])
def test_without_exactly_one_gpu_per_task_the_ranks_see_the_executor_s_gpus(gpus):
    assert visible_devices(["h", "h"], gpus, "h") is None
