"""An application on (possibly shared) Kafka topics, with a model of its state (tests)."""

from __future__ import annotations

import random
from typing import Any

from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
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

USERS = [f"user-{i}".encode() for i in range(40)]


class App:
    """One application (its own process: own clients, own writers) on shared topics."""

    def __init__(self, cluster: Any, name: str, topics: str,
                 storage_type: type[KafkaChangelogStorage] = KafkaChangelogStorage,
                 store_type: type[KafkaCheckpointStore] = KafkaCheckpointStore,
                 snapshot_type: type[KafkaSnapshotStore] = KafkaSnapshotStore) -> None:
        settings = dict(cluster.client_config())
        servers = settings.pop("bootstrap.servers")
        self.name = name
        self.changelog = KafkaChangelogConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"{topics}-log",
            partitions=2)
        self.storage = storage_type(self.changelog)
        self.snapshots = snapshot_type(SnapshotStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"{topics}-snap",
            partitions=2))
        self.checkpoints = store_type(CheckpointStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"{topics}-cp", retain=2))
        self.coordinator = CheckpointCoordinator(
            name, self.checkpoints, self.snapshots, self.storage, MAX_P)
        self.model: dict[bytes, Any] = {}
        self.rng = random.Random(name)
        self.next_id = 1
        self.backends: list[ChangelogKeyedStateBackend] = []

    def open(self, parallelism: int) -> None:
        """Restore the latest checkpoint (or start empty) at ``parallelism``."""
        latest = self.coordinator.checkpoint()
        self.backends = [self.coordinator.restore_keyed("op", r, latest, self.changelog)
                         for r in ranges(parallelism)]

    def work(self, events: int, materialize: bool = False) -> None:
        for backend, key_groups in zip(self.backends, ranges(len(self.backends)), strict=True):
            mine = users_in(USERS, key_groups)
            for _ in range(events):
                user = self.rng.choice(mine)
                page, amount = self.rng.choice(["a", "b"]), self.rng.choice([1, 5])
                apply_event(backend, user, page, amount)
                model_apply(self.model, user, page, amount)
            if materialize:
                backend.materialize_now()

    def persist(self) -> list[SubtaskState]:
        """Persist a checkpoint's changelog (not committed yet)."""
        p = len(self.backends)
        return [SubtaskState("op", i, p, b.snapshot(self.next_id).result(60), None)
                for i, b in enumerate(self.backends)]

    def commit(self, subtasks: list[SubtaskState]) -> None:
        self.coordinator.complete(self.next_id, subtasks)
        for backend in self.backends:
            backend.notify_checkpoint_complete(self.next_id)
        self.next_id += 1

    def close_backends(self) -> None:
        for backend in self.backends:
            backend.close()
        self.backends = []

    def assert_restores_exactly(self, parallelism: int) -> None:
        """A fresh restore of the latest checkpoint equals the model."""
        latest = self.coordinator.checkpoint()
        for key_groups in ranges(parallelism):
            backend = self.coordinator.restore_keyed("op", key_groups, latest, self.changelog)
            mine = users_in(USERS, key_groups)
            assert {u: read_user(backend, u) for u in mine} == expected_for(self.model, mine), \
                f"application {self.name}, checkpoint {latest.checkpoint_id if latest else None}"
            backend.close()

    def close(self) -> None:
        self.close_backends()
        self.storage.close()
        self.snapshots.close()
        self.checkpoints.close()
