"""Mode ``changes`` through Spark ``local[2]`` gives exactly the rows of the per-change path.

A checkpoint written here with the storage (three subtasks over 16 partitions, every op
kind, registrations, several change sets, records of hundreds of changes) is read
with ``format("kafka-changelog")`` (column-wise decoding, slices packed into input
partitions) and compared, row by row and in order, with the per-change reference path
(``change_batches`` over ``SliceReader.scan``) on the same input partitions. Real
broker, real Spark.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_changelog import key_group_for_key, key_group_range_for_operator
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogHandle, KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    SubtaskState,
)
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp
from spark_integration.reader.datasource import CHANGES_STRUCT, input_partitions
from spark_integration.reader.packing import ChangesGroup
from spark_integration.reader.planning import ChangesTask, parse_options, plan_read
from spark_integration.reader.rows import change_batches
from spark_integration.reader.scan import SliceReader

pytestmark = [pytest.mark.spark, pytest.mark.broker]

FORMAT = "kafka-changelog"
MAX_P = 128
SUBTASKS = 3
CHANGES = 6000


class Written:
    """The checkpoints' topics and the reader options for them."""

    def __init__(self, config: KafkaChangelogConfig, checkpoint_topic: str) -> None:
        self.config = config
        self.checkpoint_topic = checkpoint_topic

    def options(self, **extra: str) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.config.bootstrap_servers,
            **{f"kafka.{k}": str(v) for k, v in self.config.client_config.items()},
            "application": "cols",
            "changelog.topic": self.config.topic,
            "checkpoint.topic": self.checkpoint_topic,
            **extra,
        }


def _op(rng: random.Random, key: bytes) -> StateOp:
    roll = rng.randrange(7)
    if roll == 0:
        return StateOp("count", OpKind.SET, key, value=rng.randrange(1 << 40).to_bytes(8, "big"))
    if roll == 1:
        return StateOp("count", OpKind.DELETE, key)
    if roll == 2:
        return StateOp("pages", OpKind.MAP_PUT, key, rng.choice([b"home", b"cart"]),
                       rng.randbytes(rng.randrange(0, 200)))
    if roll == 3:
        return StateOp("pages", OpKind.MAP_REMOVE, key, b"home")
    if roll == 4:
        return StateOp("events", OpKind.LIST_ADD, key, values=(b"click",) * rng.randrange(1, 4))
    if roll == 5:
        return StateOp("events", OpKind.LIST_REPLACE, key,
                       values=tuple(rng.randbytes(3) for _ in range(rng.randrange(0, 5))))
    return StateOp("events", OpKind.DELETE, key)


@pytest.fixture(scope="module")
def written(kafka_cluster: Any) -> Iterator[Written]:
    """Checkpoint 1: every subtask's changes; checkpoint 2: no changelog at all."""
    settings = dict(kafka_cluster.client_config())
    servers = settings.pop("bootstrap.servers")
    suffix = uuid.uuid4().hex[:8]
    config = KafkaChangelogConfig(bootstrap_servers=servers, topic=f"cols-log-{suffix}",
                                  partitions=16, max_parallelism=MAX_P, client_config=settings,
                                  max_record_bytes=20_000)
    checkpoint_topic = f"cols-cp-{suffix}"
    rng = random.Random(7)
    ranges = [key_group_range_for_operator(MAX_P, SUBTASKS, i) for i in range(SUBTASKS)]
    metas = [StateMeta("count", StateKind.VALUE, "int64").to_bytes(),
             StateMeta("pages", StateKind.MAP, "bytes", "utf8").to_bytes(),
             StateMeta("events", StateKind.LIST, "utf8").to_bytes()]
    subtasks, empty = [], []
    with KafkaChangelogStorage(config) as storage:
        writers = [storage.create_writer("op", r) for r in ranges]
        starts = [w.initial_sequence_number() for w in writers]
        for writer in writers:
            for meta in metas:
                writer.append_meta(meta)
        for i in range(CHANGES):
            key = f"user-{rng.randrange(500)}".encode()
            key_group = key_group_for_key(key, MAX_P)
            index = next(n for n, r in enumerate(ranges) if r.contains(key_group))
            writers[index].append(key_group, _op(rng, key).to_bytes())
            if i % 1000 == 999:
                for writer in writers:
                    writer.next_sequence_number()
        for index, (writer, start) in enumerate(zip(writers, starts, strict=True)):
            handle = writer.persist(start, 1).result(timeout=120).job_owned
            assert isinstance(handle, KafkaChangelogHandle)
            keyed = KeyedStateHandle(f"b-{index}", ranges[index], 0, None, (handle,))
            subtasks.append(SubtaskState("op", index, SUBTASKS, keyed, None))
            empty.append(SubtaskState("op", index, SUBTASKS, KeyedStateHandle(
                f"e-{index}", ranges[index], 0, None, ()), None))
        for writer in writers:
            writer.close()
    store = KafkaCheckpointStore(CheckpointStoreConfig(
        bootstrap_servers=servers, topic=checkpoint_topic, client_config=settings))
    now = int(time.time() * 1000)
    with store:
        store.commit(CompletedCheckpoint("cols", 1, now, MAX_P, tuple(subtasks)))
        store.commit(CompletedCheckpoint("cols", 2, now, MAX_P, tuple(empty)))
    yield Written(config, checkpoint_topic)


def _plain(value: Any) -> Any:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def spark_rows(spark: Any, options: dict[str, str]) -> list[tuple[Any, ...]]:
    """Every row, in the order Spark gives them (input partition by input partition)."""
    df = spark.read.format(FORMAT).options(**options).load()
    assert df.schema == CHANGES_STRUCT
    return [tuple(_plain(v) for v in row) for row in df.collect()]


def reference_rows(options: dict[str, str], min_partitions: int) -> list[tuple[Any, ...]]:
    """The per-change path's rows of the same input partitions, in the same order."""
    parsed = dataclasses.replace(parse_options(options), min_partitions=min_partitions)
    rows: list[tuple[Any, ...]] = []
    with SliceReader(parsed.changelog_config()) as reader:
        for part in input_partitions(plan_read(parsed), parsed):
            assert isinstance(part, ChangesGroup)
            for task in part.tasks:
                for batch in change_batches(reader.scan(task.slice), task.operator,
                                            task.subtask, task.slice, 1000, task.key_types):
                    rows += [tuple(r.values()) for r in batch.to_pylist()]
    return rows


def test_spark_rows_are_the_per_change_rows_in_order(spark: Any, written: Written) -> None:
    options = written.options(checkpoint="1")
    rows = spark_rows(spark, options)
    assert rows == reference_rows(options, spark.sparkContext.defaultParallelism)
    assert len(rows) == CHANGES + 3 * SUBTASKS
    ops = {r[9] for r in rows}
    assert ops == {"SET", "DELETE", "MAP_PUT", "MAP_REMOVE", "LIST_ADD", "LIST_REPLACE", "META"}
    # Records of many changes each, in several change sets.
    assert len({(r[5], r[6]) for r in rows}) > 16 and len({r[7] for r in rows}) > 3


def test_packing_and_slicing_do_not_change_the_rows(spark: Any, written: Written) -> None:
    options = written.options(checkpoint="1")
    parsed = parse_options(options)
    plan = plan_read(parsed)
    packed = input_partitions(plan, dataclasses.replace(parsed, min_partitions=2))
    assert len(packed) == 2 and len(plan.tasks) >= 16
    expected = sorted(spark_rows(spark, options), key=repr)
    for extra in ({"minPartitions": "1"}, {"minPartitions": "5"},
                  {"minPartitions": "3", "slice.offsets": "2"}):
        assert sorted(spark_rows(spark, {**options, **extra}), key=repr) == expected
    # Within an input partition, each changelog partition's rows come in offset order.
    df = (spark.read.format(FORMAT).options(**options, minPartitions="3").load()
          .selectExpr("spark_partition_id() AS p", "partition", "offset", "log_id"))
    seen: dict[tuple[int, int, str], int] = {}
    for p, partition, offset, log_id in df.collect():
        assert offset >= seen.get((p, partition, log_id), -1)
        seen[(p, partition, log_id)] = offset


def test_a_checkpoint_without_changes_reads_no_row(spark: Any, written: Written) -> None:
    options = written.options(checkpoint="2")
    assert plan_read(parse_options(options)).tasks == ()
    assert spark_rows(spark, options) == []


def test_tasks_pack_by_bytes_onto_every_core() -> None:
    from spark_integration.reader.packing import pack_changes
    from spark_integration.reader.scan import OffsetSlice

    def task(partition: int, start: int, end: int, size: int, log: str = "w") -> ChangesTask:
        return ChangesTask("op", 0, OffsetSlice("t", partition, start, end, log, 0, 127, 0, 9),
                           None, size)

    tasks = [task(p, 0, 10, 10 << 20) for p in range(16)]
    groups = pack_changes(tasks, 2)
    assert [len(g.tasks) for g in groups] == [8, 8]
    assert {t for g in groups for t in g.tasks} == set(tasks)
    # 176 MiB (with the open costs) in groups of at most 40 MiB: three rounds of two.
    assert len(pack_changes(tasks, 2, max_bytes=40 << 20)) == 6
    # Fewer tasks than cores: one each.
    assert len(pack_changes(tasks[:1], 8)) == 1
    # Overlapping slices of one partition (two logs) never share a group; order inside
    # a group is by partition and offset.
    overlapping = [task(0, 0, 10, 1, "a"), task(0, 5, 15, 1, "b"), task(1, 0, 3, 1)]
    groups = pack_changes(overlapping, 1)
    assert len(groups) == 2
    for group in groups:
        keys = [(t.slice.partition, t.slice.start_offset) for t in group.tasks]
        assert keys == sorted(keys)
    assert pack_changes([], 2) == []
    with pytest.raises(ValueError, match="min_partitions must be >= 1"):
        pack_changes(tasks, 0)
