"""Time in stateful streaming, against a real broker and Spark: the batch context, TTL'd
state, processing- and event-time timers, watermarks and late rows, a re-run batch, and a
rescale between runs. Batches are given to the processor as ``foreachBatch`` gives them,
with a clock driven by the test, so every instant is exact."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from kafka_changelog import key_group_range_for_operator
from kafka_changelog.state.schema.descriptors import list_state, value_state
from kafka_changelog.state.schema.serializers import INT64, UTF8
from spark_integration.streaming import (
    EventTime,
    EventTimeColumnError,
    StatefulTester,
    StreamingStateConfig,
    TimerInfo,
    stateful_foreach_batch,
    with_ticks,
)
from spark_integration.streaming.worker_resources import WorkerResources

pytestmark = [pytest.mark.spark, pytest.mark.broker]

MINUTE = 60_000
T0 = 1_800_000_000_000  # ms since the epoch
GAP = 30 * MINUTE
SESSION_START = value_state("session_start", INT64)
SESSION_LAST = value_state("session_last", INT64)
SESSION_EVENTS = value_state("session_events", INT64)
LAST_SEEN = value_state("last_seen", INT64, ttl=dt.timedelta(minutes=10))
PAGES = list_state("pages", UTF8, ttl=dt.timedelta(minutes=10))
OUTPUT = "user string, kind string, events long, start long, end long"


def app_config(cluster: Any, prefix: str, parallelism: int = 2) -> StreamingStateConfig:
    return StreamingStateConfig(
        application=prefix, operator_id="op", bootstrap_servers=cluster.bootstrap_servers,
        parallelism=parallelism, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, materialization_interval_s=None)


def sessionize(user: str, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    """Event-time sessions: a session ends ``GAP`` after its last event."""
    start, last, events = state(SESSION_START), state(SESSION_LAST), state(SESSION_EVENTS)
    times = [int(t.timestamp() * 1000) for t in rows["ts"]]
    if last.value() is not None:
        state.timers.delete_event_time(last.value() + GAP)
    if start.value() is None:
        start.update(min(times))
    last.update(max([*times, last.value() or 0]))
    events.update((events.value() or 0) + len(times))
    state.timers.register_event_time(last.value() + GAP)
    return []


def close_session(user: str, timer: TimerInfo, state: Any) -> list[dict[str, Any]]:
    start, last, events = state(SESSION_START), state(SESSION_LAST), state(SESSION_EVENTS)
    summary = {"user": user, "kind": "session", "events": events.value(),
               "start": start.value(), "end": last.value()}
    for s in (start, last, events):
        s.clear()
    assert timer.time_ms == summary["end"] + GAP
    return [summary]


def events_frame(spark: Any, events: list[tuple[str, int]]) -> Any:
    rows = [(user, dt.datetime.fromtimestamp((T0 + ms) / 1000, dt.timezone.utc))
            for user, ms in events]
    return spark.createDataFrame(rows, "user string, ts timestamp")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def prefix() -> Iterator[str]:
    yield f"time-{uuid.uuid4().hex[:8]}"


def run(processor: Any, frames: list[Any], first_batch: int = 0) -> dict[int, list[dict[str,
                                                                                         Any]]]:
    outputs: dict[int, list[dict[str, Any]]] = {}
    processor.sink = lambda out, batch_id: outputs.__setitem__(
        batch_id, sorted(out.toPandas().to_dict("records"), key=lambda r: r["user"]))
    for offset, frame in enumerate(frames):
        processor(frame, first_batch + offset)
    return outputs


def test_event_time_sessions_close_when_the_watermark_passes_and_late_rows_are_counted(
    spark: Any, kafka_cluster: Any, prefix: str
) -> None:
    config = app_config(kafka_cluster, prefix)
    clock = Clock()
    processor = stateful_foreach_batch(config, sessionize, "user", OUTPUT,
                                       on_timer=close_session,
                                       event_time=EventTime.of("ts", dt.timedelta(minutes=5)),
                                       clock=clock)
    try:
        frames = [
            events_frame(spark, [("a", 0), ("a", 10 * MINUTE), ("b", 5 * MINUTE)]),
            events_frame(spark, [("a", 20 * MINUTE)]),
            # Watermark after this batch: 100 - 5 = 95 min; a's session ends at 50, b's at 35.
            events_frame(spark, [("c", 100 * MINUTE)]),
            # Runs with watermark 95 min: d's event at 6 min is late (dropped, counted).
            events_frame(spark, [("c", 101 * MINUTE), ("d", 6 * MINUTE)]),
        ]
        outputs = run(processor, frames)
        assert outputs[0] == outputs[1] == outputs[2] == []
        assert outputs[3] == [
            {"user": "a", "kind": "session", "events": 3, "start": T0, "end": T0 + 20 * MINUTE},
            {"user": "b", "kind": "session", "events": 1, "start": T0 + 5 * MINUTE,
             "end": T0 + 5 * MINUTE},
        ]
        reports = processor.reports
        assert [r.watermark_ms for r in reports] == [None, T0 + 5 * MINUTE,
                                                      T0 + 15 * MINUTE, T0 + 95 * MINUTE]
        assert reports[-1].next_watermark_ms == T0 + 96 * MINUTE
        assert sum(m.late_rows for m in reports[3].subtask_metrics.values()) == 1
        assert sum(m.timers_fired for m in reports[3].subtask_metrics.values()) == 2
        # Nothing else fires before the watermark passes c's session (101 + 30 min).
        clock.now += 60 * MINUTE
        quiet = run(processor, [events_frame(spark, [("c", 120 * MINUTE)])], 4)
        assert quiet[4] == []
    finally:
        processor.close()


def sessionize_vectorized(rows: pd.DataFrame, state: Any) -> None:
    """``sessionize`` for every key of the batch at once."""
    times = pd.to_datetime(rows["ts"], utc=True).astype("int64") // 1_000_000
    grouped = times.groupby(state.key_index)
    firsts, lasts, counts = grouped.min().tolist(), grouped.max().tolist(), grouped.count()
    keys = state.keys
    start, last = state.value(SESSION_START), state.value(SESSION_LAST)
    events = state.value(SESSION_EVENTS)
    old_last = last.get(keys)
    open_keys = [k for k, t in zip(keys, old_last, strict=True) if t is not None]
    state.timers.delete_event_time(open_keys, [t + GAP for t in old_last if t is not None])
    start.set(keys, [s if s is not None else f
                     for s, f in zip(start.get(keys), firsts, strict=True)])
    new_last = [max(m, t or 0) for m, t in zip(lasts, old_last, strict=True)]
    last.set(keys, new_last)
    events.set(keys, [(e or 0) + int(c) for e, c in zip(events.get(keys), counts, strict=True)])
    state.timers.register_event_time(keys, [t + GAP for t in new_last])


def close_sessions_vectorized(timers: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    keys = [state.keys[i] for i in timers["key_index"]]
    start, last = state.value(SESSION_START), state.value(SESSION_LAST)
    events = state.value(SESSION_EVENTS)
    out = [{"user": k, "kind": "session", "events": e, "start": s, "end": t}
           for k, e, s, t in zip(keys, events.get(keys), start.get(keys), last.get(keys),
                                 strict=True)]
    for s in (start, last, events):
        s.clear(keys)
    return out


def test_vectorized_sessions_give_exactly_the_per_key_outputs(
    spark: Any, kafka_cluster: Any, prefix: str
) -> None:
    frames = [
        events_frame(spark, [("a", 0), ("a", 10 * MINUTE), ("b", 5 * MINUTE)]),
        events_frame(spark, [("a", 20 * MINUTE)]),
        events_frame(spark, [("c", 100 * MINUTE)]),
        events_frame(spark, [("c", 101 * MINUTE), ("d", 6 * MINUTE)]),
        events_frame(spark, [("c", 140 * MINUTE)]),
    ]
    results = []
    for name, fn, on_timer, vectorized in [
        ("per-key", sessionize, close_session, False),
        ("vectorized", sessionize_vectorized, close_sessions_vectorized, True),
    ]:
        config = app_config(kafka_cluster, f"{prefix}-{name}")
        with stateful_foreach_batch(config, fn, "user", OUTPUT, on_timer=on_timer,
                                    event_time=EventTime.of("ts", dt.timedelta(minutes=5)),
                                    vectorized=vectorized, clock=Clock()) as processor:
            results.append(run(processor, frames))
    assert results[0] == results[1]
    assert [r["user"] for r in results[0][3]] == ["a", "b"]
    assert results[0][4] == []  # batch 4 runs with watermark 96 min; c's session ends at 131


def test_the_tester_gives_what_a_streaming_run_gives(spark: Any, kafka_cluster: Any,
                                                      prefix: str) -> None:
    batches = [[("a", 0), ("a", 10 * MINUTE), ("b", 5 * MINUTE)], [("a", 20 * MINUTE)],
               [("c", 100 * MINUTE)], [("c", 101 * MINUTE), ("d", 6 * MINUTE)], []]
    event_time = EventTime.of("ts", dt.timedelta(minutes=5))
    config = app_config(kafka_cluster, prefix)
    with stateful_foreach_batch(config, sessionize, "user", OUTPUT, on_timer=close_session,
                                event_time=event_time, clock=Clock()) as processor:
        streamed = run(processor, [events_frame(spark, b) for b in batches])
    columns = ["user", "kind", "events", "start", "end"]
    with StatefulTester(sessionize, "user", columns, on_timer=close_session,
                        event_time=event_time, start=T0) as tester:
        tested = {}
        for batch_id, events in enumerate(batches):
            frame = events_frame(spark, events).toPandas()
            tested[batch_id] = sorted(tester.run(frame), key=lambda r: r["user"])
        assert tester.state("c", SESSION_EVENTS).value() == 2
        assert [t.time_ms for t in tester.timers("c")] == [T0 + 131 * MINUTE]
        assert sum(m.late_rows for m in tester.metrics) == 1
    assert tested == streamed


def remember(user: str, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    """Processing time: a TTL'd last-seen time and pages, and a reminder timer."""
    now = state.context.processing_time_ms
    state(LAST_SEEN).update(now)
    state(PAGES).add_all(list(rows["page"]))
    state.timers.register_processing_time(now + 15 * MINUTE)
    return [{"user": user, "kind": "seen", "events": len(state(PAGES).get()), "start": now,
             "end": now}]


def remind(user: str, timer: TimerInfo, state: Any) -> list[dict[str, Any]]:
    seen = state(LAST_SEEN).value()
    return [{"user": user, "kind": "reminder", "events": len(state(PAGES).get()),
             "start": timer.time_ms, "end": -1 if seen is None else seen}]


def pages_frame(spark: Any, rows: list[tuple[str, str]]) -> Any:
    return spark.createDataFrame(rows or [], "user string, page string")


def live_state(config: StreamingStateConfig, users: list[str], at_ms: int
               ) -> dict[str, tuple[int | None, list[str]]]:
    coordinator = WorkerResources.coordinator(config)
    backend = coordinator.restore_keyed(
        config.operator_id, key_group_range_for_operator(config.max_parallelism, 1, 0),
        coordinator.checkpoint(), config.changelog())
    try:
        backend.set_processing_time(at_ms)
        found = {}
        for user in users:
            backend.set_current_key(user.encode())
            found[user] = (backend.state(LAST_SEEN).value(), backend.state(PAGES).get())
        return found
    finally:
        backend.close()


def test_ttl_and_processing_time_timers_follow_the_batch_clock_across_a_rescale(
    spark: Any, kafka_cluster: Any, prefix: str
) -> None:
    clock = Clock()
    config = app_config(kafka_cluster, prefix, parallelism=2)
    with stateful_foreach_batch(config, remember, "user", OUTPUT, on_timer=remind,
                                clock=clock) as processor:
        out = run(processor, [pages_frame(spark, [("a", "/1"), ("b", "/1")])])
        assert [r["events"] for r in out[0]] == [1, 1]
        clock.now = T0 + 8 * MINUTE
        out = run(processor, [pages_frame(spark, [("a", "/2")])], 1)
        assert out[1] == [{"user": "a", "kind": "seen", "events": 2, "start": clock.now,
                           "end": clock.now}]
    # The reader and the CLI show the state as the function saw it, with each expiry.
    assert reader_view(spark, config) == {
        ("a", "last_seen", None): (str(T0 + 8 * MINUTE), T0 + 18 * MINUTE),
        ("a", "pages", 0): ("/1", T0 + 10 * MINUTE),
        ("a", "pages", 1): ("/2", T0 + 18 * MINUTE),
        ("b", "last_seen", None): (str(T0), T0 + 10 * MINUTE),
        ("b", "pages", 0): ("/1", T0 + 10 * MINUTE),
    }
    shown = cli_state(config, "a")
    assert shown == {"last_seen": (T0 + 8 * MINUTE, T0 + 18 * MINUTE),
                     "pages": (["/1", "/2"], [T0 + 10 * MINUTE, T0 + 18 * MINUTE])}
    # A new run at parallelism 3: state and timers follow their key groups.
    rescaled = app_config(kafka_cluster, prefix, parallelism=3)
    with stateful_foreach_batch(rescaled, remember, "user", OUTPUT, on_timer=remind,
                                clock=clock) as processor:
        # 12 min: b's entries (written at 0) expired, a's first page too; no timer due.
        clock.now = T0 + 12 * MINUTE
        out = run(processor, [pages_frame(spark, [])], 2)
        assert out[2] == []
        assert live_state(rescaled, ["a", "b"], clock.now) == {
            "a": (T0 + 8 * MINUTE, ["/2"]), "b": (None, [])}
        # 16 min, a batch without rows: the reminders due at 15 fire (a's second, at 23,
        # not yet); b's state expired at 10, a's last page lives until 18.
        clock.now = T0 + 16 * MINUTE
        out = run(processor, [pages_frame(spark, [])], 3)
        assert out[3] == [
            {"user": "a", "kind": "reminder", "events": 1, "start": T0 + 15 * MINUTE,
             "end": T0 + 8 * MINUTE},
            {"user": "b", "kind": "reminder", "events": 0, "start": T0 + 15 * MINUTE,
             "end": -1}]
        clock.now = T0 + 30 * MINUTE
        out = run(processor, [pages_frame(spark, [])], 4)
        assert [(r["user"], r["start"]) for r in out[4]] == [("a", T0 + 23 * MINUTE)]
        # Everything expired and nothing read it: the expiry timers removed it.
        state_rows = sum(m.state_rows for m in processor.reports[-1].subtask_metrics.values())
        assert state_rows == 0
        # A re-run of the last batch (the query restarted before Spark recorded it) sees
        # the processing time its checkpoint recorded, and fires nothing twice.
        clock.now = T0 + 90 * MINUTE
        again = run(processor, [pages_frame(spark, [])], 4)
        assert again[4] == out[4]
        assert processor.reports[-1].processing_time_ms == T0 + 30 * MINUTE
        assert not processor.reports[-1].committed


def reader_view(spark: Any, config: StreamingStateConfig
                ) -> dict[tuple[str, str, int | None], tuple[str, int]]:
    """The TTL'd states' rows of the latest checkpoint, read with the Spark reader."""
    rows = (spark.read.format("kafka-changelog")
            .option("kafka.bootstrap.servers", config.bootstrap_servers)
            .option("application", config.application).option("mode", "state")
            .option("changelog.topic", config.changelog_topic)
            .option("snapshot.topic", config.snapshot_topic)
            .option("checkpoint.topic", config.checkpoint_topic).load()
            .where("state in ('last_seen', 'pages')").collect())
    return {(r.key_decoded, r.state, r.list_index): (
        r.value_decoded, int(r.expires_at.timestamp() * 1000)) for r in rows}


def cli_state(config: StreamingStateConfig, key: str) -> dict[str, tuple[Any, Any]]:
    """``kafka-changelog state APP --key KEY --json``: TTL'd states' values and expiries."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "kafka_changelog.cli", "state", config.application,
         "--operator", config.operator_id, "--key", key, "-b", config.bootstrap_servers,
         "--changelog-topic", config.changelog_topic, "--snapshot-topic",
         config.snapshot_topic, "--checkpoint-topic", config.checkpoint_topic, "--json"],
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    return {s["state"]: (s["value"], s["expires_at_ms"]) for s in json.loads(done.stdout)["states"]
            if s["state"] in ("last_seen", "pages")}


def test_an_event_time_column_that_is_missing_or_not_a_timestamp_is_refused(
    spark: Any, kafka_cluster: Any, prefix: str
) -> None:
    config = app_config(kafka_cluster, prefix)
    for column, frame, message in [
        ("when", events_frame(spark, [("a", 0)]), "'when' is not a column of the batch"),
        ("user", events_frame(spark, [("a", 0)]), "'user' is string, expected a timestamp"),
    ]:
        with stateful_foreach_batch(config, sessionize, "user", OUTPUT,
                                    on_timer=close_session,
                                    event_time=EventTime.of(column, 0)) as processor:
            with pytest.raises(EventTimeColumnError, match=message):
                processor(frame, 0)
            assert not processor.reports


def test_an_event_time_timer_without_an_event_time_column_fails_the_batch(
    spark: Any, kafka_cluster: Any, prefix: str
) -> None:
    config = app_config(kafka_cluster, prefix)
    with stateful_foreach_batch(config, sessionize, "user", OUTPUT,
                                on_timer=close_session) as processor:
        with pytest.raises(Exception, match="no event-time column is declared"):
            processor(events_frame(spark, [("a", 0)]), 0)
        assert WorkerResources.coordinator(config).checkpoint() is None


def test_with_ticks_a_query_whose_input_pauses_fires_processing_time_timers(
    spark: Any, kafka_cluster: Any, prefix: str, tmp_path: Any
) -> None:
    """Spark runs a micro-batch only when a source has new data: ``with_ticks`` makes one
    at every trigger, so reminders fire while the input is quiet, and the function never
    sees a tick row."""
    import time

    clock = Clock()
    config = app_config(kafka_cluster, prefix)
    source = tmp_path / "pages"
    source.mkdir()
    (source / "0.json").write_text('{"user": "a", "page": "/1"}\n{"user": "b", "page": "/1"}\n')
    outputs: list[tuple[int, dict[str, Any]]] = []
    processor = stateful_foreach_batch(
        config, remember, "user", OUTPUT, on_timer=remind, clock=clock,
        sink=lambda out, batch_id: outputs.extend(
            (batch_id, r) for r in out.toPandas().to_dict("records")))
    stream = with_ticks(spark.readStream.schema("user string, page string").json(str(source)))
    query = (stream.writeStream.foreachBatch(processor)
             .option("checkpointLocation", str(tmp_path / "spark-checkpoint"))
             .trigger(processingTime="1 second").start())

    def wait_for(condition: Any, what: str) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"no {what} within 120 s: {outputs}"
            time.sleep(0.2)

    try:
        wait_for(lambda: len(outputs) == 2, "outputs of the first batch")
        seen_batch = outputs[0][0]
        assert sorted(r["user"] for _, r in outputs) == ["a", "b"]
        assert {r["kind"] for _, r in outputs} == {"seen"}
        # No new input from here on: batches keep coming, with no rows.
        clock.now = T0 + 16 * MINUTE
        wait_for(lambda: len(outputs) == 4, "reminders")
        reports = {r.batch_id: r for r in processor.reports}
        wait_for(lambda: processor.batches_run >= len(reports) + 2, "batches after them")
    finally:
        query.stop()
        processor.close()
    reminders = outputs[2:]
    assert sorted((r["user"], r["kind"], r["start"]) for _, r in reminders) == [
        ("a", "reminder", T0 + 15 * MINUTE), ("b", "reminder", T0 + 15 * MINUTE)]
    fired_in = {batch_id for batch_id, _ in reminders}
    assert len(fired_in) == 1 and min(fired_in) > seen_batch
    quiet = processor.reports[-1]
    assert all(m.rows_in == 0 for r in processor.reports if r.batch_id in fired_in
               for m in r.subtask_metrics.values())
    assert sum(m.rows_in for m in quiet.subtask_metrics.values()) == 0
    assert len(outputs) == 4  # each reminder exactly once, nothing from later batches


def test_the_tester_runs_the_demos_session_function_as_a_streaming_run_does(
    spark: Any, kafka_cluster: Any, prefix: str
) -> None:
    """The main job's sessions (``examples.sessions``) batch by batch, in the tester and
    in a streaming run on the same input: the same outputs per batch, and together with
    the sessions left open, every session of the clicks."""
    from examples import sessions

    frames = []
    all_clicks = sessions.clicks(240, 12)
    all_clicks += sessions.closing_clicks(all_clicks, 60)
    for first in range(0, len(all_clicks), 60):
        frame = pd.DataFrame(all_clicks[first:first + 60])[["user", "seq", "ts", "page"]]
        frame["event_time"] = pd.to_datetime(frame["ts"], unit="ms", utc=True)
        frames.append(frame)
    frames.append(frames[0].iloc[0:0])  # no rows: the closing clicks' watermark fires timers
    event_time = EventTime.of("event_time", dt.timedelta(minutes=5))
    config = app_config(kafka_cluster, prefix)
    schema = ("user string, seq long, ts long, page string, event_time timestamp")
    with stateful_foreach_batch(config, sessions.update_session, "user",
                                sessions.OUTPUT_SCHEMA, on_timer=sessions.close_session,
                                order_by=["ts"], event_time=event_time,
                                clock=Clock()) as processor:
        streamed = run(processor, [spark.createDataFrame(f, schema) for f in frames])
        fired = sum(m.timers_fired for r in processor.reports
                    for m in r.subtask_metrics.values())
    with StatefulTester(sessions.update_session, "user", ["user", "start", "end", "clicks"],
                        on_timer=sessions.close_session, order_by=["ts"],
                        event_time=event_time, start=T0) as tester:
        tested = {batch_id: sorted(tester.run(frame), key=lambda r: r["user"])
                  for batch_id, frame in enumerate(frames)}
        still_open = [(user, tester.state(user, sessions.START).value(),
                       tester.state(user, sessions.LAST).value(),
                       tester.state(user, sessions.CLICKS).value())
                      for user in sorted({c["user"] for c in all_clicks})
                      if tester.state(user, sessions.START).value() is not None]
    assert tested == {b: sorted(rows, key=lambda r: r["user"]) for b, rows in streamed.items()}
    closed = [(r["user"], r["start"], r["end"], r["clicks"]) for rows in tested.values()
              for r in rows]
    assert sorted(closed + still_open) == sessions.expected_sessions(all_clicks)
    assert still_open == [("night-owl", all_clicks[-60]["ts"], all_clicks[-1]["ts"], 60)]
    assert fired >= 12  # the closing clicks' watermark closed every user's last session
