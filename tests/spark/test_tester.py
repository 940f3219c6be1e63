"""The tester for stateful functions runs them in plain Python: no Spark session, no
Kafka (the streaming run it agrees with is in ``test_streaming_time``)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from typing import Any

import pandas as pd
import pytest

from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64
from spark_integration.streaming import (
    EventTime,
    EventTimeColumnError,
    StatefulTester,
    TimerInfo,
    TimerOutsideCallError,
)

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


EVENTS = value_state("events", INT64)
HOUR_MS = 3_600_000
#: 2026-01-01 00:00 UTC, ms since the epoch.
DAY_MS = 1_767_225_600_000


def count_until_quiet(key: Any, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    """Counts a key's events; an event-time timer an hour after its latest event."""
    events = state(EVENTS)
    events.update((events.value() or 0) + len(rows))
    latest = pd.Timestamp(rows["ts"].max())
    state.timers.register_event_time(latest + dt.timedelta(hours=1))
    return []


def report_quiet(key: Any, timer: TimerInfo, state: Any) -> list[dict[str, Any]]:
    return [{"key": key, "events": state(EVENTS).value(), "at": timer.time_ms}]


def event_rows(unit: str, zone: str | None, offsets_ms: list[int]) -> pd.DataFrame:
    """Rows of key ``u`` at ``DAY_MS + offset`` with a ``ts`` column of unit ``unit``."""
    ts = pd.Series(pd.to_datetime([DAY_MS + o for o in offsets_ms], unit="ms")
                   ).astype(f"datetime64[{unit}]")
    if zone is not None:
        ts = ts.dt.tz_localize("UTC").dt.tz_convert(zone)
    return pd.DataFrame({"k": ["u"] * len(offsets_ms), "ts": ts})


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("zone", [None, "UTC", "Asia/Kolkata"])
def test_the_watermark_follows_event_times_of_any_unit_and_time_zone(
        unit: str, zone: str | None) -> None:
    with StatefulTester(count_until_quiet, "k", ["key", "events", "at"],
                        on_timer=report_quiet,
                        event_time=EventTime.of("ts", dt.timedelta(minutes=5))) as tester:
        rows = event_rows(unit, zone, [0, 2_000, 60_000])
        assert str(rows["ts"].dtype) == (f"datetime64[{unit}, {zone}]" if zone
                                         else f"datetime64[{unit}]")
        assert tester.run(rows) == []
        # The largest event time minus the 5 minutes' delay, in ms: not a millionth of it.
        assert tester.watermark_ms == DAY_MS + 60_000 - 300_000
        assert [t.time_ms for t in tester.timers("u")] == [DAY_MS + 60_000 + HOUR_MS]
        # An event 2 hours on moves the watermark past the timer: it fires in the next batch.
        assert tester.run(event_rows(unit, zone, [2 * HOUR_MS])) == []
        assert tester.watermark_ms == DAY_MS + 2 * HOUR_MS - 300_000
        assert tester.run() == [{"key": "u", "events": 4, "at": DAY_MS + 60_000 + HOUR_MS}]
        assert tester.metrics[1].late_rows == 0


def test_a_parquet_file_of_ms_timestamps_gives_the_right_watermark(tmp_path: Any) -> None:
    path = tmp_path / "events.parquet"
    event_rows("ms", "UTC", [0, 60_000]).to_parquet(path)
    rows = pd.read_parquet(path)
    assert str(rows["ts"].dtype) == "datetime64[ms, UTC]"
    with StatefulTester(count_until_quiet, "k", ["key", "events", "at"],
                        on_timer=report_quiet, event_time=EventTime.of("ts", 0)) as tester:
        tester.run(rows)
        assert tester.watermark_ms == DAY_MS + 60_000
        tester.advance_watermark(DAY_MS + 60_000 + HOUR_MS)
        assert tester.run() == [{"key": "u", "events": 2, "at": DAY_MS + 60_000 + HOUR_MS}]


def test_an_event_time_column_without_timestamps_is_refused_naming_it() -> None:
    with StatefulTester(count_until_quiet, "k", ["key", "events", "at"],
                        on_timer=report_quiet, event_time=EventTime.of("ts", 0)) as tester:
        with pytest.raises(EventTimeColumnError) as caught:
            tester.run(pd.DataFrame({"k": ["u"], "ts": [DAY_MS]}))
        assert str(caught.value).startswith(
            "event-time column 'ts' has dtype int64, which cannot be read as event times: "
            "it holds no timestamps;")
        assert tester.watermark_ms is None


def test_initial_state_rows_come_before_the_first_batch() -> None:
    """``on_initial_state`` gets each key's initial rows (its own columns) before the first
    batch's rows; later batches refuse initial rows."""
    seen: list[tuple[str, list[str]]] = []

    def from_history(key: str, rows: pd.DataFrame, state: Any) -> None:
        seen.append((key, list(rows.columns)))
        state(COUNT).update(int(rows["n"].sum()))

    tester = StatefulTester(count_and_remind, "key", ["key", "what", "n"],
                            on_initial_state=from_history)
    out = tester.run([{"key": "a"}, {"key": "a"}, {"key": "c"}],
                     initial_state=[{"key": "a", "n": 10}, {"key": "b", "n": 5},
                                    {"key": "a", "n": 1}])
    assert sorted(seen) == [("a", ["key", "n"]), ("b", ["key", "n"])]
    assert [(r["key"], r["n"]) for r in out] == [("a", 13), ("c", 1)]
    assert tester.state("b", COUNT).value() == 5
    with pytest.raises(ValueError, match="initial_state is for the first batch, not batch 1"):
        tester.run([{"key": "a"}], initial_state=[{"key": "a", "n": 1}])
