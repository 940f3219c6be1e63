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

#: Every JVM the tests start (Spark drivers, masters, workers, executors, Connect servers;
#: the local brokers pass the same flags themselves) compiles with C1 only and collects
#: with the serial collector: a test's JVM lives for seconds to minutes, where C2's
#: compilations cost more CPU than they return (measured: a Spark driver's start and first
#: jobs take half the CPU time). On a two-core machine that CPU is the suite's time.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
if TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):  # xdist workers inherit it
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(
        filter(None, [os.environ.get("JAVA_TOOL_OPTIONS"), TEST_JVM_OPTIONS]))

#: Modules in descending order of their run time (seconds in a two-worker CI run).
LONGEST_FIRST = (
    "tests/spark/test_streaming_exactly_once.py",  # 825 (2026-11-28, partly loaded)
    "tests/spark/test_soak.py",  # 545
    "tests/project/test_readme_examples.py",  # 430 (README and five guides)
    "tests/container/test_compose_demo.py",  # 375
    "tests/spark/test_demo.py",  # 360
    "tests/spark/test_spark_connect.py",  # ~300 (two Connect server starts)
    "tests/spark/test_input_offsets.py",  # ~250 (7 tests, ~20 query runs)
    "tests/spark/test_timers_exactly_once.py",  # 230
    "tests/spark/test_two_drivers.py",  # 175
    "tests/spark/test_sink_function_crash.py",  # 135
    "tests/spark/test_clean_stop.py",  # ~130
    "tests/spark/test_subtask_placement.py",  # 120
    "tests/spark/test_streaming_keys.py",  # 120
    "tests/spark/test_three_brokers.py",  # 100
    "tests/spark/test_local_state.py",  # 95
    "tests/spark/test_checkpoint_location.py",  # 85
    "tests/spark/test_fork.py",  # 80 (measured 120 on a loaded machine)
    "tests/spark/test_container_broker_kill.py",  # 80
    "tests/spark/test_streaming_time.py",  # 75
    "tests/cli/test_cli_broker.py",  # 70
    "tests/spark/test_reader.py",  # 65
    "tests/spark/test_notebook_restart.py",  # 55
    "tests/spark/test_secured_streaming.py",  # 55
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
