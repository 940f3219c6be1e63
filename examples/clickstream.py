"""The clickstream job: per-user sessions and totals kept with kafka-changelog.

Used by the main job (``python -m examples.streaming_demo``) and the crash tests. The
input is a Kafka topic of JSON events keyed by user; a Structured Streaming query
reads it with Spark's Kafka connector (``format("kafka")``) and keeps, per user, the
number of events, the running total spent, a count per event kind and the last five
pages, writing each batch's updated totals to an output topic, exactly once (in the
Kafka transaction that commits the batch's checkpoint). It runs in ``local[n]`` or on
a cluster (``--master spark://host:port``).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_changelog.state import (
    FLOAT64,
    INT64,
    UTF8,
    list_state,
    map_state,
    reducing_state,
    value_state,
)
from spark_integration import CHECKPOINT_HEADER, KafkaOutputSink, starting_offsets
from spark_integration.streaming import (
    BatchListener,
    KeyState,
    StatefulFunction,
    StreamingStateConfig,
    TaskListener,
    stateful_foreach_batch,
)
from spark_integration.streaming.vectorized import BatchState, VectorizedFunction

from .events import events
from .job_options import job_parser, spark_settings, state_config

EVENTS = value_state("events", INT64)
SPENT = reducing_state("spent", lambda a, b: round(a + b, 2), FLOAT64)
KINDS = map_state("kinds", UTF8, INT64)
LAST_PAGES = list_state("last_pages", UTF8)
OUTPUT_SCHEMA = "user string, events long, spent double"
OUTPUT_COLUMNS = ("user", "events", "spent")
EVENT_SCHEMA = "seq long, kind string, page string, amount double"


def ensure_topic(settings: dict[str, Any], topic: str, partitions: int = 4) -> None:
    """Create ``topic`` unless it exists (brokers may not auto-create topics; another job
    creating it at the same moment is fine)."""
    admin = AdminClient(settings)
    if topic not in admin.list_topics(timeout=30).topics:
        for future in admin.create_topics([NewTopic(topic, partitions, -1)]).values():
            try:
                future.result(30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise


def produce_events(settings: dict[str, Any], topic: str, count: int, users: int,
                   partitions: int = 4, seed: int = 7, start: int = 0,
                   end: int | None = None) -> int:
    """Create ``topic`` if needed and write the clickstream of ``count`` events to it
    (acks=all), or its events ``start`` to ``end`` (a part written now, the rest later);
    returns how many were written."""
    ensure_topic(settings, topic, partitions)
    producer = Producer({**settings, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 10})
    part = list(itertools.islice(events(count, users, seed), start, end))
    for event in part:
        producer.produce(topic, key=event["user"].encode(), value=json.dumps(event).encode())
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError(f"events to {topic} were not all acknowledged")
    return len(part)


def update_user(key: str, rows: pd.DataFrame, state: KeyState) -> list[dict[str, Any]]:
    """The stateful function: fold one user's events of a batch into its state."""
    count = state(EVENTS)
    spent = state(SPENT)
    kinds = state(KINDS)
    pages = state(LAST_PAGES)
    for row in rows.itertuples(index=False):
        count.update((count.value() or 0) + 1)
        spent.add(float(row.amount))
        kinds.put(row.kind, (kinds.get(row.kind) or 0) + 1)
        pages.add(row.page)
    recent = pages.get()
    if len(recent) > 5:
        pages.update(recent[-5:])
    return [{"user": key, "events": count.value(), "spent": spent.get()}]


def update_users(rows: pd.DataFrame, state: BatchState) -> pd.DataFrame:
    """:func:`update_user` vectorised (``stateful_foreach_batch(..., vectorized=True)``):
    all of a subtask's events of a batch at once, folded per user with pandas and NumPy,
    each state read and written for all users per call. The state and the outputs are
    exactly :func:`update_user`'s for amounts in cents (as :func:`events` makes them): the
    batch's total is summed in cents and folded into ``spent`` once per user, which
    gives the same float as adding the amounts one by one with ``SPENT``'s rounding.
    """
    keys = state.keys
    n = len(keys)
    index = state.key_index  # the position in ``keys`` of each row's user
    counts = state.value(EVENTS)
    events_now = (np.asarray(counts.get(keys, 0), dtype=np.int64)
                  + np.bincount(index, minlength=n)).tolist()
    counts.set(keys, events_now)
    cents = np.rint(rows["amount"].to_numpy(dtype=np.float64) * 100)
    batch_spent = (np.bincount(index, weights=cents, minlength=n) / 100).tolist()
    spent = state.reducing(SPENT).add(keys, batch_spent)
    # Count per (user, kind): one read and one write per pair.
    per_kind = rows.groupby([index, rows["kind"].to_numpy()], sort=False).size()
    pair_keys = [keys[i] for i in per_kind.index.get_level_values(0).tolist()]
    pair_kinds = per_kind.index.get_level_values(1).tolist()
    kinds = state.map(KINDS)
    before = np.asarray(kinds.get_each(pair_keys, pair_kinds, 0), dtype=np.int64)
    kinds.put_each(pair_keys, pair_kinds, (before + per_kind.to_numpy()).tolist())
    # The last five pages: the stored ones, then the batch's last five (rows are sorted
    # by key, so a user's rows are consecutive: keep those less than 5 from its last).
    last_row = np.flatnonzero(np.append(index[1:] != index[:-1], True))
    tail = last_row[index] - np.arange(len(index)) < 5
    recent: list[list[str]] = [[] for _ in range(n)]
    for i, page in zip(index[tail].tolist(), rows["page"].to_numpy()[tail].tolist(),
                       strict=True):
        recent[i].append(page)
    pages = state.list(LAST_PAGES)
    pages.update(keys, [(old + new)[-5:] for old, new in zip(pages.get(keys), recent,
                                                             strict=True)])
    return pd.DataFrame({"user": keys, "events": events_now, "spent": spent})


def expected_state(all_events: Iterator[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The state computed directly from the events, in the same per-user order (seq)."""
    users: dict[str, dict[str, Any]] = {}
    for e in sorted(all_events, key=lambda e: e["seq"]):
        s = users.setdefault(e["user"], {"events": 0, "spent": None, "kinds": {},
                                         "last_pages": []})
        s["events"] += 1
        s["spent"] = e["amount"] if s["spent"] is None else round(s["spent"] + e["amount"], 2)
        s["kinds"][e["kind"]] = s["kinds"].get(e["kind"], 0) + 1
        s["last_pages"].append(e["page"])
    for s in users.values():
        s["last_pages"] = s["last_pages"][-5:] if len(s["last_pages"]) > 5 else s["last_pages"]
    return users


def read_outputs(settings: dict[str, Any], topic: str, timeout_s: float = 30.0
                 ) -> list[tuple[int, str, int, float]]:
    """The committed outputs in ``topic`` as (checkpoint id, user, events, spent) rows."""
    return [(checkpoint, value["user"], value["events"], value["spent"])
            for checkpoint, value in read_committed(settings, topic, timeout_s)]


def read_committed(settings: dict[str, Any], topic: str, timeout_s: float = 30.0
                   ) -> list[tuple[int, dict[str, Any]]]:
    """The committed outputs in ``topic`` (``read_committed``, from the start): each
    record's checkpoint id (its header) and JSON value."""
    consumer = Consumer({**settings, "group.id": f"outputs-check-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.partition.eof": True,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        rows: list[tuple[int, dict[str, Any]]] = []
        at_end: set[int] = set()
        while len(at_end) < len(partitions):
            message = consumer.poll(timeout_s)
            if message is None:
                raise TimeoutError(f"{topic}: no end of partitions within {timeout_s} s")
            if message.error() is not None:
                at_end.add(message.partition() or 0)
                continue
            raw = dict(message.headers() or []).get(CHECKPOINT_HEADER)
            if raw is None:
                raise ValueError(f"{topic}[{message.partition()}]@{message.offset()} has no "
                                 f"{CHECKPOINT_HEADER} header")
            rows.append((int(raw), json.loads(message.value() or b"{}")))
        return rows
    finally:
        consumer.close()


def outputs_with_spark(spark: Any, kafka_options: Mapping[str, str], topic: str,
                       streaming: bool = False, committed: bool = True) -> Any:
    """The outputs in ``topic`` read with Spark's Kafka connector, as a DataFrame of
    ``checkpoint, user, events, spent`` (like :func:`read_outputs`; streaming when
    ``streaming``). Outputs are written in Kafka transactions: only a
    ``read_committed`` consumer sees each batch's outputs exactly once (Spark's
    default, ``read_uncommitted``, also returns those of aborted transactions, e.g. of
    a driver killed while committing); ``committed=False`` shows that.
    ``kafka_options``: the brokers and security, as ``StreamingStateConfig.spark_kafka_options``
    gives them."""
    from pyspark.sql import functions as F

    reader = spark.readStream if streaming else spark.read
    source = (reader.format("kafka").options(**kafka_options)
              .option("subscribe", topic)
              .option("startingOffsets", "earliest")
              .option("includeHeaders", "true")
              .option("kafka.isolation.level",
                      "read_committed" if committed else "read_uncommitted"))
    if not streaming:
        source = source.option("endingOffsets", "latest")
    checkpoint = F.expr(f"element_at(filter(headers, h -> h.key = '{CHECKPOINT_HEADER}'), 1)")
    row = F.from_json(F.col("value").cast("string"), OUTPUT_SCHEMA)
    return source.load().select(checkpoint["value"].cast("string").cast("long")
                                .alias("checkpoint"), row["user"].alias("user"),
                                row["events"].alias("events"), row["spent"].alias("spent"))


def output_problems(rows: list[tuple[int, str, int, float]],
                    expected: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with the outputs (empty: every batch once, the last totals right).

    ``rows`` are :func:`read_outputs`'s: one checkpoint per batch, numbered on.
    """
    problems = []
    pairs = [(checkpoint, user) for checkpoint, user, _, _ in rows]
    twice = len(pairs) - len(set(pairs))
    if twice:
        problems.append(f"{twice} outputs of a batch written twice")
    checkpoints = sorted({checkpoint for checkpoint, _ in pairs})
    if checkpoints and checkpoints != list(range(checkpoints[0],
                                                 checkpoints[0] + len(checkpoints))):
        problems.append(f"checkpoints with outputs are {checkpoints}, not consecutive")
    last = {user: (events, spent) for _, user, events, spent in sorted(rows)}
    wrong = [u for u, s in expected.items() if last.get(u) != (s["events"], s["spent"])]
    if wrong:
        problems.append(f"the last totals of {len(wrong)} users are wrong, e.g. {wrong[:3]}")
    return problems


def kafka_input(spark: Any, kafka_options: Mapping[str, str], topic: str,
                max_per_batch: int, starting: str = "earliest") -> Any:
    """The clickstream as a streaming DataFrame ``user, seq, kind, page, amount``, read
    with Spark's Kafka connector from the beginning of ``topic``, at most
    ``max_per_batch`` records per micro-batch (``kafka_options``: the brokers and
    security, as ``StreamingStateConfig.spark_kafka_options`` gives them), a new query
    starting at ``starting`` (``startingOffsets``). Input must never be skipped (the
    state would silently miss events), hence ``failOnDataLoss``."""
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka").options(**kafka_options)
           .option("subscribe", topic)
           .option("startingOffsets", starting)
           .option("failOnDataLoss", "true")
           .option("maxOffsetsPerTrigger", str(max_per_batch))
           .load())
    parsed = raw.select(F.col("key").cast("string").alias("user"),
                        F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    return parsed.select("user", "e.seq", "e.kind", "e.page", "e.amount")


def run_query(config: StreamingStateConfig, settings: dict[str, Any], input_topic: str,
              output_topic: str, checkpoint_dir: str, expected_events: int,
              max_per_batch: int = 2000, timeout_s: float = 600.0,
              progress: bool = True, listener: BatchListener | None = None,
              fn: StatefulFunction | VectorizedFunction = update_user,
              master: str | None = None, spark_config: dict[str, str] | None = None,
              task_listener: TaskListener | None = None,
              vectorized: bool = False, sink: Any = None,
              status_file: str | None = None, initial_state: Any = None,
              on_initial_state: Any = None) -> dict[str, Any]:
    """Run the streaming query until ``expected_events`` were processed; returns a summary.

    ``master``: ``local[n]`` (default: ``local[max(2, parallelism)]``) or a cluster's
    URL; ``spark_config``: extra session settings (e.g. a cluster's executor settings).
    ``vectorized``: ``fn`` is a vectorised function (e.g. :func:`update_users`).
    ``sink``: a sink function instead of the exactly-once ``KafkaOutputSink`` (at least
    once: see docs/streaming.md, "Options").
    ``status_file``: rewritten every half second with the driver's figures (see
    :func:`write_status`), for a harness watching the job from outside.
    ``initial_state``/``on_initial_state``: a new application's state (see
    docs/streaming.md, "Starting from existing state").
    """
    from spark_integration import spark_session

    ensure_topic(settings, output_topic)
    parallelism = max(2, config.parallelism)
    spark = spark_session(master or f"local[{parallelism}]", "clickstream", parallelism,
                          spark_config)
    # Each task commits its outputs with its part of the checkpoint (one transaction).
    processor = stateful_foreach_batch(config, fn, "user", OUTPUT_SCHEMA,
                                       sink=sink if sink is not None else KafkaOutputSink(
                                           output_topic, key_column="user"),
                                       order_by=["seq"], listener=listener,
                                       task_listener=task_listener, vectorized=vectorized,
                                       initial_state=initial_state,
                                       on_initial_state=on_initial_state)
    # A new checkpointLocation (a redeploy, a new cluster) continues where the state's
    # input ended; the first deployment reads the topic from its start.
    starting = starting_offsets(config, topics=[input_topic], default="earliest")
    stream = kafka_input(spark, config.spark_kafka_options(), input_topic, max_per_batch,
                         starting)
    query = (stream.writeStream.foreachBatch(processor)
             .option("checkpointLocation", checkpoint_dir)
             .trigger(processingTime="500 milliseconds").start())
    started = time.monotonic()
    started_at = time.time()

    def report(done: int) -> None:
        if progress:
            print(f"\r[job] batches {processor.batches_run}, events read "
                  f"{done}/{expected_events}", end="", flush=True)
        if status_file:
            write_status(status_file, {"pid": os.getpid(), "batches": processor.batches_run,
                                       "reports": len(processor.reports),
                                       "events_read": done})

    try:
        await_records(query, expected_events, timeout_s,
                      report if progress or status_file else None)
    finally:
        if progress:
            print(flush=True)
        query.stop()
        spark.stop()
    restores = [max(r.restore_s.values()) for r in processor.reports if r.restore_s]
    materialized = {m for r in processor.reports for m in r.materializations.values() if m}
    return {"batches": processor.batches_run,
            # Slowest subtask restore of the first batch (backends restored from Kafka).
            "restore_s": round(restores[0], 3) if restores else None,
            # Distinct materializations whose snapshots the run's checkpoints refer to.
            "materializations": len(materialized),
            "committed": sum(r.committed for r in processor.reports),
            "rows_out": sum(r.rows_out for r in processor.reports),
            # Per batch: the subtasks restored from Kafka (the others reused the backend
            # cached in their Python worker).
            "restored": [sorted(r.restore_s) for r in processor.reports],
            # Per batch id: where each subtask's state came from (reattached, rolled-back,
            # restored, ...: see SubtaskMetrics.state_source).
            "state_sources": {str(r.batch_id): {str(s): m.state_source
                                                for s, m in sorted(r.subtask_metrics.items())}
                              for r in processor.reports},
            # Per batch id: where each subtask ran (its host and host-local state directory).
            "hosts": {str(r.batch_id): {str(s): m.host
                                        for s, m in sorted(r.subtask_metrics.items())}
                      for r in processor.reports},
            "batch_seconds": [(round(r.seconds, 2), round(r.task_s, 2), round(r.commit_s, 2),
                               round(r.sink_s, 2)) for r in processor.reports],
            "seconds": time.monotonic() - started,
            # Wall-clock time (epoch seconds) from the query's start to its end.
            "span_s": [started_at, time.time()]}


def write_status(path: str, status: dict[str, Any]) -> None:
    """Replace the JSON file ``path`` with ``status`` atomically (readers never see half
    of it)."""
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as out:
        json.dump(status, out)
    os.replace(partial, path)


def await_records(query: Any, expected: int, timeout_s: float,
                  progress: Callable[[int], None] | None = None) -> None:
    """Wait until ``query`` read ``expected`` input records (counting from the input
    topic's start), then until it processed everything available; ``progress`` hears how
    many it read every half second. Raises the query's failure, or ``TimeoutError``."""
    started = time.monotonic()
    while True:
        done = _processed_offsets(query)
        if progress is not None:
            progress(done)
        if done >= expected:
            break
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{done} of {expected} input records read after {timeout_s} s")
        time.sleep(0.5)
    query.processAllAvailable()


def _processed_offsets(query: Any) -> int:
    """Records the query has read: the sum of its source's end offsets
    (``{"topic": {"partition": offset}}``; the input topic starts at offset 0)."""
    progress = query.lastProgress
    if not progress or not progress.get("sources"):
        return 0
    end = progress["sources"][0].get("endOffset")
    if isinstance(end, str):
        # JSON; PySpark 4.0 and 4.1 give the offsets as Python's text of a dict.
        end = json.loads(end) if end.startswith('{"') else ast.literal_eval(end)
    return sum(int(offset) for partitions in (end or {}).values()
               for offset in partitions.values())


#: Set to a level name (``INFO``) to have the library's log on stderr (placement
#: decisions, restores): a test that asserts where subtasks ran shows it when it fails.
DRIVER_LOG_ENV = "CLICKSTREAM_DRIVER_LOG"


def main(argv: list[str] | None = None, listener: BatchListener | None = None,
         fn: StatefulFunction = update_user, task_listener: TaskListener | None = None,
         sink: Any = None, initial_state: Any = None, on_initial_state: Any = None) -> int:
    """Run the query in this process (the demo runs it as a child it can kill -9).

    ``listener`` hears the driver's batch events, ``task_listener`` the tasks' and ``fn``
    replaces the stateful function (crash tests inject faults through them); ``sink``
    replaces the Kafka output sink; ``initial_state``/``on_initial_state`` bootstrap a new
    application's state.
    """
    if os.environ.get(DRIVER_LOG_ENV):
        logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("spark_integration").setLevel(os.environ[DRIVER_LOG_ENV])
    parser = job_parser("the clickstream streaming query", "clickstream", "clicks",
                        "user-totals", 2000)
    parser.add_argument("--vectorized", action="store_true",
                        help="run the vectorised function (update_users) instead of the "
                             "per-key one")
    parser.add_argument("--state-backend", choices=("memory", "rocksdb"), default=None,
                        help="the subtasks' working copy (default: StreamingStateConfig's)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for --expected-events (default 600)")
    parser.add_argument("--status-file", default=None,
                        help="a JSON file rewritten every half second with the driver's pid, "
                             "batches run, reports kept and events read")
    args = parser.parse_args(argv)
    spark_config = spark_settings(args)
    config = state_config(args, "user-sessions")
    settings = {"bootstrap.servers": args.bootstrap_servers, **config.client_config}
    if args.state_backend is not None:
        config = dataclasses.replace(config, state_backend=args.state_backend)
    summary = run_query(config, settings, args.input_topic, args.output_topic,
                        args.checkpoint_dir, args.expected_events, args.max_per_batch,
                        listener=listener, fn=update_users if args.vectorized else fn,
                        master=args.master, spark_config=spark_config,
                        task_listener=task_listener, vectorized=args.vectorized, sink=sink,
                        timeout_s=args.timeout, status_file=args.status_file,
                        initial_state=initial_state, on_initial_state=on_initial_state)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
