"""Kafka storage behaviour beyond the contract: batching, reuse, topics, reading, GC."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_changelog import (
    ChangelogTruncatedError,
    KeyGroupRange,
    StateChange,
    load_storage,
)
from kafka_changelog.errors import ChangelogError, RecordDecodeError, TopicConfigError
from kafka_changelog.kafka import (
    KafkaChangelogHandle,
    KafkaChangelogReader,
    KafkaChangelogStorage,
    PartitionRange,
)
from kafka_changelog.kafka.record_format import empty_value
from kafka_changelog.keygroups import key_groups_of_partition, partition_for_key_group

from .kafka_helpers import changes_of, storage_config

pytestmark = pytest.mark.broker

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
SCHEMA_FILE = SCHEMAS / "change_batch.avsc"


def high_watermarks(storage: KafkaChangelogStorage) -> dict[int, int]:
    consumer_settings = storage.config.consumer()
    from confluent_kafka import Consumer

    consumer = Consumer(consumer_settings)
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(storage.config.topic, p), 10)[1]
            for p in range(storage.topic.partitions)
        }
    finally:
        consumer.close()


def test_load_storage_by_name(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster)
    storage = load_storage("kafka", bootstrap_servers=config.bootstrap_servers,
                           client_config=config.client_config, topic=config.topic)
    try:
        assert isinstance(storage, KafkaChangelogStorage)
        assert storage.topic.configs["cleanup.policy"] == "delete"
        assert storage.topic.configs["retention.ms"] == "-1"
    finally:
        storage.close()


def test_many_changes_share_few_records_and_persist_never_resends(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=4, max_parallelism=128)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        for i in range(5000):
            writer.append(i % 128, b"%06d" % i)
        first = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
        marks = high_watermarks(storage)
        # One change set, four partitions: one record per partition.
        assert sum(marks.values()) == 4
        again = writer.persist(writer.initial_sequence_number(), 2).result(30).job_owned
        assert high_watermarks(storage) == marks
        assert isinstance(first, KafkaChangelogHandle) and isinstance(again, KafkaChangelogHandle)
        assert again.ranges == first.ranges
        changes = changes_of(again, config)
        assert [c.payload for c in changes] == [b"%06d" % i for i in range(5000)]


def test_records_are_split_below_the_size_bound(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=1, max_record_bytes=4096)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        payloads = [bytes([i % 256]) * 1000 for i in range(40)]
        for i, payload in enumerate(payloads):
            writer.append(i, payload)
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
        marks = high_watermarks(storage)
        assert marks[0] >= 10  # ~4 changes of 1 KB per 4 KB record
        assert [c.payload for c in changes_of(handle, config)] == payloads


def test_preemptive_persistence_produces_before_the_checkpoint(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=1,
                            preemptive_persist_threshold_bytes=10_000)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        for i in range(30):
            writer.append(i, b"p" * 1000)
        storage.producer.wait_for_records_before_now(30)
        before_persist = high_watermarks(storage)[0]
        assert before_persist >= 2
        writer.append(1, b"last")
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
        assert high_watermarks(storage)[0] == before_persist + 1
        assert [c.payload for c in changes_of(handle, config)] == [b"p" * 1000] * 30 + [b"last"]


def test_key_groups_map_to_partitions_in_contiguous_blocks() -> None:
    assert [partition_for_key_group(kg, 4, 128) for kg in (0, 31, 32, 63, 64, 127)] == [
        0, 0, 1, 1, 2, 3]
    for p in range(4):
        assert key_groups_of_partition(p, 4, 128) == KeyGroupRange.of(32 * p, 32 * p + 31)
    covered = [kg for p in range(7) for kg in key_groups_of_partition(p, 7, 100)]
    assert covered == list(range(100))
    assert key_groups_of_partition(5, 8, 4).is_empty


def test_rescaled_reader_reads_only_overlapping_partitions(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=4, max_parallelism=128)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        writer.append_meta(b"meta")
        for kg in range(128):
            writer.append(kg, b"kg%d" % kg)
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
    narrowed = handle.intersection(KeyGroupRange.of(40, 50))
    assert isinstance(narrowed, KafkaChangelogHandle)
    # Key groups 40..50 live in partition 1; meta lives with key group 0 in partition 0.
    assert sorted(r.partition for r in narrowed.ranges) == [0, 1]
    assert changes_of(narrowed, config) == [StateChange.meta(b"meta")] + [
        StateChange(kg, b"kg%d" % kg) for kg in range(40, 51)]


def test_existing_topic_with_unsafe_settings_is_refused(kafka_cluster: Any) -> None:
    admin = AdminClient(kafka_cluster.client_config())
    compacted = storage_config(kafka_cluster)
    few = storage_config(kafka_cluster, partitions=8)
    futures = admin.create_topics([
        NewTopic(compacted.topic, 4, 1, config={"cleanup.policy": "compact"}),
        NewTopic(few.topic, 2, 1),
    ])
    for future in futures.values():
        future.result(30)
    with pytest.raises(TopicConfigError, match=rf"{compacted.topic} has cleanup.policy=compact"):
        KafkaChangelogStorage(compacted)
    with pytest.raises(TopicConfigError, match=rf"{few.topic} has 2 partitions; expected at least"):
        KafkaChangelogStorage(few)
    replicated = storage_config(kafka_cluster, topic=few.topic, partitions=2, replication_factor=3)
    with pytest.raises(TopicConfigError, match="replication factor 1; expected at least 3"):
        KafkaChangelogStorage(replicated)


def test_truncated_log_is_an_error_never_a_shorter_state(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=1)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        writer.append(1, b"a")
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
        admin = AdminClient(kafka_cluster.client_config())
        deleted = admin.delete_records([TopicPartition(config.topic, 0, 1)])
        for future in deleted.values():
            future.result(30)
        with pytest.raises(ChangelogTruncatedError) as caught:
            changes_of(handle, config)
    assert (caught.value.topic, caught.value.partition) == (config.topic, 0)
    assert (caught.value.needed_offset, caught.value.log_start_offset) == (0, 1)
    assert f"{config.topic}[0]" in str(caught.value)


def _produce_raw(config: Any, cluster: Any, key: bytes, value: bytes,
                 headers: list[tuple[str, bytes]]) -> int:
    offsets: list[int] = []
    producer = Producer(cluster.client_config())
    producer.produce(config.topic, value=value, key=key, partition=0, headers=headers,
                     on_delivery=lambda err, msg: offsets.append(msg.offset()))
    producer.flush(30)
    return offsets[0]


@pytest.mark.parametrize(
    ("value", "schema", "message"),
    [
        (b"\xff\xfe garbage", b"change_batch/2", "not a change_batch Avro value"),
        (b"\xff\xfe garbage", b"change_batch/1", "not a change_batch_v1 Avro value"),
        (b"", b"change_batch/99", "record schema 'change_batch/99' is not supported"),
    ],
)
def test_bad_records_are_named_by_offset(
    kafka_cluster: Any, value: bytes, schema: bytes, message: str
) -> None:
    config = storage_config(kafka_cluster, partitions=1)
    with KafkaChangelogStorage(config):
        offset = _produce_raw(config, kafka_cluster, b"log-x", value, [("kc.schema", schema)])
    handle = KafkaChangelogHandle(
        "log-x", config.topic, KeyGroupRange.of(0, 127),
        [PartitionRange(0, offset, offset + 1, KeyGroupRange.of(0, 127), len(value))], 0, 0)
    with pytest.raises(RecordDecodeError) as caught:
        changes_of(handle, config)
    assert caught.value.offset == offset
    assert f"{config.topic}[0]@{offset}" in str(caught.value)
    assert message in str(caught.value)


def test_records_of_0_2_0_are_read_as_they_were_written(kafka_cluster: Any) -> None:
    """A log written by kafka-changelog 0.2.0 (``change_batch/1``: each change's payload
    beside its fields), read by this version: the same changes, in order, copies from a
    retried upload dropped, by the per-change and the column-wise read alike."""
    legacy = fastavro.parse_schema(json.loads((SCHEMAS / "change_batch_v1.avsc").read_text()))

    def legacy_value(changes: list[tuple[int, int, int, bytes]]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, legacy, {"log_id": "log-old", "changes": [
            {"sequence_number": s, "index": i, "key_group": kg, "payload": p}
            for s, i, kg, p in changes]})
        return out.getvalue()

    config = storage_config(kafka_cluster, partitions=1)
    first = [(1, 0, -1, b"\x00meta"), (1, 1, 5, b"a" * 200), (1, 2, 9, b"")]
    second = [(2, 0, 5, b"b"), (2, 1, 200, b"not mine")]  # key group 200: another range's
    headers = [("kc.schema", b"change_batch/1")]
    with KafkaChangelogStorage(config):
        offsets = [_produce_raw(config, kafka_cluster, b"log-old", legacy_value(changes),
                                headers) for changes in (first, second, first)]
    handle = KafkaChangelogHandle(
        "log-old", config.topic, KeyGroupRange.of(0, 127),
        [PartitionRange(0, offsets[0], offsets[-1] + 1, KeyGroupRange.of(0, 127), 1000)],
        1, 2)
    assert changes_of(handle, config) == [  # also checks the column-wise read agrees
        StateChange.meta(b"\x00meta"), StateChange(5, b"a" * 200), StateChange(9, b""),
        StateChange(5, b"b")]
    with KafkaChangelogReader(config) as reader:
        assert reader.read_columns([handle]) is not None


def test_kcat_replays_records_that_decode_with_the_schema_file_alone(
    kafka_cluster: Any,
) -> None:
    config = storage_config(kafka_cluster, partitions=2, max_parallelism=4)
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 3)
    ) as writer:
        writer.append_meta(b"\x00meta")
        for i in range(20):
            writer.append(i % 4, bytes([i, 255 - i]) * 3)
        handle = writer.persist(writer.initial_sequence_number(), 1).result(30).job_owned
    assert isinstance(handle, KafkaChangelogHandle)
    schema = fastavro.parse_schema(json.loads(SCHEMA_FILE.read_text()))
    decoded: list[tuple[int, int, int, bytes]] = []
    for r in handle.ranges:
        out = subprocess.run(
            ["kcat", "-C", "-b", config.bootstrap_servers, "-t", config.topic,
             "-p", str(r.partition), "-o", str(r.start_offset), "-c", str(r.offset_count),
             "-e", "-q", "-f", "%K %S %h\n%k%s"],
            check=True, capture_output=True, timeout=60,
        ).stdout
        buffer = io.BytesIO(out)
        while line := buffer.readline():
            key_len, value_len, headers = line.decode().rstrip("\n").split(" ", 2)
            key = buffer.read(int(key_len))
            value = buffer.read(int(value_len))
            assert key == handle.log_id.encode()
            assert f"kc.log_id={handle.log_id}" in headers
            assert "kc.schema=change_batch/2" in headers
            record = fastavro.schemaless_reader(io.BytesIO(value), schema, None)
            at = 0
            for c in record["changes"]:
                payload = record["payloads"][at:at + c["payload_size"]]
                at += c["payload_size"]
                decoded.append((c["sequence_number"], c["index"], c["key_group"], payload))
            assert at == len(record["payloads"])
    restored = [StateChange(kg, payload) for _, _, kg, payload in sorted(decoded)]
    assert restored == changes_of(handle, config)
    assert restored[0] == StateChange.meta(b"\x00meta")
    assert len(restored) == 21
    assert all(cmd.startswith("kcat -C -b ") for cmd in handle.kcat_commands(
        config.bootstrap_servers))


def test_spark_offsets_of_a_handle() -> None:
    handle = KafkaChangelogHandle(
        "log", "t", KeyGroupRange.of(0, 9),
        [PartitionRange(2, 10, 20, KeyGroupRange.of(0, 4), 100),
         PartitionRange(3, 5, 6, KeyGroupRange.of(5, 9), 10)], 0, 3)
    starting, ending = handle.to_spark_offsets()
    assert json.loads(starting) == {"t": {"2": 10, "3": 5}}
    assert json.loads(ending) == {"t": {"2": 20, "3": 6}}


@pytest.mark.parametrize(("start", "end"), [(0, 10), (5, 10)],
                         ids=["runs-past-the-end", "starts-past-the-end"])
def test_a_range_past_the_log_end_says_records_were_lost(
    kafka_cluster: Any, start: int, end: int
) -> None:
    config = storage_config(kafka_cluster, partitions=1)
    with KafkaChangelogStorage(config):
        offset = _produce_raw(config, kafka_cluster, b"log-y", empty_value("log-y"),
                              [("kc.schema", b"change_batch/2")])
    assert offset == 0
    handle = KafkaChangelogHandle(
        "log-y", config.topic, KeyGroupRange.of(0, 127),
        [PartitionRange(0, start, end, KeyGroupRange.of(0, 127), 100)], 0, 0)
    with pytest.raises(ChangelogError, match=(
            rf"^changelog {config.topic}\[0\] ends at offset 1 but log log-y needs records up "
            rf"to offset {end - 1}: records were lost")):
        changes_of(handle, config)
