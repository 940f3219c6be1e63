"""Keyed state over Kafka: exact restores, and errors instead of shorter state."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_changelog import ChangelogTruncatedError, KeyGroupRange
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
from kafka_changelog.state.errors import SnapshotMissingError
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from tests.state.state_helpers import (
    MAX_P,
    apply_event,
    expected_for,
    model_apply,
    ranges,
    read_user,
    users_in,
)

pytestmark = pytest.mark.broker

USERS = [f"user-{i}".encode() for i in range(50)]


class Job:
    """One keyed operator of an application, on real topics."""

    def __init__(self, cluster: Any) -> None:
        settings = dict(cluster.client_config())
        servers = settings.pop("bootstrap.servers")
        run = uuid.uuid4().hex[:8]
        self.changelog = KafkaChangelogConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"state-log-{run}",
            partitions=4)
        self.storage = KafkaChangelogStorage(self.changelog)
        self.snapshots = KafkaSnapshotStore(SnapshotStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"state-snap-{run}",
            partitions=4))
        self.checkpoints = KafkaCheckpointStore(CheckpointStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"state-cp-{run}"))
        self.coordinator = CheckpointCoordinator(
            "app", self.checkpoints, self.snapshots, self.storage, MAX_P)
        self.admin = AdminClient(cluster.client_config())

    def run(self, parallelism: int, checkpoint_id: int, model: dict[bytes, Any],
            events: int, materialize: bool, seed: int) -> None:
        rng = random.Random(seed)
        latest = self.coordinator.checkpoint()
        backends = [self.coordinator.restore_keyed("op", r, latest, self.changelog)
                    for r in ranges(parallelism)]
        for backend, key_groups in zip(backends, ranges(parallelism), strict=True):
            mine = users_in(USERS, key_groups)
            assert {u: read_user(backend, u) for u in mine} == expected_for(model, mine)
            for _ in range(events):
                user = rng.choice(mine)
                page, amount = rng.choice(["a", "b", "home"]), rng.choice([0, 2, 13])
                apply_event(backend, user, page, amount)
                model_apply(model, user, page, amount)
            if materialize:
                backend.materialize_now()
        handles = [b.snapshot(checkpoint_id).result(60) for b in backends]
        self.coordinator.complete(checkpoint_id, [
            SubtaskState("op", i, parallelism, h, None) for i, h in enumerate(handles)])
        for backend in backends:
            backend.close()

    def close(self) -> None:
        self.storage.close()
        self.snapshots.close()
        self.checkpoints.close()


@pytest.fixture
def job(kafka_cluster: Any) -> Iterator[Job]:
    job = Job(kafka_cluster)
    yield job
    job.close()


def test_restore_is_exact_across_rescaling_and_gc(job: Job) -> None:
    model: dict[bytes, Any] = {}
    for checkpoint_id, (parallelism, materialize) in enumerate(
        [(1, False), (4, True), (2, False), (3, True), (1, True)], start=1
    ):
        job.run(parallelism, checkpoint_id, model, 40, materialize, seed=checkpoint_id)
    assert job.checkpoints.checkpoint_ids("app") == [3, 4, 5]
    # Restoring the latest checkpoint at yet another parallelism still gives the model.
    latest = job.coordinator.checkpoint()
    for key_groups in ranges(5):
        backend = job.coordinator.restore_keyed("op", key_groups, latest, job.changelog)
        mine = users_in(USERS, key_groups)
        assert {u: read_user(backend, u) for u in mine} == expected_for(model, mine)
        backend.close()


def test_a_deleted_log_is_an_error_never_a_shorter_state(job: Job) -> None:
    model: dict[bytes, Any] = {}
    job.run(1, 1, model, 30, False, seed=1)
    marks = {}
    for p in range(4):
        _, high = job.storage.reader()._consumer.get_watermark_offsets(
            TopicPartition(job.changelog.topic, p), 10)
        marks[p] = high
    doomed = [TopicPartition(job.changelog.topic, p, o) for p, o in marks.items() if o > 0]
    for future in job.admin.delete_records(doomed).values():
        future.result(30)
    with pytest.raises(ChangelogTruncatedError) as caught:
        job.coordinator.restore_keyed("op", KeyGroupRange.of(0, MAX_P - 1),
                                      job.coordinator.checkpoint(), job.changelog)
    assert caught.value.topic == job.changelog.topic


def test_a_deleted_snapshot_chunk_is_an_error(job: Job) -> None:
    model: dict[bytes, Any] = {}
    job.run(1, 1, model, 30, True, seed=2)
    checkpoint = job.coordinator.checkpoint()
    assert checkpoint is not None
    keyed = checkpoint.subtasks[0].keyed
    assert keyed is not None and keyed.snapshot is not None
    victim = keyed.snapshot.chunks[0]
    # Gone for real (as after a wrong manual clean-up): delete the records below it and it.
    topic = keyed.snapshot.topic
    doomed = [TopicPartition(topic, victim.partition, victim.offset + 1)]
    for future in job.admin.delete_records(doomed).values():
        future.result(30)
    with pytest.raises(SnapshotMissingError) as caught:
        job.coordinator.restore_keyed("op", KeyGroupRange.of(0, MAX_P - 1), checkpoint,
                                      job.changelog)
    assert f"key group {victim.key_group}" in str(caught.value)
