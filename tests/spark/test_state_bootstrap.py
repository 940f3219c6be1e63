"""A new application started by the state writer (a bootstrap), in a real ``local[2]``
session over a real broker: rows of every kind of state, the application's layout and the
input offsets the state holds; its streaming query, over Spark's Kafka source with a fresh
checkpointLocation, continues exactly from those offsets.

The clickstream's events are produced to a two-partition topic; the state a query would
have after the first 40 (20 a partition) is computed by the model and written as rows
(``events`` int64, ``spent`` float64, ``kinds`` a map, ``last_pages`` a list). The query
then reads from the recorded offsets: the state and the ``read_committed`` outputs are the
model's over all events, each applied once.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import EVENTS, KINDS, LAST_PAGES, SPENT, expected_state
from examples.events import events
from kafka_changelog.state.checkpoints.source_offsets import SOURCE_OFFSETS_PROPERTY
from kafka_changelog.state.history.state_write import (
    FIRST_CHECKPOINT_ID,
    STATE_WRITE_FROM_PROPERTY,
    STATE_WRITE_ROWS_PROPERTY,
)
from spark_integration import starting_offsets
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.worker_resources import WorkerResources
from spark_integration.writer.options import declared_states

from .kafka_queries import BATCH_ROWS, produce, run_kafka, state_of
from .test_input_offsets import an_application, assert_exactly_once, refused

pytestmark = [pytest.mark.broker, pytest.mark.spark]

ROW_SCHEMA = "state string, key binary, map_key binary, list_index int, value_decoded string"
STATES = declared_states([EVENTS, SPENT, KINDS, LAST_PAGES])


@pytest.fixture
def app(spark: Any, kafka_cluster: Any) -> Any:
    yield from an_application(kafka_cluster, "boot", partitions=2)


def state_rows(state: dict[str, dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The model's state of every user as rows of mode ``state``'s shape."""
    rows: list[tuple[Any, ...]] = []
    for user, s in sorted(state.items()):
        key = user.encode()
        rows.append(("events", key, None, None, str(s["events"])))
        rows.append(("spent", key, None, None, repr(float(s["spent"]))))
        rows.extend(("kinds", key, kind.encode(), None, str(n))
                    for kind, n in sorted(s["kinds"].items()))
        rows.extend(("last_pages", key, None, i, page)
                    for i, page in enumerate(s["last_pages"]))
    return rows


def layout(config: StreamingStateConfig, parallelism: int) -> dict[str, str]:
    """The writer's options that start ``config``'s application (its query's layout)."""
    return {**config.writer_options(), "parallelism": str(parallelism), "states": STATES}


def test_a_new_application_starts_from_written_state_and_its_query_continues_exactly(
    spark: Any, app: Any, tmp_path: Path
) -> None:
    config, settings, input_topic, output_topic = app
    all_events = list(events(4 * BATCH_ROWS, 6))
    produce(settings, input_topic, all_events)  # seq % 2 -> partition
    held = all_events[:2 * BATCH_ROWS]  # offsets 0..19 of each partition
    rows = spark.createDataFrame(state_rows(expected_state(iter(held))), ROW_SCHEMA)
    offsets = json.dumps({input_topic: {"0": 20, "1": 20}})
    # A list's rows spread over tasks (round robin) cannot be written: refused, naming why.
    with pytest.raises(Exception, match=r"the rows of one key of state\(s\) \['last_pages'\] "
                                        r"\(a list, or a map the write replaces\) must all be "
                                        r"in one Spark task"):
        (rows.repartition(3).write.format("kafka-changelog").options(**layout(config, 3))
         .option("startingOffsets", offsets).mode("append").save())
    assert WorkerResources.coordinator(config).checkpoints.latest(config.application) is None
    # By key, at parallelism 3 (the query runs at 2: it rescales from the first checkpoint).
    (rows.repartition(3, "key").write.format("kafka-changelog").options(**layout(config, 3))
     .option("startingOffsets", offsets).mode("append").save())

    checkpoints = WorkerResources.coordinator(config).checkpoints
    first = checkpoints.latest(config.application)
    assert first is not None and first.checkpoint_id == FIRST_CHECKPOINT_ID
    assert len(first.subtasks_of(config.operator_id)) == 3
    assert first.properties[SOURCE_OFFSETS_PROPERTY] == json.dumps(
        {input_topic: {"0": 20, "1": 20}}, separators=(",", ":"))
    assert first.properties[STATE_WRITE_ROWS_PROPERTY] == str(rows.count())
    assert STATE_WRITE_FROM_PROPERTY not in first.properties
    # Read back as written: every state of every user.
    read = (spark.read.format("kafka-changelog").options(**config.reader_options())
            .option("mode", "state").load()
            .select("state", "key", "map_key", "list_index", "value_decoded").collect())
    assert sorted(map(tuple, read), key=repr) == sorted(
        state_rows(expected_state(iter(held))), key=repr)

    # A query started from the beginning would apply the held input again: refused.
    _, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "wrong")
    refused(error, "would apply input again")
    # From the recorded offsets, with a fresh checkpointLocation: exactly once.
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "query",
                               start=starting_offsets(config, topics=[input_topic]))
    assert error is None, error
    assert reports[0].restored_from == FIRST_CHECKPOINT_ID
    assert_exactly_once(config, settings, output_topic, all_events)


def test_latest_offsets_are_resolved_and_bad_bootstraps_are_refused_naming_why(
    spark: Any, app: Any, tmp_path: Path
) -> None:
    config, settings, input_topic, output_topic = app
    all_events = list(events(3 * BATCH_ROWS, 6))
    produce(settings, input_topic, all_events[:BATCH_ROWS])
    rows = spark.createDataFrame([("events", b"user-0001", None, None, "100")], ROW_SCHEMA)

    def write(mode: str = "append", **options: str) -> None:
        (rows.write.format("kafka-changelog").options(**options).mode(mode).save())

    def refusal(message: str, **options: str) -> None:
        with pytest.raises(Exception) as caught:
            write(**options)
        assert message in str(caught.value), str(caught.value)[-3000:]
        assert WorkerResources.coordinator(config).checkpoints.latest(
            config.application) is None, "something was committed"

    refusal("it has no checkpoint in the checkpoint store", **config.reader_options(),
            states=STATES)
    refusal("a new application's parallelism must be in [1, max parallelism 8], got 9",
            **{**layout(config, 9), "maxParallelism": "8"})
    refusal(f"option startingOffsets: {input_topic}[0] offset -3; an offset is the next one "
            "to read (>= 0), or -1 (latest) or -2 (earliest)",
            **layout(config, 2), startingOffsets=json.dumps({input_topic: {"0": -3}}))
    refusal(f"option startingOffsets: {input_topic}[5] at -1/-2 are resolved on the state's "
            f"brokers ({config.bootstrap_servers}), where topic '{input_topic}' has "
            "partitions [0, 1]", **layout(config, 2),
            startingOffsets=json.dumps({input_topic: {"0": -1, "5": -1}}))
    refusal("option startingOffsets: expected", **layout(config, 2), startingOffsets="[1, 2]")
    # -1: the input written so far is held by the state; the query reads what comes after.
    write(**layout(config, 2), startingOffsets=json.dumps({input_topic: {"0": -1, "1": -2}}))
    held = json.loads(starting_offsets(config))
    assert held == {input_topic: {"0": BATCH_ROWS // 2, "1": 0}}
    produce(settings, input_topic, all_events[BATCH_ROWS:])
    reports, error = run_kafka(spark, config, input_topic, output_topic, tmp_path / "q",
                               start=starting_offsets(config, topics=[input_topic]))
    assert error is None, error
    assert reports[0].restored_from == FIRST_CHECKPOINT_ID
    applied = [e for e in all_events if e["seq"] >= BATCH_ROWS or e["seq"] % 2 == 1]
    counted = sum(1 for e in applied if e["user"] == "user-0001")
    assert state_of(config, ["user-0001"])["user-0001"][0] == 100 + counted
    # The application has a checkpoint now: a layout for another maxParallelism is refused.
    with pytest.raises(Exception, match=r"has max parallelism 128 \(checkpoint \d+\), not "
                                        r"64: key groups are fixed for an application's life"):
        write(**{**layout(config, 2), "maxParallelism": "64"})


def test_a_bootstrapped_job_killed_in_its_first_batch_applies_its_input_once(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    """The clickstream job (exactly-once outputs), its application started by a write of
    users' earlier totals holding none of the input (``-2``: each partition's earliest
    offset); in its first batch a task's worker is killed -9 in its transaction, then the
    driver after the tasks committed, before the checkpoint. Run again, every user's state
    is its totals plus its events, and every batch's outputs are in the output topic once."""
    import signal

    from confluent_kafka.admin import AdminClient

    from examples.clickstream import output_problems, produce_events, read_outputs

    from .jobs import Job, state_of

    events_in, per_batch, users = 600, 300, 12
    job = Job(f"boot-kill-{uuid.uuid4().hex[:8]}", kafka_cluster.bootstrap_servers,
              tmp_path / "spark-checkpoint", events_in, per_batch=per_batch)
    settings = kafka_cluster.client_config()
    produce_events(settings, job.input_topic, events_in, users)
    config = job.config()
    totals = {f"user-{i:04d}": (i + 1, round(i * 1.25 + 0.5, 2)) for i in range(users)}
    rows = spark.createDataFrame(
        [("events", u.encode(), None, None, str(n)) for u, (n, _) in totals.items()]
        + [("spent", u.encode(), None, None, repr(s)) for u, (_, s) in totals.items()],
        ROW_SCHEMA)
    partitions = AdminClient(settings).list_topics(job.input_topic, timeout=30).topics[
        job.input_topic].partitions
    (rows.write.format("kafka-changelog").options(**layout(config, 2))
     .option("startingOffsets", json.dumps({job.input_topic: {str(p): -2 for p in partitions}}))
     .mode("append").save())
    try:
        faults = tmp_path / "faults"
        faults.mkdir()
        done = job.run(2, "before_commit:0", task_kills=("subtask_in_transaction:0:1",),
                       fault_dir=faults, master="local[2,4]")
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
        assert (faults / "killed-subtask_in_transaction-0-1").exists()
        done = job.run(2)
        assert done.returncode == 0, done.stderr[-3000:]
        expected: dict[str, dict[str, Any]] = {
            user: {"events": n, "spent": spent, "kinds": {}, "last_pages": []}
            for user, (n, spent) in totals.items()}
        for event in events(events_in, users):
            state = expected[event["user"]]
            state["events"] += 1
            state["spent"] = round(state["spent"] + event["amount"], 2)
            state["kinds"][event["kind"]] = state["kinds"].get(event["kind"], 0) + 1
            state["last_pages"] = [*state["last_pages"], event["page"]][-5:]
        assert state_of(config, sorted(expected)) == expected
        assert output_problems(read_outputs(settings, job.output_topic), expected) == []
    finally:
        WorkerResources.release(config)
