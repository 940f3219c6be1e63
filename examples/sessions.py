"""The sessions job: a user's session closes 30 minutes (event time) after its last
click, and its summary is written to Kafka, exactly once; each user's last pages live 10
minutes (processing time) in a TTL'd list.

The input is the clickstream (:mod:`examples.events`) with an event time per click
(``ts``, ms since the epoch: :func:`event_time_of`), read with Spark's Kafka connector.
Each click moves its user's session end (an event-time timer at last click + gap);
when the watermark (the largest event time seen minus the allowed lateness) passes the
end, ``close_session`` emits ``user, start, end, clicks`` and clears the session. The
summaries are committed with the batch's checkpoint in one Kafka transaction per
subtask. :func:`expected_sessions` computes the sessions straight from the clicks,
which is what the tests hold the job's outputs and state against.

``python -m examples.sessions --bootstrap-servers HOST:PORT --checkpoint-dir DIR
--expected-events N`` runs the query until N clicks were read.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterable
from typing import Any

import pandas as pd
from confluent_kafka import Producer

from kafka_changelog.state import INT64, UTF8, list_state, value_state
from spark_integration import KafkaOutputSink
from spark_integration.streaming import (
    BatchListener,
    EventTime,
    KeyState,
    StatefulFunction,
    StreamingStateConfig,
    TaskListener,
    TimerFunction,
    TimerInfo,
    stateful_foreach_batch,
)

from .clickstream import await_records, ensure_topic, read_committed
from .events import events
from .job_options import job_parser, spark_settings, state_config

#: Inactivity (event time) after which a session closes.
GAP = dt.timedelta(minutes=30)
GAP_MS = GAP // dt.timedelta(milliseconds=1)
#: Event time of the first click (ms since the epoch).
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
START = value_state("session_start", INT64)
LAST = value_state("session_last", INT64)
CLICKS = value_state("session_clicks", INT64)
RECENT_PAGES = list_state("recent_pages", UTF8, ttl=dt.timedelta(minutes=10))
OUTPUT_SCHEMA = "user string, start long, end long, clicks long"
EVENT_SCHEMA = "seq long, ts long, page string"


def event_time_of(seq: int, users: int) -> int:
    """The event time of click ``seq``: clicks ``2 * GAP / users`` apart, so a user's
    clicks are two gaps apart on average and about half of them start a new session."""
    return T0 + seq * (2 * GAP_MS // users)


def clicks(count: int, users: int, first_seq: int = 0, seed: int = 7
           ) -> list[dict[str, Any]]:
    """``count`` clicks (the clickstream's events from ``first_seq`` on, with ``ts``)."""
    chosen = list(events(first_seq + count, users, seed))[first_seq:]
    return [{"seq": e["seq"], "user": e["user"], "page": e["page"],
             "ts": event_time_of(e["seq"], users)} for e in chosen]


def closing_clicks(before: list[dict[str, Any]], count: int, user: str = "night-owl"
                   ) -> list[dict[str, Any]]:
    """``count`` clicks of one more user, a second apart, from two gaps and an hour after
    the last of ``before`` on: once they are read, the watermark (lateness under an hour)
    passes the end of every session of ``before``, and their timers close them."""
    first = max(c["ts"] for c in before) + 2 * GAP_MS + 3_600_000
    seq = max(c["seq"] for c in before) + 1
    return [{"seq": seq + i, "user": user, "page": "home", "ts": first + i * 1_000}
            for i in range(count)]


def produce_clicks(settings: dict[str, Any], topic: str, rows: Iterable[dict[str, Any]],
                   partitions: int = 4) -> int:
    """Create ``topic`` if needed and write the clicks to it, keyed by user (acks=all)."""
    ensure_topic(settings, topic, partitions)
    producer = Producer({**settings, "acks": "all", "enable.idempotence": True})
    count = 0
    for row in rows:
        producer.produce(topic, key=row["user"].encode(), value=json.dumps(row).encode())
        producer.poll(0)
        count += 1
    if producer.flush(60) != 0:
        raise RuntimeError(f"clicks to {topic} were not all acknowledged")
    return count


def update_session(user: str, rows: pd.DataFrame, state: KeyState
                   ) -> list[dict[str, Any]] | None:
    """Fold a user's clicks of a batch into its open session; move the session's end."""
    start, last, clicks_in = state(START), state(LAST), state(CLICKS)
    times = rows["ts"].astype("int64").tolist()  # ms since the epoch
    previous = last.value()
    if previous is not None:
        state.timers.delete_event_time(previous + GAP_MS)
    # A click that comes after the session's end (its timer did not fire yet, the
    # watermark lagging) starts a new session: close the old one first.
    sessions: list[dict[str, Any]] = []
    for ts in times:
        if last.value() is not None and ts - (last.value() or 0) > GAP_MS:
            sessions.append(_summary(user, state))
            _clear(state)
        if start.value() is None:
            start.update(ts)
        last.update(max(ts, last.value() or ts))
        clicks_in.update((clicks_in.value() or 0) + 1)
    state(RECENT_PAGES).add_all(rows["page"].tolist())
    state.timers.register_event_time((last.value() or 0) + GAP_MS)
    return sessions or None


def close_session(user: str, timer: TimerInfo, state: KeyState) -> dict[str, Any]:
    """The session ended (no click for ``GAP``): its summary, and the state cleared."""
    summary = _summary(user, state)
    _clear(state)
    return summary


def _summary(user: str, state: KeyState) -> dict[str, Any]:
    return {"user": user, "start": state(START).value(), "end": state(LAST).value(),
            "clicks": state(CLICKS).value()}


def _clear(state: KeyState) -> None:
    for descriptor in (START, LAST, CLICKS):
        state(descriptor).clear()


def expected_sessions(all_clicks: Iterable[dict[str, Any]]
                      ) -> list[tuple[str, int, int, int]]:
    """Every session of the clicks: (user, start, end, clicks), a new session after a gap
    of more than ``GAP`` (event time)."""
    by_user: dict[str, list[int]] = {}
    for click in all_clicks:
        by_user.setdefault(click["user"], []).append(click["ts"])
    found = []
    for user, times in by_user.items():
        times.sort()
        first = previous = times[0]
        count = 0
        for ts in times:
            if ts - previous > GAP_MS:
                found.append((user, first, previous, count))
                first, count = ts, 0
            previous = ts
            count += 1
        found.append((user, first, previous, count))
    return sorted(found)


def read_sessions(settings: dict[str, Any], topic: str, timeout_s: float = 30.0
                  ) -> list[tuple[int, str, int, int, int]]:
    """The committed summaries in ``topic``: (checkpoint, user, start, end, clicks)."""
    return [(checkpoint, v["user"], v["start"], v["end"], v["clicks"])
            for checkpoint, v in read_committed(settings, topic, timeout_s)]


def run_query(config: StreamingStateConfig, settings: dict[str, Any], input_topic: str,
              output_topic: str, checkpoint_dir: str, expected_events: int,
              max_per_batch: int, lateness: dt.timedelta, timeout_s: float = 600.0,
              listener: BatchListener | None = None,
              task_listener: TaskListener | None = None,
              master: str | None = None, spark_config: dict[str, str] | None = None,
              update: StatefulFunction = update_session,
              on_timer: TimerFunction = close_session) -> dict[str, Any]:
    """Run the query until ``expected_events`` clicks were read (counting from the
    input topic's start); a summary of the run. ``update`` and ``on_timer`` are the
    job's functions (:func:`update_session`, :func:`close_session`: other functions with
    their output schema may stand in)."""
    from pyspark.sql import functions as F

    from spark_integration import spark_session

    ensure_topic(settings, output_topic)
    parallelism = max(2, config.parallelism)
    spark = spark_session(master or f"local[{parallelism}]", "sessions", parallelism,
                          spark_config)
    processor = stateful_foreach_batch(
        config, update, "user", OUTPUT_SCHEMA,
        sink=KafkaOutputSink(output_topic, key_column="user"), order_by=["ts"],
        listener=listener, task_listener=task_listener, on_timer=on_timer,
        event_time=EventTime.of("event_time", lateness))
    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", settings["bootstrap.servers"])
           .option("subscribe", input_topic).option("startingOffsets", "earliest")
           .option("failOnDataLoss", "true")
           .option("maxOffsetsPerTrigger", str(max_per_batch)).load())
    parsed = raw.select(F.col("key").cast("string").alias("user"),
                        F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    stream = parsed.select("user", "e.seq", "e.ts", "e.page",
                           F.timestamp_millis(F.col("e.ts")).alias("event_time"))
    query = (stream.writeStream.foreachBatch(processor)
             .option("checkpointLocation", checkpoint_dir)
             .trigger(processingTime="500 milliseconds").start())
    try:
        await_records(query, expected_events, timeout_s)
    finally:
        query.stop()
        spark.stop()
    return {"batches": processor.batches_run,
            "late_rows": sum(m.late_rows for r in processor.reports
                             for m in r.subtask_metrics.values()),
            "timers_fired": sum(m.timers_fired for r in processor.reports
                                for m in r.subtask_metrics.values()),
            "watermarks": [r.next_watermark_ms for r in processor.reports]}


def main(argv: list[str] | None = None, listener: BatchListener | None = None,
         task_listener: TaskListener | None = None, update: StatefulFunction = update_session,
         on_timer: TimerFunction = close_session) -> int:
    """Run the query in this process (tests run it as a child they can kill -9, some
    with functions of their own: see :func:`run_query`)."""
    parser = job_parser("the sessions streaming query", "sessions", "clicks-with-time",
                        "sessions", 500)
    parser.add_argument("--lateness-minutes", type=float, default=5.0)
    args = parser.parse_args(argv)
    config = state_config(args, "sessions")
    summary = run_query(config, {"bootstrap.servers": args.bootstrap_servers,
                                 **config.client_config},
                        args.input_topic, args.output_topic, args.checkpoint_dir,
                        args.expected_events, args.max_per_batch,
                        dt.timedelta(minutes=args.lateness_minutes),
                        listener=listener, task_listener=task_listener, master=args.master,
                        spark_config=spark_settings(args), update=update, on_timer=on_timer)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
