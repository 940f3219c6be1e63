"""Garbage collection while a partition leader dies (issue 9, item 12).

Right after a kill -9 the admin client still sends ``ListOffsets`` and
``DeleteRecords`` to the dead leader, or reaches the new one with a stale
leader epoch (``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``, transport
errors). These are transient: the collection must wait them out, and never
delete what a retained handle still needs.
"""

from __future__ import annotations

import pytest

from kafka_changelog import KeyGroupRange, SequenceNumber, StateChange
from kafka_changelog.gc_types import GarbageCollectionResult
from kafka_changelog.kafka import KafkaChangelogHandle, KafkaChangelogStorage
from kafka_changelog.local_kafka.broker import LocalKafkaCluster

from .kafka_helpers import changes_of, storage_config

pytestmark = [pytest.mark.broker, pytest.mark.three_nodes]

PARTITIONS = 4
CALLS_AFTER_KILL = 6


def test_gc_survives_a_leader_kill_and_keeps_what_is_retained(
    kafka_cluster_3: LocalKafkaCluster,
) -> None:
    config = storage_config(kafka_cluster_3, partitions=PARTITIONS, replication_factor=3,
                            min_insync_replicas=2)
    victim: int | None = None
    try:
        with KafkaChangelogStorage(config) as storage, storage.create_writer(
            "op", KeyGroupRange.of(0, 127)
        ) as writer:
            starts: list[SequenceNumber] = []
            written: list[list[StateChange]] = []
            for i in range(6):
                starts.append(writer.next_sequence_number())
                changes = [StateChange(kg, b"set%d-kg%d" % (i, kg)) for kg in range(0, 128, 4)]
                for change in changes:
                    writer.append(change.key_group, change.payload)
                written.append(changes)
                writer.persist(starts[i], i + 1).result(60)
            # A retained checkpoint's handle covers sets 3..5; the writer lets go of all.
            retained = writer.persist(starts[3], 10).result(60).job_owned
            assert isinstance(retained, KafkaChangelogHandle)
            writer.truncate(writer.next_sequence_number())
            expected = [c for changes in written[3:] for c in changes]
            # Every set writes one record per partition (32 key groups each).
            needed = {r.partition: r.start_offset for r in retained.ranges}
            assert sorted(needed) == list(range(PARTITIONS)) and min(needed.values()) > 0

            victim = kafka_cluster_3.leader_of(config.topic, 0)
            kafka_cluster_3.kill_node(victim)
            results: list[GarbageCollectionResult] = []
            moved_at: int | None = None
            while len(results) < CALLS_AFTER_KILL or moved_at is None:
                results.append(storage.collect_garbage([retained]))
                if moved_at is None and _leader_moved(kafka_cluster_3, config.topic, victim):
                    moved_at = len(results)
                assert len(results) < 100, "leadership of partition 0 never moved"
            for result in results:
                assert result.topic == config.topic
                # Never below what the retained handle needs, whatever the leader did.
                assert all(result.deleted_below[p] <= needed[p] for p in needed), result
            # Once leadership settled the collection did its job.
            assert results[-1].deleted_below == needed
            assert changes_of(retained, config) == expected
    finally:
        if victim is not None:
            kafka_cluster_3.restart_node(victim)


def _leader_moved(cluster: LocalKafkaCluster, topic: str, victim: int) -> bool:
    try:
        return cluster.leader_of(topic, 0) != victim
    except Exception:  # no leader right now: not moved yet
        return False
