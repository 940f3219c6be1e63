"""``spark.read.format("kafka-changelog")`` against a real broker and a real ``local[2]`` Spark.

One application (operator ``op``) is run through five checkpoints at parallelism
1, 4, 2, 3, 2, materializing in some of them (so checkpoints mix snapshot chunks
and changelog tails); retention keeps checkpoints 3, 4 and 5. Every read is
compared with what the library restores in process for the same checkpoint, also
a read on the standalone cluster (executors in JVMs of their own).
"""

from __future__ import annotations

import copy
import json
import pickle
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql.datasource import InputPartition

from kafka_changelog import (
    ChangelogError,
    ChangelogTruncatedError,
    KeyGroupRange,
    RecordDecodeError,
)
from kafka_changelog.kafka import KafkaChangelogConfig
from kafka_changelog.kafka.record_format import EncodedRecord, encode_changes
from kafka_changelog.keygroups import partition_for_key_group
from kafka_changelog.local_kafka.process import die_with_parent
from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
from kafka_changelog.state.schema.ops import OpKind, StateOp
from kafka_changelog.state.schema.serializers import INT64, JSON
from kafka_changelog.state.tables.protocol import KeyedStateTable
from spark_integration.reader.datasource import (
    CHANGES_STRUCT,
    STATE_STRUCT,
    KafkaChangelogBatchReader,
    TaskPartition,
)
from spark_integration.reader.planning import parse_options, plan_changes, plan_read
from spark_integration.reader.rows import CHANGES_SCHEMA, META_OP, STATE_SCHEMA
from spark_integration.reader.scan import OffsetSlice, SliceReader
from tests.kafka.kafka_helpers import changes_of
from tests.kafka.test_state_kafka import USERS, Job
from tests.record_helpers import decode_record
from tests.state.state_helpers import MAX_P, apply_event

from .jobs import REPO, cluster_engine

pytestmark = [pytest.mark.spark, pytest.mark.broker]

FORMAT = "kafka-changelog"
#: (parallelism, materialize) of checkpoints 1..5.
RUNS = [(1, False), (4, True), (2, False), (3, True), (2, False)]
EVENTS = 40


class History:
    """The job, and the model of the application's state at each checkpoint."""

    def __init__(self, job: Job, models: dict[int, dict[bytes, Any]]) -> None:
        self.job = job
        self.models = models

    def options(self, **extra: str) -> dict[str, str]:
        """Reader options for this job's topics."""
        job = self.job
        return {
            "kafka.bootstrap.servers": job.changelog.bootstrap_servers,
            **{f"kafka.{k}": str(v) for k, v in job.changelog.client_config.items()},
            "application": "app",
            "changelog.topic": job.changelog.topic,
            "snapshot.topic": job.snapshots.topic,
            "checkpoint.topic": job.checkpoints.topic,
            **extra,
        }


@pytest.fixture(scope="module")
def history(kafka_cluster: Any) -> Iterator[History]:
    job = Job(kafka_cluster)
    model: dict[bytes, Any] = {}
    models = {}
    try:
        for checkpoint_id, (parallelism, materialize) in enumerate(RUNS, start=1):
            job.run(parallelism, checkpoint_id, model, EVENTS, materialize, seed=checkpoint_id)
            models[checkpoint_id] = copy.deepcopy(model)
        assert job.checkpoints.checkpoint_ids("app") == [3, 4, 5]
        yield History(job, models)
    finally:
        job.close()


def read(spark: Any, options: dict[str, str]) -> list[tuple[Any, ...]]:
    """All rows, binary columns as bytes and arrays as lists of bytes."""
    df = spark.read.format(FORMAT).options(**options).load()
    return [tuple(_plain(v) for v in row) for row in df.collect()]


def _plain(value: Any) -> Any:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def restored_table(job: Job, checkpoint_id: int) -> KeyedStateTable:
    """The operator's whole state at ``checkpoint_id``, restored in process by the library."""
    checkpoint = job.coordinator.checkpoint(checkpoint_id)
    backend = job.coordinator.restore_keyed("op", KeyGroupRange(0, MAX_P - 1), checkpoint,
                                            job.changelog)
    try:
        return backend.table
    finally:
        backend.close()


def table_rows(table: KeyedStateTable) -> Counter[tuple[Any, ...]]:
    """(operator, key group, state, kind, key, map key, list index, value) of every entry."""
    rows: Counter[tuple[Any, ...]] = Counter()
    for key_group in table.key_groups():
        for name, key, entry in table.entries(key_group):
            kind = table.metas[name].kind.value
            if isinstance(entry, bytes):
                rows[("op", key_group, name, kind, key, None, None, entry)] += 1
            elif isinstance(entry, list):
                for index, item in enumerate(entry):
                    rows[("op", key_group, name, kind, key, None, index, item)] += 1
            else:
                for map_key, item in entry.items():
                    rows[("op", key_group, name, kind, key, map_key, None, item)] += 1
    return rows


#: How each serializer of the toy application renders (independently of the reader).
RENDER: dict[str, Callable[[bytes], str]] = {
    "int64": lambda b: str(INT64.deserialize(b)),
    "utf8": lambda b: b.decode(),
    "json": lambda b: json.dumps(JSON.deserialize(b), sort_keys=True, separators=(",", ":")),
}


def expected_changes(job: Job, checkpoint_id: int | None) -> Counter[tuple[Any, ...]]:
    """(subtask, key group, payload) of every change the in-process reader gives."""
    checkpoint = job.coordinator.checkpoint(checkpoint_id)
    assert checkpoint is not None
    found: Counter[tuple[Any, ...]] = Counter()
    for subtask in checkpoint.subtasks_of("op"):
        assert subtask.keyed is not None
        for handle in subtask.keyed.changelog:
            for change in changes_of(handle, job.changelog):
                found[(subtask.subtask_index, change.key_group, change.payload)] += 1
    return found


def payload_of(row: dict[str, Any]) -> bytes:
    """The changelog payload a change row was decoded from (Avro encoding is canonical)."""
    if row["op"] == META_OP:
        value: bytes = row["value"]
        return value
    values = row["values"]
    return StateOp(row["state"], OpKind(row["op"]), row["key"], row["map_key"], row["value"],
                   tuple(values) if values is not None else None).to_bytes()


def as_dicts(rows: list[tuple[Any, ...]], names: list[str]) -> list[dict[str, Any]]:
    return [dict(zip(names, row, strict=True)) for row in rows]


# -- tests -------------------------------------------------------------------------------------


def test_arrow_schemas_are_the_ones_spark_expects() -> None:
    from spark_integration.sessions.spark_versions import arrow_schema_of

    assert arrow_schema_of(CHANGES_STRUCT).equals(CHANGES_SCHEMA)
    assert arrow_schema_of(STATE_STRUCT).equals(STATE_SCHEMA)


@pytest.mark.parametrize("checkpoint_id", [None, 3])
def test_changes_equal_the_in_process_reader(
    spark: Any, history: History, checkpoint_id: int | None
) -> None:
    job = history.job
    extra = {} if checkpoint_id is None else {"checkpoint": str(checkpoint_id)}
    rows = as_dicts(read(spark, history.options(**extra)), CHANGES_STRUCT.fieldNames())
    found = Counter((r["subtask"], -1 if r["key_group"] is None else r["key_group"],
                     payload_of(r)) for r in rows)
    assert found == expected_changes(job, checkpoint_id)
    assert {r["operator"] for r in rows} == {"op"}
    assert {r["topic"] for r in rows} == {job.changelog.topic}
    # Offsets are real: the record there is the writer's and holds the change.
    consumer = Consumer({**job.changelog.consumer(), "enable.partition.eof": False})
    try:
        records: dict[tuple[int, int], tuple[bytes | None, Any]] = {}
        for partition, offset in sorted({(r["partition"], r["offset"]) for r in rows}):
            consumer.assign([TopicPartition(job.changelog.topic, partition, offset)])
            message = consumer.poll(10)
            assert message is not None and message.error() is None
            assert message.offset() == offset
            records[(partition, offset)] = (message.key(), decode_record(message.value() or b""))
    finally:
        consumer.close()
    for r in rows:
        key, (log_id, changes) = records[(r["partition"], r["offset"])]
        assert key == r["log_id"].encode() and log_id == r["log_id"]
        stored = {(c.sequence_number, c.position): c for c in changes}
        change = stored[(r["sequence_number"], r["position"])]
        assert change.payload == payload_of(r)
        if r["key_group"] is not None:
            assert r["partition"] == partition_for_key_group(r["key_group"], 4, MAX_P)


@pytest.mark.parametrize("checkpoint_id", [5, 3], ids=["latest", "time-travel"])
def test_state_equals_the_in_process_restore(
    spark: Any, history: History, checkpoint_id: int
) -> None:
    job = history.job
    extra = {"mode": "state"}
    if checkpoint_id != 5:
        extra["checkpoint"] = str(checkpoint_id)
    rows = read(spark, history.options(**extra))
    table = restored_table(job, checkpoint_id)
    assert Counter(row[:8] for row in rows) == table_rows(table)
    # Readable values for the serializers the application recorded.
    for row in rows:
        serializer = table.metas[row[2]].value_serializer
        assert row[8] == RENDER[serializer](row[7])
    # And the state is the application's (the model) at that checkpoint, not another's.
    model = history.models[checkpoint_id]
    counts = {row[4]: int(row[8]) for row in rows if row[2] == "count"}
    assert counts == {user: s["count"] for user, s in model.items() if s["count"] is not None}
    totals = {row[4]: int(row[8]) for row in rows if row[2] == "total"}
    assert totals == {user: s["total"] for user, s in model.items() if s["total"] is not None}
    if checkpoint_id != 5:
        assert Counter(row[:8] for row in rows) != table_rows(restored_table(job, 5))


@pytest.mark.spark_cluster
def test_reads_on_a_standalone_cluster_equal_the_in_process_reader(
    spark_cluster: Any, history: History, tmp_path: Path
) -> None:
    # The read runs in a driver of its own (one Spark context per JVM), its tasks in the
    # cluster's executors, each with its own Python workers.
    out = tmp_path / "rows.pickle"
    reads = [history.options(), history.options(mode="state", checkpoint="3")]
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.cluster_read", spark_cluster.master_url,
         json.dumps(reads), json.dumps(cluster_engine(spark_cluster).spark_config), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, preexec_fn=die_with_parent())
    assert done.returncode == 0, done.stderr[-3000:]
    result = pickle.loads(out.read_bytes())
    assert result["executors"] == spark_cluster.worker_count
    changes, state = result["reads"]
    rows = as_dicts(changes, CHANGES_STRUCT.fieldNames())
    assert Counter((r["subtask"], -1 if r["key_group"] is None else r["key_group"],
                    payload_of(r)) for r in rows) == expected_changes(history.job, None)
    assert Counter(row[:8] for row in state) == table_rows(restored_table(history.job, 3))
    counts = {row[4]: int(row[8]) for row in state if row[2] == "count"}
    assert counts == {user: s["count"] for user, s in history.models[3].items()
                      if s["count"] is not None}


@pytest.fixture(scope="module")
def long_tail(kafka_cluster: Any) -> Iterator[History]:
    """One subtask checkpointed four times without materializing: long changelog ranges."""
    job = Job(kafka_cluster)
    rng = random.Random(5)
    try:
        backend = job.coordinator.restore_keyed("op", KeyGroupRange(0, MAX_P - 1), None,
                                                job.changelog)
        for checkpoint_id in range(1, 5):
            for _ in range(30):
                apply_event(backend, rng.choice(USERS), rng.choice(["a", "home"]),
                            rng.choice([0, 2, 13]))
            handle = backend.snapshot(checkpoint_id).result(60)
            job.coordinator.complete(checkpoint_id, [SubtaskState("op", 0, 1, handle, None)])
            backend.notify_checkpoint_complete(checkpoint_id)
        backend.close()
        yield History(job, {})
    finally:
        job.close()


def test_slicing_does_not_change_the_rows(spark: Any, long_tail: History) -> None:
    options = long_tail.options()
    plan_one = plan_read(parse_options({**options, "slice.offsets": "100000000"}))
    plan_many = plan_read(parse_options({**options, "slice.offsets": "1"}))
    assert len(plan_many.tasks) >= 3 * len(plan_one.tasks)
    one = read(spark, {**options, "slice.offsets": "100000000"})
    many = read(spark, {**options, "slice.offsets": "1"})
    assert len(one) > 100
    assert sorted(one, key=repr) == sorted(many, key=repr)
    found = Counter((r[1], -1 if r[3] is None else r[3],
                     payload_of(dict(zip(CHANGES_STRUCT.fieldNames(), r, strict=True))))
                    for r in many)
    assert found == expected_changes(long_tail.job, None)
    state_one = read(spark, {**options, "mode": "state", "slice.keyGroups": "128"})
    state_many = read(spark, {**options, "mode": "state", "slice.keyGroups": "7"})
    assert sorted(state_one, key=repr) == sorted(state_many, key=repr)
    assert Counter(row[:8] for row in state_many) == table_rows(
        restored_table(long_tail.job, 4))


def test_wrong_application_or_checkpoint_is_a_clear_error(spark: Any, history: History) -> None:
    with pytest.raises(Exception) as caught:
        read(spark, history.options(application="no-such-app"))
    text = str(caught.value)
    assert "application 'no-such-app' has no checkpoint" in text
    assert "applications with checkpoints there: app" in text
    with pytest.raises(Exception) as caught:
        read(spark, history.options(checkpoint="1"))
    text = str(caught.value)
    assert "application 'app' has no checkpoint 1" in text
    assert "retained checkpoint ids: 3, 4, 5" in text
    with pytest.raises(Exception) as caught:
        read(spark, history.options(operator="nope"))
    assert "has no operator 'nope' (option operator); its operators: op" in str(caught.value)


def test_bad_options_fail_at_load(spark: Any, history: History) -> None:
    options = history.options()
    del options["application"]
    with pytest.raises(Exception, match="needs the option application"):
        spark.read.format(FORMAT).options(**options).load()
    with pytest.raises(Exception, match="option mode must be one of changes, state"):
        spark.read.format(FORMAT).options(**history.options(mode="snapshot")).load()
    with pytest.raises(Exception, match=r"unknown option\(s\) slices"):
        spark.read.format(FORMAT).options(**history.options(slices="3")).load()


def test_read_yields_record_batches_and_partitions_pickle(history: History) -> None:
    options = parse_options(history.options(mode="state", **{"slice.keyGroups": "128"}))
    reader = KafkaChangelogBatchReader(options)
    partitions = reader.partitions()
    assert partitions
    for partition in partitions:
        assert isinstance(partition, TaskPartition)
        copied = pickle.loads(pickle.dumps(partition))
        assert copied.task == partition.task
    # Spark's placeholder partition (a plan without tasks) reads nothing.
    assert list(reader.read(InputPartition(None))) == []
    batches = [b for p in partitions for b in reader.read(p)]
    assert batches and all(isinstance(b, pa.RecordBatch) for b in batches)
    assert all(b.schema.equals(STATE_SCHEMA) and b.num_rows <= 10_000 for b in batches)


def test_a_deleted_changelog_fails_with_the_truncation_message(
    spark: Any, kafka_cluster: Any
) -> None:
    job = Job(kafka_cluster)
    try:
        job.run(2, 1, {}, 30, False, seed=11)
        consumer = Consumer(job.changelog.consumer())
        try:
            marks = {p: consumer.get_watermark_offsets(
                TopicPartition(job.changelog.topic, p), 10)[1] for p in range(4)}
        finally:
            consumer.close()
        doomed = [TopicPartition(job.changelog.topic, p, o) for p, o in marks.items() if o > 0]
        for future in job.admin.delete_records(doomed).values():
            future.result(30)
        checkpoint = job.coordinator.checkpoint()
        assert checkpoint is not None
        # What the library itself says for each slice the reader may hit first.
        possible = {str(ChangelogTruncatedError(t.slice.topic, t.slice.partition,
                                                t.slice.start_offset, marks[t.slice.partition]))
                    for t in plan_changes(checkpoint, ["op"], 200_000)}
        assert possible
        options = History(job, {}).options()
        for mode in ("changes", "state"):
            with pytest.raises(Exception) as caught:
                read(spark, {**options, "mode": mode})
            text = str(caught.value)
            assert "ChangelogTruncatedError" in text
            if mode == "changes":
                assert any(message in text for message in possible), text
            else:
                assert f"changelog {job.changelog.topic}[" in text
                assert "was truncated: the handle needs offset" in text
    finally:
        job.close()


def _headers(record: EncodedRecord) -> list[tuple[str, str | bytes | None]]:
    return [(name, value) for name, value in record.headers]


def test_a_slice_reads_like_a_handle_and_names_bad_offsets(
    kafka_cluster: Any, make_topic: Any
) -> None:
    topic = make_topic(1)
    settings = dict(kafka_cluster.client_config())
    producer = Producer(settings)
    [mine] = encode_changes("w-1", [(4, 0, 5, b"a"), (4, 1, 9, b"b"), (5, 0, -1, b"m"),
                                    (7, 0, 5, b"late")])
    [other] = encode_changes("w-2", [(4, 0, 5, b"x")])
    for record in (mine, other):
        producer.produce(topic, record.value, record.key, 0, headers=_headers(record))
    producer.produce(topic, b"\xff\xff", b"w-1", 0, headers=_headers(mine))
    producer.produce(topic, mine.value, b"w-1", 0, headers=[("kc.schema", b"change_batch/9")])
    assert producer.flush(30) == 0
    config = KafkaChangelogConfig(bootstrap_servers=settings.pop("bootstrap.servers"),
                                  client_config=settings, request_timeout_s=10)

    def piece(start: int, end: int) -> OffsetSlice:
        return OffsetSlice(topic, 0, start, end, "w-1", 0, 8, 4, 6)

    with SliceReader(config) as reader:
        # Other logs, key groups outside the range and sequence numbers outside the span
        # are skipped; registrations always kept.
        assert list(reader.scan(piece(0, 2))) == [(0, 4, 0, 5, b"a"), (0, 5, 0, -1, b"m")]
        assert list(reader.scan(piece(1, 2))) == []
        assert list(reader.scan(piece(2, 2))) == []
        with pytest.raises(RecordDecodeError) as caught:
            list(reader.scan(piece(0, 3)))
        assert caught.value.offset == 2 and f"{topic}[0]@2" in str(caught.value)
        with pytest.raises(RecordDecodeError, match=r"@3: record schema 'change_batch/9'"):
            list(reader.scan(piece(3, 4)))
        with pytest.raises(ChangelogError, match=rf"changelog {topic}\[0\] ends at offset 4"):
            list(reader.scan(piece(4, 9)))
        admin = AdminClient(kafka_cluster.client_config())
        for future in admin.delete_records([TopicPartition(topic, 0, 1)]).values():
            future.result(30)
        with pytest.raises(ChangelogTruncatedError) as truncated:
            list(reader.scan(piece(0, 2)))
        assert str(truncated.value) == (
            f"changelog {topic}[0] was truncated: the handle needs offset 0 but the log "
            "starts at offset 1")
        assert list(reader.scan(piece(1, 2))) == []
