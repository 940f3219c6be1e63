"""Suite-wide collection order: the longest modules first.

``scripts/test.sh`` runs the suite in two pytest-xdist workers that take the next test
one at a time (``--maxschedchunk 1``). Started last, a test of several minutes would
leave one worker idle while the other finishes it; started first, the short tests fill
in around it. Whole modules move (their tests stay together and in order), so module
fixtures are set up as before. The list is a scheduling hint, measured on this
project's CI machine: a stale entry only costs time.
"""

from __future__ import annotations

import os

import pytest

from tests.jvm_class_archive import QUIET, spark_class_archive

#: Every JVM the tests start (Spark drivers, masters, workers, executors, Connect servers;
#: the local brokers pass the same flags themselves) compiles with C1 only and collects
#: with the serial collector: a test's JVM lives for seconds to minutes, where C2's
#: compilations cost more CPU than they return (measured: a Spark driver's start and first
#: jobs take half the CPU time). On a two-core machine that CPU is the suite's time.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
if TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):  # xdist workers inherit it
    _archive = spark_class_archive(TEST_JVM_OPTIONS)
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(filter(None, [
        os.environ.get("JAVA_TOOL_OPTIONS"), TEST_JVM_OPTIONS,
        f"-XX:SharedArchiveFile={_archive} {QUIET}" if _archive else ""]))

#: Modules in descending order of their run time (seconds in a two-worker run on a quiet
#: machine, summed over the module's tests).
LONGEST_FIRST = (
    "tests/spark/test_streaming_exactly_once.py",  # ~600 (2026-11-28: 840 before the cuts)
    "tests/project/test_readme_examples.py",  # 490 (README and five guides)
    "tests/spark/test_demo.py",  # 240
    "tests/spark/test_timers_exactly_once.py",  # ~195
    "tests/spark/test_subtask_placement.py",  # 205
    "tests/spark/test_soak.py",  # ~180 (the short seed)
    "tests/spark/test_streaming_keys.py",  # 175
    "tests/spark/test_spark_connect.py",  # 175 (two Connect server starts)
    "tests/spark/test_two_drivers.py",  # 160
    "tests/spark/test_input_offsets.py",  # 150
    "tests/spark/test_three_brokers.py",  # 125
    "tests/container/test_compose_demo.py",  # ~110 (one job in the demo image)
    "tests/spark/test_sink_function_crash.py",  # 95
    "tests/spark/test_streaming_time.py",  # 90
    "tests/spark/test_container_broker_kill.py",  # 85
    "tests/spark/test_reader.py",  # 85
    "tests/cli/test_cli_applications.py",  # 80
    "tests/spark/test_local_state.py",  # 75
    "tests/spark/test_secured_streaming.py",  # 75
    "tests/testing/test_harness.py",  # 65
    "tests/kafka/test_kafka_tls.py",  # 55
    "tests/spark/test_checkpoint_location.py",  # 50
    "tests/state/test_rocksdb_table.py",  # 50
    "tests/kafka/test_topic_creation.py",  # 50
    "tests/cli/test_cli_reset.py",  # 50
    "tests/kafka/test_stores_leader_failure.py",  # 50
    "tests/spark/test_clean_stop.py",  # 45
    "tests/spark/test_notebook_restart.py",  # 45
    "tests/spark/test_fork.py",  # 45
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
