"""KafkaSnapshotStore against a real broker whose log cleaner runs within a second."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_changelog.errors import TopicConfigError
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.local_kafka.topics import create_topic
from kafka_changelog.serialization import encode
from kafka_changelog.state.errors import SnapshotCorruptError, SnapshotMissingError
from kafka_changelog.state.snapshots.snapshot import ChunkRef, SnapshotHandle

pytestmark = pytest.mark.broker

R = KeyGroupRange.of

#: The cleaner looks for work every 100 ms instead of every 15 s.
FAST_CLEANER = {"log.cleaner.backoff.ms": "100"}
#: Segments roll after 100 ms and any dirt makes a log cleanable.
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


def store_config(cluster: LocalKafkaCluster, **overrides: Any) -> SnapshotStoreConfig:
    settings = dict(cluster.client_config())
    fields: dict[str, Any] = {
        "bootstrap_servers": settings.pop("bootstrap.servers"),
        "client_config": settings,
        "topic": f"snapshots-{uuid.uuid4().hex[:10]}",
        "partitions": 4,
        "max_parallelism": 16,
        "max_chunk_bytes": 1000,
        "request_timeout_s": 15.0,
        "topic_overrides": dict(FAST_COMPACTION),
    }
    fields.update(overrides)
    return SnapshotStoreConfig(**fields)


@pytest.fixture
def store(cluster: LocalKafkaCluster) -> Iterator[KafkaSnapshotStore]:
    with KafkaSnapshotStore(store_config(cluster)) as created:
        yield created


def test_write_read_exact_multi_chunk_and_empty_groups(store: KafkaSnapshotStore) -> None:
    states = {0: os.urandom(2500), 1: b"", 3: b"\x01", 9: os.urandom(1000), 15: os.urandom(7)}
    handle = store.write("backend-1", 1, R(0, 15), states, {}, 77)
    assert handle.topic == store.topic
    assert handle.materialized_sequence_number == 77
    assert [c.size for c in handle.chunks_of(0)] == [1000, 1000, 500]
    assert handle.chunks_of(2) == ()
    assert {c.partition for c in handle.chunks_of(9)} == {9 * 4 // 16}
    assert list(store.read(handle)) == sorted(states.items())
    assert list(store.read(handle, R(1, 9))) == [(1, b""), (3, b"\x01"), (9, states[9])]
    # The handle alone is enough: a fresh store instance reads it after a round trip.
    with KafkaSnapshotStore(store.config) as other:
        assert dict(other.read(SnapshotHandle.from_bytes(handle.to_bytes()))) == states


def test_default_chunk_size_with_large_state(cluster: LocalKafkaCluster) -> None:
    config = store_config(cluster, max_chunk_bytes=512 * 1024)
    big = os.urandom(1_200_000)
    with KafkaSnapshotStore(config) as store:
        handle = store.write("backend-big", 1, R(0, 15), {5: big}, {}, 1)
        assert [c.size for c in handle.chunks_of(5)] == [524288, 524288, 151424]
        assert dict(store.read(handle)) == {5: big}


def test_concurrent_writers_share_a_store(store: KafkaSnapshotStore) -> None:
    handles: dict[str, SnapshotHandle] = {}
    states = {f"b{i}": {kg: os.urandom(1500 + kg) for kg in range(i * 4, i * 4 + 4)}
              for i in range(4)}

    def write(backend: str) -> None:
        key_groups = R(min(states[backend]), max(states[backend]))
        handles[backend] = store.write(backend, 1, key_groups, states[backend], {}, 0)

    threads = [threading.Thread(target=write, args=(b,)) for b in states]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(handles) == sorted(states)
    for backend, handle in handles.items():
        assert dict(store.read(handle)) == states[backend]


def test_errors_name_the_missing_or_corrupt_chunk(
    store: KafkaSnapshotStore, cluster: LocalKafkaCluster
) -> None:
    handle = store.write("backend-x", 3, R(0, 15), {2: b"payload", 6: b"other"}, {}, 0)
    ref = handle.chunks_of(2)[0]
    # Another record (of key group 6) at the offset: the chunk is not there.
    other = handle.chunks_of(6)[0]
    moved = replace(handle, chunks=(replace(ref, offset=other.offset,
                                            partition=other.partition), other))
    with pytest.raises(SnapshotMissingError, match="key 'backend-x/6/3/0' instead of") as info:
        list(store.read(moved))
    assert info.value.key_group == 2 and info.value.materialization_id == 3
    # Past the log end.
    beyond = replace(handle, chunks=(replace(ref, offset=10_000), other))
    with pytest.raises(SnapshotMissingError, match="no record at offset 10000") as info:
        list(store.read(beyond))
    assert (info.value.topic, info.value.partition, info.value.offset) == (
        store.topic, ref.partition, 10_000)
    # A record produced by hand at the chunk's key, with other data: checksum mismatch.
    producer = Producer({**cluster.client_config(), "acks": "all"})
    offsets: list[int] = []
    value = encode("snapshot_chunk", {
        "backend_id": "backend-x", "key_group": 2, "materialization_id": 3, "chunk_no": 0,
        "chunk_count": 1, "data": b"PAYLOAD"})
    producer.produce(store.topic, key=b"backend-x/2/3/0", value=value, partition=ref.partition,
                     on_delivery=lambda err, msg: offsets.append(msg.offset() or -1))
    assert producer.flush(15) == 0
    forged = replace(handle, chunks=(replace(ref, offset=offsets[0]), other))
    with pytest.raises(SnapshotCorruptError, match="CRC-32 of the data expected") as corrupt:
        list(store.read(forged))
    assert corrupt.value.offset == offsets[0] and corrupt.value.key_group == 2
    assert dict(store.read(handle)) == {2: b"payload", 6: b"other"}  # the original is intact


def _wait_until_missing(
    store: KafkaSnapshotStore, handle: SnapshotHandle, key_group: int
) -> SnapshotMissingError:
    """Keep rolling segments (with harmless tombstones) until the cleaner removed the chunk."""
    filler = ChunkRef(key_group, 1, 0, 1, handle.chunks_of(key_group)[0].partition, 0, 0, 0)
    deadline = time.monotonic() + COMPACTION_WAIT_S
    while time.monotonic() < deadline:
        try:
            list(store.read(handle, R(key_group, key_group)))
        except SnapshotMissingError as exc:
            return exc
        store.delete([filler], "filler")  # a new record rolls the 100 ms segment
        time.sleep(0.3)
    raise AssertionError(f"the log cleaner did not remove the chunks within {COMPACTION_WAIT_S} s")


def test_old_handles_stay_exact_through_newer_materializations_and_compaction(
    store: KafkaSnapshotStore,
) -> None:
    # All of key groups 0..3 live in partition 0, so they share segments and cleaning.
    keeper = store.write("keeper", 1, R(0, 3), {3: os.urandom(1800)}, {}, 0)
    v1 = {0: os.urandom(2100), 1: os.urandom(1200), 2: b"two-v1"}
    m1 = store.write("backend", 1, R(0, 3), v1, {}, 10)
    v2 = {1: os.urandom(900)}
    m2 = store.write("backend", 2, R(0, 3), v2, {0: m1.chunks_of(0), 2: m1.chunks_of(2)}, 20)
    assert m2.chunks_of(0) == m1.chunks_of(0)
    expected_m2 = {0: v1[0], 1: v2[1], 2: v1[2]}
    # The older snapshot still reads as of its own materialization, not the newer values.
    assert dict(store.read(m1)) == v1
    assert dict(store.read(m2)) == expected_m2
    # m1 is subsumed: delete what only it refers to (key group 1 of materialization 1).
    store.delete(m1.chunks_of(1), "backend")
    missing = _wait_until_missing(store, m1, 1)
    assert missing.key_group == 1 and missing.backend_id == "backend"
    assert missing.materialization_id == 1 and missing.chunk_no == 0
    assert "key group 1" in str(missing)
    with pytest.raises(SnapshotMissingError, match="key group 1"):
        list(store.read(m1))
    # After compaction really ran, live chunks (reused ones included) are at the same offsets.
    assert dict(store.read(m2)) == expected_m2
    assert dict(store.read(m1, R(0, 0))) == {0: v1[0]}
    assert dict(store.read(keeper)) == {3: dict(store.read(keeper))[3]}
    assert len(dict(store.read(keeper))[3]) == 1800


@pytest.mark.parametrize(
    ("partitions", "topic_config", "message"),
    [
        (4, {"cleanup.policy": "delete"}, "cleanup.policy=delete; expected 'compact'"),
        (4, {"cleanup.policy": "compact,delete", "retention.ms": "600000"},
         "retention.ms=600000; expected retention.ms=-1"),
        (2, {"cleanup.policy": "compact"}, "has 2 partitions; expected at least 4"),
    ],
)
def test_refuses_an_unsafe_existing_topic(
    cluster: LocalKafkaCluster, partitions: int, topic_config: dict[str, str], message: str
) -> None:
    config = store_config(cluster)
    create_topic(cluster.admin_client(), config.topic, partitions=partitions,
                 config=topic_config)
    with pytest.raises(TopicConfigError, match=message):
        KafkaSnapshotStore(config)


def test_accepts_an_existing_compacted_topic(cluster: LocalKafkaCluster) -> None:
    config = store_config(cluster)
    create_topic(cluster.admin_client(), config.topic, partitions=8,
                 config={"cleanup.policy": "compact"})
    with KafkaSnapshotStore(config) as store:
        assert store.topic_info.partitions == 8
        handle = store.write("b", 1, R(0, 15), {4: b"ok"}, {}, 0)
        assert dict(store.read(handle)) == {4: b"ok"}


def test_chunk_below_the_log_start_is_missing(
    store: KafkaSnapshotStore, cluster: LocalKafkaCluster
) -> None:
    handle = store.write("backend-d", 1, R(0, 15), {0: b"first", 1: b"second"}, {}, 0)
    first, second = handle.chunks_of(0)[0], handle.chunks_of(1)[0]
    assert first.partition == second.partition
    # DeleteRecords (allowed because the policy includes 'delete') moves the log start.
    cut = TopicPartition(store.topic, first.partition, second.offset)
    admin = AdminClient(cluster.client_config())
    for future in admin.delete_records([cut], request_timeout=15).values():
        future.result(15)
    with pytest.raises(SnapshotMissingError, match=rf"the log holds offsets {second.offset} to"):
        list(store.read(handle))
    assert dict(store.read(handle, R(1, 1))) == {1: b"second"}


def test_key_groups_written_as_they_come_with_a_bounded_unacknowledged_window(
    cluster: LocalKafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``begin_write``: each key group's chunks are produced when it is added (at most
    the window unacknowledged: here two chunks), the handle reads back exactly, reused
    chunks are kept, and a key group cannot be added twice or outside the range."""
    from kafka_changelog.kafka import snapshot_store

    monkeypatch.setattr(snapshot_store, "MAX_UNACKED_CHUNK_BYTES", 2000)
    states = {kg: os.urandom(1000 * (kg % 4) + 17) for kg in range(0, 16, 2)}
    with KafkaSnapshotStore(store_config(cluster)) as store:
        first = store.write("backend", 1, R(0, 15), {1: b"one"}, {}, 5)
        writer = store.begin_write("backend", 2, R(0, 15), 9)
        for key_group, state in states.items():
            writer.add(key_group, state)
        with pytest.raises(ValueError, match=r"key group 2 .* written twice"):
            writer.add(2, b"again")
        with pytest.raises(ValueError, match="outside the written key-group range"):
            writer.add(16, b"")
        assert writer.bytes_added == sum(len(s) for s in states.values())
        handle = writer.finish({1: first.chunks_of(1)})
        assert handle.materialized_sequence_number == 9
        assert dict(store.read(handle)) == {**states, 1: b"one"}


def test_reading_a_plan_ahead_gives_what_fetching_one_by_one_gives(
    store: KafkaSnapshotStore
) -> None:
    """``fetch_all`` (two consumers, the next run fetched while one is read) gives the
    records of ``fetch``, over runs in several partitions, back and forth, with gaps, and
    describes offsets where no record is (the rest of the run still read)."""
    states = {kg: os.urandom(2500) for kg in range(16)}
    handle = store.write("plan", 1, R(0, 15), states, {}, 0)
    chunks = list(handle.chunks)
    plan = [(c.partition, c.offset) for c in chunks]
    high = max(offset for _, offset in plan)
    plan = [*plan[::-1][:5], *plan, (0, high + 1000), *plan[:3], (1, plan[-1][1] + 40)]
    source = store._open_source(store.topic)
    try:
        one_by_one = [source.fetch(p, o) for p, o in plan]
        ahead = list(source.fetch_all(plan))
    finally:
        source.close()
    assert ahead == one_by_one
    assert all(not isinstance(found, str) for found in ahead[:5])
    assert isinstance(ahead[5 + len(chunks)], str)
