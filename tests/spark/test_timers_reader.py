"""The reader's mode ``timers``: the timers a streaming query registered, decoded (key,
domain, time, the expiring state); mode ``state`` no longer shows the reserved timers
state. A real broker and a real ``local[2]`` Spark."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from kafka_changelog import key_group_for_key
from kafka_changelog.state import INT64, value_state
from spark_integration.reader.datasource import TIMERS_STRUCT
from spark_integration.reader.timer_rows import TIMERS_SCHEMA
from spark_integration.streaming import EventTime, StreamingStateConfig, stateful_foreach_batch

pytestmark = [pytest.mark.spark, pytest.mark.broker]

MINUTE = 60_000
T0 = 1_800_000_000_000  # ms since the epoch: the batch's processing time
GAP = 30 * MINUTE
EVENTS = value_state("events", INT64)
LAST_EVENT = value_state("last_event", INT64, ttl=dt.timedelta(minutes=10))


def track(user: str, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    """Per user: an event-time timer ``GAP`` after its last event, a processing-time timer
    15 minutes after the batch, and a TTL'd state (the backend's expiry timer)."""
    times = [int(t.timestamp() * 1000) for t in rows["ts"]]
    state(EVENTS).update(len(times))
    state(LAST_EVENT).update(max(times))
    state.timers.register_event_time(max(times) + GAP)
    state.timers.register_processing_time(state.context.processing_time_ms + 15 * MINUTE)
    return []


def at(ms: int) -> dt.datetime:
    """``ms`` as ``collect()`` gives a timestamp back: naive, in the local time zone."""
    return dt.datetime.fromtimestamp(ms / 1000)


@pytest.fixture
def application(spark: Any, kafka_cluster: Any) -> Iterator[StreamingStateConfig]:
    """One committed batch of ``track``: a at T0 and T0 + 10 min, b at T0 + 5 min."""
    prefix = f"timers-{uuid.uuid4().hex[:8]}"
    config = StreamingStateConfig(
        application=prefix, operator_id="op", bootstrap_servers=kafka_cluster.bootstrap_servers,
        parallelism=2, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, materialization_interval_s=None)
    rows = [(user, dt.datetime.fromtimestamp((T0 + ms) / 1000, dt.timezone.utc))
            for user, ms in [("a", 0), ("a", 10 * MINUTE), ("b", 5 * MINUTE)]]
    with stateful_foreach_batch(config, track, "user", "user string",
                                event_time=EventTime.of("ts", dt.timedelta(minutes=5)),
                                clock=lambda: T0) as processor:
        processor.sink = lambda out, batch_id: None
        processor(spark.createDataFrame(rows, "user string, ts timestamp"), 0)
    yield config


def read(spark: Any, config: StreamingStateConfig, **extra: str) -> Any:
    return (spark.read.format("kafka-changelog").options(**config.reader_options())
            .options(**extra).load())


def test_the_arrow_schema_is_the_one_spark_expects() -> None:
    from spark_integration.sessions.spark_versions import arrow_schema_of

    assert arrow_schema_of(TIMERS_STRUCT).equals(TIMERS_SCHEMA)
    assert TIMERS_STRUCT.simpleString() == (
        "struct<operator:string,key_group:int,key:binary,key_decoded:string,domain:string,"
        "time:timestamp,state:string>")


def test_mode_timers_shows_the_registered_timers_decoded_and_mode_state_hides_them(
    spark: Any, application: StreamingStateConfig
) -> None:
    timers = read(spark, application, mode="timers")
    assert timers.schema == TIMERS_STRUCT
    found = sorted((tuple(bytes(v) if isinstance(v, bytearray) else v for v in row)
                    for row in timers.collect()), key=lambda r: (r[3], r[4], r[5]))

    def group(user: str) -> int:
        return key_group_for_key(user.encode(), application.max_parallelism)

    assert found == [
        ("op", group("a"), b"a", "a", "event_time", at(T0 + 10 * MINUTE + GAP), None),
        ("op", group("a"), b"a", "a", "expiry", at(T0 + 10 * MINUTE), "last_event"),
        ("op", group("a"), b"a", "a", "processing_time", at(T0 + 15 * MINUTE), None),
        ("op", group("b"), b"b", "b", "event_time", at(T0 + 5 * MINUTE + GAP), None),
        ("op", group("b"), b"b", "b", "expiry", at(T0 + 10 * MINUTE), "last_event"),
        ("op", group("b"), b"b", "b", "processing_time", at(T0 + 15 * MINUTE), None),
    ]

    state = read(spark, application, mode="state")
    assert sorted((r.state, r.key_decoded, r.value_decoded, r.expires_at)
                  for r in state.collect()) == [
        ("events", "a", "2", None),
        ("events", "b", "1", None),
        ("last_event", "a", str(T0 + 10 * MINUTE), at(T0 + 10 * MINUTE)),
        ("last_event", "b", str(T0 + 5 * MINUTE), at(T0 + 10 * MINUTE)),
    ]

    # Filters on the key read only its key groups (pushdown), as in mode state.
    pushed = (read(spark, application, mode="timers", pushdown="true")
              .where("key_decoded = 'b'").select("domain", "time").collect())
    assert sorted((r.domain, r.time) for r in pushed) == [
        ("event_time", at(T0 + 5 * MINUTE + GAP)), ("expiry", at(T0 + 10 * MINUTE)),
        ("processing_time", at(T0 + 15 * MINUTE))]
