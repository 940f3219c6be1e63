"""The tester for stateful functions runs them in plain Python: no Spark session, no
Kafka (the streaming run it agrees with is in ``test_streaming_time``)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from typing import Any

import pandas as pd
import pytest

from kafka_changelog.state.descriptors import value_state
from kafka_changelog.state.serializers import INT64
from spark_integration.streaming import StatefulTester, TimerInfo, TimerOutsideCallError

SEEN = value_state("seen", INT64, ttl=dt.timedelta(minutes=10))
COUNT = value_state("count", INT64)
MINUTE = 60_000


def count_and_remind(key: Any, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    count = state(COUNT)
    count.update((count.value() or 0) + len(rows))
    state(SEEN).update(state.context.processing_time_ms)
    state.timers.register_processing_time(state.context.processing_time_ms + 5 * MINUTE)
    return [{"key": key, "what": "count", "n": count.value()}]


def remind(key: Any, timer: TimerInfo, state: Any) -> list[dict[str, Any]]:
    return [{"key": key, "what": "remind", "n": timer.time_ms}]


def test_a_function_runs_with_a_manual_clock_timers_and_ttl() -> None:
    with StatefulTester(count_and_remind, "device", ["key", "what", "n"],
                        on_timer=remind) as tester:
        out = tester.run(pd.DataFrame({"device": [7, 7, 9]}))
        assert out == [{"key": 7, "what": "count", "n": 2}, {"key": 9, "what": "count", "n": 1}]
        assert [t.time_ms for t in tester.timers(7)] == [5 * MINUTE]
        tester.advance(dt.timedelta(minutes=4))
        assert tester.run() == []
        tester.advance(60)
        # Due timers fire by time, then key group (9's before 7's here).
        assert tester.run() == [{"key": 9, "what": "remind", "n": 5 * MINUTE},
                                {"key": 7, "what": "remind", "n": 5 * MINUTE}]
        assert tester.state(9, SEEN).value() == 0
        tester.advance(dt.timedelta(minutes=5))
        assert tester.state(9, SEEN).value() is None  # 10 minutes after its write
        assert tester.state(9, COUNT).value() == 1
        with pytest.raises(ValueError, match="processing time cannot go back"):
            tester.set_processing_time(0)


def test_a_timer_kept_past_its_call_is_refused() -> None:
    kept: list[Any] = []

    def keep(key: Any, rows: pd.DataFrame, state: Any) -> None:
        kept.append(state)

    with StatefulTester(keep, "k", ["k"]) as tester:
        tester.run([{"k": "a"}])
        with pytest.raises(TimerOutsideCallError, match="only during a call"):
            kept[0].timers.register_processing_time(1)


def test_the_tester_needs_no_spark_session_and_no_broker() -> None:
    code = ("import pandas as pd\n"
            "from spark_integration.streaming import StatefulTester\n"
            "t = StatefulTester(lambda k, rows, s: [{'k': k}], 'k', ['k'])\n"
            "assert t.run(pd.DataFrame({'k': ['x']})) == [{'k': 'x'}]\n"
            "from pyspark import SparkContext; assert SparkContext._active_spark_context is None\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
