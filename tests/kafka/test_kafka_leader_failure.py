"""Three nodes, the partition leader killed -9 during appends and persists."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest

from kafka_changelog import KeyGroupRange, StateChange
from kafka_changelog.kafka import KafkaChangelogHandle, KafkaChangelogStorage

from .kafka_helpers import changes_of, storage_config

pytestmark = [pytest.mark.broker, pytest.mark.three_nodes]


def test_completed_persists_restore_exactly_after_leader_kill(kafka_cluster_3: Any) -> None:
    config = storage_config(kafka_cluster_3, partitions=1, replication_factor=3,
                            min_insync_replicas=2, delivery_timeout_ms=60_000)
    expected: list[StateChange] = []
    outcomes: list[tuple[int, Future[Any], int]] = []
    killed = None
    with KafkaChangelogStorage(config) as storage, storage.create_writer(
        "op", KeyGroupRange.of(0, 127)
    ) as writer:
        start = writer.initial_sequence_number()
        for checkpoint in range(1, 41):
            for i in range(50):
                change = StateChange((checkpoint + i) % 128, b"cp%d-%d" % (checkpoint, i))
                writer.append(change.key_group, change.payload)
                expected.append(change)
            outcomes.append((checkpoint, writer.persist(start, checkpoint), len(expected)))
            if checkpoint == 15:
                killed = kafka_cluster_3.leader_of(config.topic, 0)
                kafka_cluster_3.kill_node(killed)
            time.sleep(0.05)
        completed: list[tuple[int, KafkaChangelogHandle, int]] = []
        failed = 0
        for checkpoint, future, count in outcomes:
            try:
                handle = future.result(90).job_owned
            except Exception:
                failed += 1  # a failed persist is allowed; a wrong one is not
                continue
            assert isinstance(handle, KafkaChangelogHandle)
            completed.append((checkpoint, handle, count))
        assert completed, "no persist completed after the leader was killed"
        # Idempotent retries carry the last persist (which covers everything) through.
        assert completed[-1][0] == 40, f"{failed} persists failed, the last among them"
        assert killed is not None
        kafka_cluster_3.restart_node(killed)
        for checkpoint, handle, count in completed:
            assert changes_of(handle, config) == expected[:count], f"checkpoint {checkpoint}"
