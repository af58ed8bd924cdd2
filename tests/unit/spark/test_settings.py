"""What the driver reads of Spark's settings before the stage. What a barrier stage cannot train under is
refused up front in one line: Spark Connect, however asked for (`cli.check_classic_spark`), dynamic allocation
and a barrier timeout a training could outlast (`stage.check_settings`). The ranks' thread pools follow
spark.task.cpus unless the user set the executors' pool variables (`stage.rank_threads`)."""
import pytest
from pyspark import SparkConf

from mpitrain.base.errors import MpitrainError
from mpitrain.base.threads import SIZED_MARK, with_pools
from mpitrain.spark.cli import check_classic_spark
from mpitrain.spark.stage import check_settings, rank_threads


def conf(settings: dict | None = None, **dotted) -> SparkConf:
    """A SparkConf without a JVM (PySpark keeps it in Python), holding `settings` and `dotted` (dots as
    underscores)."""
    made = SparkConf(loadDefaults=False)
    for key, value in {**(settings or {}), **{k.replace("_", "."): v for k, v in dotted.items()}}.items():
        made.set(key, value)
    return made


def test_the_ranks_run_spark_task_cpus_threads_unless_the_executors_pools_are_set():
    assert rank_threads(conf()) == {"OMP_NUM_THREADS": "1"}
    assert rank_threads(conf(spark_task_cpus="3")) == {"OMP_NUM_THREADS": "3"}
    assert rank_threads(conf({"spark.task.cpus": "2", "spark.executorEnv.NUMBA_NUM_THREADS": "5"})) == \
        {"OMP_NUM_THREADS": "2", "NUMBA_NUM_THREADS": "5"}
    assert rank_threads(conf({"spark.task.cpus": "2", "spark.executorEnv.OMP_NUM_THREADS": "4"})) == \
        {"OMP_NUM_THREADS": "4"}
    # what a worker inherited (mpitrain's mark, pools it sized) is replaced, so the ranks take these as the user's
    worker = {"PATH": "/bin", "OMP_NUM_THREADS": "2", "NUMBA_NUM_THREADS": "2", SIZED_MARK: "OMP_NUM_THREADS=2"}
    assert with_pools(worker, {"OMP_NUM_THREADS": "2"}) == {"PATH": "/bin", "OMP_NUM_THREADS": "2"}


@pytest.mark.parametrize("timeout", ["365d", "24h", "86400", "2d", "90000s"])
def test_a_barrier_timeout_of_a_day_or_more_or_spark_s_default_is_accepted(timeout):
    check_settings(conf(spark_barrier_sync_timeout=timeout), 2)
    check_settings(conf(), 2)


@pytest.mark.parametrize("timeout", ["600s", "23h", "3600", "1439min"])
def test_a_shorter_barrier_timeout_is_refused_naming_it(timeout):
    with pytest.raises(MpitrainError, match=rf"^spark\.barrier\.sync\.timeout={timeout} would fail any training "
                                            r"longer than that: .* set at least 24h"):
        check_settings(conf(spark_barrier_sync_timeout=timeout), 2)


@pytest.mark.parametrize("timeout", ["soon", "10 years", "-5s"])
def test_a_barrier_timeout_that_is_not_a_time_is_refused(timeout):
    with pytest.raises(MpitrainError, match=rf"^spark\.barrier\.sync\.timeout={timeout}: expected a time"):
        check_settings(conf(spark_barrier_sync_timeout=timeout), 2)


def test_dynamic_allocation_is_refused_with_the_setting_to_change():
    with pytest.raises(MpitrainError, match=r"needs all its 3 tasks at once; set spark\.dynamicAllocation"):
        check_settings(conf(spark_dynamicAllocation_enabled="True"), 3)


@pytest.mark.parametrize("master, settings, environ, named", [
    ("sc://head:15002", {}, {}, "--master sc://head:15002"),
    (None, {"spark.remote": "sc://head"}, {}, "spark.remote"),
    (None, {"spark.api.mode": "Connect"}, {}, "spark.api.mode=connect"),
    (None, {}, {"SPARK_API_MODE": "connect"}, "spark.api.mode=connect"),
    (None, {}, {"SPARK_REMOTE": "sc://head"}, "SPARK_REMOTE"),
    (None, {}, {"SPARK_CONNECT_MODE_ENABLED": "1"}, "SPARK_CONNECT_MODE_ENABLED"),
    (None, {}, {"PYSPARK_REMOTE_INIT_CONF_LEN": "1"}, "spark-submit's --remote or spark.api.mode=connect"),
])
def test_spark_connect_is_refused_naming_what_asked_for_it(monkeypatch, master, settings, environ, named):
    for key in ("SPARK_API_MODE", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_REMOTE_INIT_CONF_LEN"):
        monkeypatch.delenv(key, raising=False)
    check_classic_spark("local[2]", {"spark.api.mode": "classic"})
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(MpitrainError, match=rf"^{named} asks for Spark Connect, whose sessions have no RDD API"):
        check_classic_spark(master, settings)
