"""Suite-wide scheduling: the longest modules first, the cluster modules on one worker.

``scripts/test.sh`` runs the suite in two pytest-xdist workers that take whole modules
(``--dist loadscope``) in this order (``--no-loadscope-reorder``). Started last, a module
of several minutes would leave one worker idle while the other finishes it; started
first, the short modules fill in around it. The list is a scheduling hint, measured on
this machine: a stale entry only costs time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.testing.pytest_plugin import local_kafka_version
from tests.jvm_class_archive import QUIET, spark_class_archive

#: Every JVM the tests start (Spark drivers, masters, workers, executors, Connect servers;
#: the local brokers pass the same flags themselves) compiles with C1 only and collects
#: with the serial collector: a test's JVM lives for seconds to minutes, where C2's
#: compilations cost more CPU than they return (measured: a Spark driver's start and first
#: jobs take half the CPU time). On a two-core machine that CPU is the suite's time.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
#: The JVMs' temporary directory for this run (``java.io.tmpdir``; removed at its end):
#: what a JVM killed -9 leaves there (lz4-java's native library, Spark's ``spark-*``,
#: ``blockmgr-*`` and ``artifacts-*`` directories) does not pile up in /tmp run after run.
JVM_TEMP_ENV = "KAFKA_CHANGELOG_TEST_JVM_TMP"
_jvm_temp_made_here: str | None = None
if TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):  # xdist workers inherit it
    _archive = spark_class_archive(TEST_JVM_OPTIONS)
    _jvm_temp_made_here = os.environ[JVM_TEMP_ENV] = tempfile.mkdtemp(
        prefix="kafka-changelog-tests-jvm-")
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(filter(None, [
        os.environ.get("JAVA_TOOL_OPTIONS"), TEST_JVM_OPTIONS,
        f"-Djava.io.tmpdir={os.environ[JVM_TEMP_ENV]}",
        f"-XX:SharedArchiveFile={_archive} {QUIET}" if _archive else ""]))

#: Modules in descending order of their run time (seconds in a two-worker run on a quiet
#: machine, summed over the module's tests; 2026-11-29).
LONGEST_FIRST = (
    "tests/spark/test_streaming_exactly_once.py",  # 330
    "tests/spark/test_older_spark.py",  # 250 (a virtualenv per release made once per machine)
    "tests/project/test_readme_examples.py",  # 250
    "tests/spark/test_spark_connect.py",  # 225
    "tests/spark/test_soak.py",  # 218
    "tests/spark/test_timers_exactly_once.py",  # 176
    "tests/spark/test_demo.py",  # 116
    "tests/spark/test_streaming_keys.py",  # 111
    "tests/spark/test_subtask_placement.py",  # 180 (three hosts, two lost in turn)
    "tests/spark/test_input_offsets.py",  # 102
    "tests/spark/test_container_broker_kill.py",  # 102
    "tests/spark/test_reader.py",  # 98
    "tests/container/test_compose_demo.py",  # 91
    "tests/spark/test_two_drivers.py",  # 90
    "tests/spark/test_sink_function_crash.py",  # 86
    "tests/spark/test_three_brokers.py",  # 85
    "tests/spark/test_secured_streaming.py",  # 85
    "tests/spark/test_streaming_time.py",  # 75
    "tests/spark/test_local_state.py",  # 74
    "tests/cli/test_cli_applications.py",  # 66
    "tests/cli/test_cli_reset.py",  # 62
    "tests/kafka/test_broker_versions.py",  # 60
    "tests/spark/test_change_feed.py",  # 57
    "tests/kafka/test_shared_topics_gc.py",  # 44
    "tests/kafka/test_kafka_tls.py",  # 44
    "tests/cli/test_cli_broker.py",  # 43
    "tests/spark/test_fork.py",  # 41
    "tests/spark/test_checkpoint_location.py",  # 38
    "tests/testing/test_harness.py",  # 36
    "tests/cli/test_cli_rewind.py",  # 35
    "tests/state/test_rocksdb_table.py",  # 35
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the modules of :data:`LONGEST_FIRST` to the front, in its order (stable:
    every other test keeps its place relative to the others)."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath

    def order(item: pytest.Item) -> int:
        path = item.path.relative_to(root).as_posix()
        return rank.get(path, len(rank))

    items.sort(key=order)


#: The modules of the three-node Kafka cluster (``kafka_cluster_3``) and of the Spark
#: standalone cluster (``spark_cluster``). One xdist worker runs them all, one after the
#: other (one work unit of ``--dist loadscope``), so that each cluster starts once in a run
#: rather than once per module and per worker (three Kafka nodes cost ~15 CPU-seconds to
#: start). ``tests/test_suite_schedule.py`` keeps the list equal to the modules that use them.
CLUSTER_MODULES = frozenset({
    "tests/kafka/test_gc_leader_change.py",
    "tests/kafka/test_kafka_leader_failure.py",
    "tests/kafka/test_stores_leader_failure.py",
    "tests/kafka/test_topic_creation.py",
    "tests/spark/test_reader.py",
    "tests/spark/test_soak.py",
    "tests/spark/test_streaming_exactly_once.py",
    "tests/spark/test_subtask_placement.py",
    "tests/spark/test_three_brokers.py",
    "tests/testing/test_harness.py",
})
#: The fixtures that make a module one of :data:`CLUSTER_MODULES`.
CLUSTER_FIXTURES = frozenset({"kafka_cluster_3", "spark_cluster"})
CLUSTER_UNIT = "tests/(the three-node Kafka and standalone Spark cluster modules)"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` whose work unit is the module, except :data:`CLUSTER_MODULES`,
    which make one unit together (other modes: xdist's own scheduler)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ClusterModulesTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::", 1)[0] in CLUSTER_MODULES:
                return CLUSTER_UNIT
            return str(super()._split_scope(nodeid))

    return ClusterModulesTogether(config, log)


class SharedClusters:
    """The three-node Kafka cluster and the standalone Spark cluster of the cluster
    modules: started by the first module that asks, stopped as soon as the worker leaves
    the cluster modules (:func:`pytest_runtest_teardown`), not at the end of its session:
    idle, three nodes and three Spark JVMs cost a tenth of a core for the rest of a run."""

    def __init__(self) -> None:
        self._kafka: LocalKafkaCluster | None = None
        self._spark: Any = None

    def kafka(self, config: pytest.Config) -> LocalKafkaCluster:
        if self._kafka is None:
            cluster = LocalKafkaCluster(nodes=3, kafka_version=local_kafka_version(config))
            self._kafka = cluster.start()
        return self._kafka

    def spark(self) -> Any:
        if self._spark is None:
            from tests.spark.standalone import LocalSparkCluster

            cluster = LocalSparkCluster(workers=2, cores_per_worker=1, hosts=True)
            cluster.start()
            self._spark = cluster
        return self._spark

    def close(self) -> None:
        kafka, spark, self._kafka, self._spark = self._kafka, self._spark, None, None
        try:
            if spark is not None:
                spark.stop()
        finally:
            if kafka is not None:
                kafka.stop()


SHARED = SharedClusters()


def _in_cluster_modules(item: pytest.Item | None) -> bool:
    return item is not None and item.nodeid.split("::", 1)[0] in CLUSTER_MODULES


@pytest.hookimpl(trylast=True)  # after the items' fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared clusters when the next test is no cluster module's (xdist runs an
    item only once it knows the next one, so ``nextitem`` is the real next test)."""
    if _in_cluster_modules(item) and not _in_cluster_modules(nextitem):
        SHARED.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the shared clusters if a run ended inside the cluster modules."""
    SHARED.close()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The process that made the JVMs' temporary directory (the xdist controller, not a
    worker or a pytest run of a test) removes it once every test and its JVMs are done."""
    if _jvm_temp_made_here is not None:
        shutil.rmtree(_jvm_temp_made_here, ignore_errors=True)


@pytest.fixture(scope="module")
def kafka_cluster_3(request: pytest.FixtureRequest) -> Iterator[LocalKafkaCluster]:
    """The plugin's three-node cluster, shared by the suite's modules (it is the plugin's
    per module otherwise): each module gets every node running and answering, whatever
    the module before it killed or paused."""
    cluster = SHARED.kafka(request.config)
    yield cluster
    for index in range(cluster.node_count):
        if not cluster.is_running(index):
            cluster.restart_node(index, timeout=120)
        else:
            cluster.resume_node(index)


@pytest.fixture(scope="module")
def spark_cluster() -> Any:
    """A Spark standalone cluster (master + 2 workers of 1 core each, local JVMs, each
    worker a host of its own: own loopback address and host-local state directory)
    shared by the cluster modules; tests that kill a worker restart it before they end,
    tests that add one remove it."""
    return SHARED.spark()
