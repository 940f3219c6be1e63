"""KafkaCheckpointStore against a real broker: durability, retention, compaction, topic checks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_changelog.errors import TopicConfigError
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.consume import PartitionTail
from kafka_changelog.kafka.handle import KafkaChangelogHandle, PartitionRange
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.local_kafka.topics import create_topic
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    OperatorStateHandle,
    SubtaskState,
)
from kafka_changelog.state.checkpoints.checkpoint_store import checkpoint_key
from kafka_changelog.state.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CheckpointOrderError,
)
from kafka_changelog.state.snapshots.snapshot import ChunkRef, SnapshotHandle

pytestmark = pytest.mark.broker

R = KeyGroupRange.of
FAST_CLEANER = {"log.cleaner.backoff.ms": "100"}
FAST_COMPACTION = {
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": "100",
    "delete.retention.ms": "100",
}
COMPACTION_WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalKafkaCluster]:
    with LocalKafkaCluster(nodes=1, broker_overrides=FAST_CLEANER) as started:
        yield started


def store_config(cluster: LocalKafkaCluster, **overrides: Any) -> CheckpointStoreConfig:
    settings = dict(cluster.client_config())
    fields: dict[str, Any] = {
        "bootstrap_servers": settings.pop("bootstrap.servers"),
        "client_config": settings,
        "topic": f"checkpoints-{uuid.uuid4().hex[:10]}",
        "request_timeout_s": 15.0,
        "topic_overrides": dict(FAST_COMPACTION),
    }
    fields.update(overrides)
    return CheckpointStoreConfig(**fields)


@pytest.fixture
def config(cluster: LocalKafkaCluster) -> CheckpointStoreConfig:
    return store_config(cluster)


def checkpoint(cid: int, application: str = "app") -> CompletedCheckpoint:
    subtasks = []
    for index, key_groups in enumerate((R(0, 63), R(64, 127))):
        snapshot = SnapshotHandle(
            f"agg-{index}", cid, key_groups, "snapshots",
            (ChunkRef(key_groups.start, cid, 0, 1, index, 10 * cid, 100, 12345),), cid * 10)
        changelog = KafkaChangelogHandle(
            f"agg-{index}", "changelog", key_groups,
            [PartitionRange(index, cid * 5, cid * 5 + 5, key_groups, 500)],
            cid * 10, cid * 10 + 9, index, cid)
        keyed = KeyedStateHandle(f"agg-{index}", key_groups, cid, snapshot, (changelog,))
        subtasks.append(SubtaskState("agg", index, 2, keyed, None))
    source = OperatorStateHandle("src", 0, {"offsets": (str(cid).encode(),)}, {})
    subtasks.append(SubtaskState("src", 0, 1, None, source))
    return CompletedCheckpoint(application, cid, 1_700_000_000_000 + cid, 128, tuple(subtasks))


def test_commit_latest_get_retention_discard_survive_a_fresh_store(
    config: CheckpointStoreConfig,
) -> None:
    with KafkaCheckpointStore(config) as store:
        assert store.latest("app") is None
        assert store.checkpoint_ids("app") == []
        for cid in (1, 2, 3):
            assert store.commit(checkpoint(cid)) == []
        subsumed = store.commit(checkpoint(7))
        assert subsumed == [checkpoint(1)]
        # The caller garbage-collects checkpoint 1, then discards it.
        store.discard("app", 1)
        assert store.checkpoint_ids("app") == [2, 3, 7]
    with KafkaCheckpointStore(config) as fresh:
        assert fresh.checkpoint_ids("app") == [2, 3, 7]
        assert fresh.latest("app") == checkpoint(7)
        assert fresh.get("app", 3) == checkpoint(3)
        with pytest.raises(CheckpointNotFoundError, match=r"'app' has no checkpoint 1;.*2, 3, 7"):
            fresh.get("app", 1)
        # Subsumed but not yet discarded (e.g. the caller crashed): reported again.
        assert [c.checkpoint_id for c in fresh.commit(checkpoint(8))] == [2]
        fresh.discard("app", 2)
    with KafkaCheckpointStore(config) as third:
        assert third.checkpoint_ids("app") == [3, 7, 8]


def test_refuses_a_non_increasing_id(config: CheckpointStoreConfig) -> None:
    with KafkaCheckpointStore(config) as store:
        store.commit(checkpoint(5))
        with pytest.raises(CheckpointOrderError, match=r"checkpoint 5 .* latest .* checkpoint 5"):
            store.commit(checkpoint(5))
    with KafkaCheckpointStore(config) as fresh:
        with pytest.raises(CheckpointOrderError, match=r"checkpoint 4 .* latest .* checkpoint 5"):
            fresh.commit(checkpoint(4))
        assert fresh.checkpoint_ids("app") == [5]


def test_instances_see_each_others_commits(config: CheckpointStoreConfig) -> None:
    with KafkaCheckpointStore(config) as first, KafkaCheckpointStore(config) as second:
        first.commit(checkpoint(1, "shared"))
        assert second.latest("shared") == checkpoint(1, "shared")
        second.commit(checkpoint(2, "shared"))
        with pytest.raises(CheckpointOrderError, match="latest committed checkpoint 2"):
            first.commit(checkpoint(2, "shared"))
        assert first.checkpoint_ids("shared") == [1, 2]


def test_a_view_sees_other_instances_discards_and_commits_at_its_next_read(
        config: CheckpointStoreConfig) -> None:
    """``get`` of a checkpoint the view holds reads nothing (a committed checkpoint never
    changes); every other operation reads what others wrote since, through a consumer
    that stayed assigned, including what was written between two of its reads."""
    with KafkaCheckpointStore(config) as first, KafkaCheckpointStore(config) as second:
        for cid in (1, 2, 3):
            first.commit(checkpoint(cid, "shared"))
        assert second.get("shared", 1) == checkpoint(1, "shared")
        first.discard("shared", 1)
        first.commit(checkpoint(4, "shared"))
        # Held by the view: served as it was, without a read.
        assert second.get("shared", 1) == checkpoint(1, "shared")
        # Not held: read for, and the read brings the discard along.
        assert second.get("shared", 4) == checkpoint(4, "shared")
        with pytest.raises(CheckpointNotFoundError, match="has no checkpoint 1"):
            second.get("shared", 1)
        for cid in (5, 6):  # several reads in a row, each of records written since
            first.commit(checkpoint(cid, "shared"))
            assert second.checkpoint_ids("shared") == list(range(2, cid + 1))
            assert second.latest("shared") == checkpoint(cid, "shared")


def test_a_partition_tail_reads_range_after_range_and_keeps_what_it_took_beyond(
        cluster: LocalKafkaCluster) -> None:
    """Ranges read one after another (across transaction markers) give every record once
    in order; records taken past a range's end come first in the next range; a range
    from elsewhere is read from there."""
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(dict(cluster.client_config()))
    create_topic(admin, topic, partitions=1)
    producer = Producer({**cluster.client_config(), "transactional.id": topic})
    producer.init_transactions(30)

    log_end = [0]

    def produce(values: range) -> int:
        """The log end after a transaction of ``values``: its records and its marker."""
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=str(value).encode(), partition=0)
        producer.commit_transaction(30)
        log_end[0] += len(values) + 1
        # The marker is written after commit_transaction returns (under load, a while
        # after): wait for it, on a read_uncommitted consumer (a read_committed one gives
        # the last stable offset, not the log end).
        deadline = time.monotonic() + 15
        while True:
            high = offsets.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
            if high >= log_end[0] or time.monotonic() > deadline:
                assert high == log_end[0], f"log end {high}, expected {log_end[0]}"
                return int(high)
            time.sleep(0.01)

    def failed(error: KafkaError, position: int) -> int:
        if error.code() == KafkaError._PARTITION_EOF:
            return position
        raise AssertionError(error)

    # The view's settings (among them auto.offset.reset=error: a reset is an error, never
    # a silent jump to the log end).
    consumer = Consumer(store_config(cluster).consumer())
    offsets = Consumer({**store_config(cluster).consumer(),
                        "isolation.level": "read_uncommitted"})
    tail = PartitionTail(consumer, topic, 0)
    try:
        read: list[int] = []
        start = 0
        for values in (range(0, 5), range(5, 6), range(6, 40)):
            end = produce(values)  # each transaction ends with a marker: gaps
            read += [int(m.value()) for m in tail.read(start, end, 15, failed, batch=7)]
            start = end
            assert read == list(range(values.stop))
        # A range across a marker, ending inside the next transaction's records: a fetch
        # of as many messages as the range spans offsets takes one past its end (the
        # marker is no message), which the next read gives first.
        produce(range(40, 70))  # offsets start .. start + 29, its marker start + 30
        end = produce(range(70, 100))
        middle = start + 31 + 5
        first = [int(m.value()) for m in tail.read(start, middle, 15, failed, batch=50)]
        rest = [int(m.value()) for m in tail.read(middle, end, 15, failed, batch=50)]
        assert first == list(range(40, 75)) and rest == list(range(75, 100))
        # Elsewhere: read again from offset 0.
        again = [int(m.value()) for m in tail.read(0, end, 15, failed)]
        assert again == list(range(100))
        tail.release()
    finally:
        consumer.close()
        offsets.close()
        producer.flush(10)


def _record_count(config: CheckpointStoreConfig) -> tuple[int, int]:
    """(records in the topic, offsets spanned)."""
    consumer = Consumer({**config.consumer(), "group.id": "count"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(config.topic, 0), timeout=10)
        consumer.assign([TopicPartition(config.topic, 0, low)])
        count = 0
        while True:
            message = consumer.poll(5)
            assert message is not None, "no end-of-partition event"
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return count, high - low
            assert error is None, error
            count += 1
    finally:
        consumer.close()


def test_view_survives_compaction(config: CheckpointStoreConfig) -> None:
    with KafkaCheckpointStore(config) as store:
        for cid in range(1, 11):
            for old in store.commit(checkpoint(cid)):
                store.discard("app", old.checkpoint_id)
        assert store.checkpoint_ids("app") == [8, 9, 10]
        # Keep appending (another application) so the 100 ms segments roll and get cleaned.
        deadline = time.monotonic() + COMPACTION_WAIT_S
        filler = 0
        while True:
            count, spanned = _record_count(config)
            # 10 checkpoints + 10 pointers + 7 tombstones: the cleaner drops old pointers,
            # discarded checkpoints and, after delete.retention.ms, the tombstones.
            if count <= spanned // 2:
                break
            assert time.monotonic() < deadline, (
                f"the log cleaner did not compact within {COMPACTION_WAIT_S} s "
                f"({count} records in {spanned} offsets)")
            filler += 1
            store.commit(checkpoint(filler, "filler"))
            time.sleep(0.3)
    with KafkaCheckpointStore(config) as fresh:
        assert fresh.checkpoint_ids("app") == [8, 9, 10]
        assert fresh.latest("app") == checkpoint(10)
        assert fresh.get("app", 8) == checkpoint(8)
        latest_filler = fresh.latest("filler")
        assert (latest_filler.checkpoint_id if latest_filler else 0) == filler
        with pytest.raises(CheckpointOrderError):
            fresh.commit(checkpoint(10))


def test_a_corrupt_record_is_named(
    cluster: LocalKafkaCluster, config: CheckpointStoreConfig
) -> None:
    with KafkaCheckpointStore(config):
        pass  # creates the topic
    producer = Producer({**cluster.client_config(), "acks": "all"})
    producer.produce(config.topic, key=checkpoint_key("app", 3).encode(), value=b"\x00garbage",
                     partition=0)
    assert producer.flush(15) == 0
    with pytest.raises(CheckpointFormatError,
                       match=rf"'app/checkpoint/0+3' at checkpoint topic {config.topic}\[0\]@0"):
        KafkaCheckpointStore(config)


@pytest.mark.parametrize(
    ("partitions", "topic_config", "message"),
    [
        (2, {"cleanup.policy": "compact"}, "has 2 partitions; expected exactly 1"),
        (1, {"cleanup.policy": "delete"}, "cleanup.policy=delete; expected 'compact'"),
    ],
)
def test_refuses_a_wrong_existing_topic(
    cluster: LocalKafkaCluster,
    config: CheckpointStoreConfig,
    partitions: int,
    topic_config: dict[str, str],
    message: str,
) -> None:
    create_topic(cluster.admin_client(), config.topic, partitions=partitions,
                 config=topic_config)
    with pytest.raises(TopicConfigError, match=message):
        KafkaCheckpointStore(config)


def test_retain_below_two_is_refused(cluster: LocalKafkaCluster) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        store_config(cluster, retain=1)
