"""One subtask with ``state_backend="rocksdb"`` run task by task through ``host_store``
(what ``stateful_foreach_batch`` runs in each Spark task) against a real broker, with the
model of its state: the harness of the host-store tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kafka_changelog import KeyGroupRange, key_group_for_key
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore
from kafka_changelog.state import INT64, value_state
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle, SubtaskState
from kafka_changelog.state.host import host_store
from kafka_changelog.state.host import store_materialization as jobs
from kafka_changelog.state.host.local_store import SubtaskStore
from kafka_changelog.state.host.subtask_backend import CachedBackend
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.task import host_store_settings, placement_of

COUNT = value_state("count", INT64)
ALL = KeyGroupRange(0, 127)
#: Due at every task (the schedule is tested by the streaming tests).
EVERY_TASK = MaterializationConfig(interval_s=1e-6, start_jitter_s=0.0)


def users_in_groups(groups: set[int], count: int) -> list[str]:
    """``count`` user names whose key groups are in ``groups``."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        user = f"user-{i}"
        if key_group_for_key(user.encode(), 128) in groups:
            found.append(user)
        i += 1
    return found


@dataclass
class Subtask:
    """One subtask (parallelism 1) run task by task, with the model of its state."""

    config: StreamingStateConfig
    storage: KafkaChangelogStorage
    snapshots: KafkaSnapshotStore
    model: dict[str, int]
    handles: dict[int, KeyedStateHandle]
    cached: CachedBackend | None = None

    def task(self, checkpoint_id: int, base: int | None, updates: list[str],
             materialization: MaterializationConfig = EVERY_TASK,
             run: bool = True, deletes: tuple[str, ...] = ()) -> host_store.StoreHold:
        """One task: attach at ``base``, add 1 per user in ``updates``, clear the users in
        ``deletes``, snapshot, maybe start a background materialization (written at once
        here when ``run``), release."""
        settings = host_store_settings(self.config)
        assert settings is not None
        attached = host_store.attach(
            settings, placement_of(self.config, 0), base,
            [self.handles[base]] if base is not None else [],
            self.cached, self.storage, self.snapshots, materialization)
        backend = attached.backend
        for user in updates:
            backend.set_current_key(user.encode())
            count = backend.state(COUNT)
            count.update((count.value() or 0) + 1)
            self.model[user] = self.model.get(user, 0) + 1
        for user in deletes:
            backend.set_current_key(user.encode())
            backend.state(COUNT).clear()
            self.model.pop(user, None)
        handle = backend.snapshot(checkpoint_id).result(60)
        # The count the checkpoint records (what a catch-up to it takes) is exact.
        assert handle.entry_count == len(self.model), (handle.entry_count, len(self.model))
        encoded = SubtaskState("op", 0, 1, handle, None).to_bytes()
        host_store.materialize_in_background(attached, checkpoint_id, encoded,
                                             materialization)
        self.cached = host_store.release(attached, checkpoint_id, encoded)
        self.handles[checkpoint_id] = handle
        if run and attached.started is not None:
            assert jobs.run_job(attached.started, self.snapshots) is not None
        return attached

    def restored(self, checkpoint_id: int, into_rocksdb: Path | None = None,
                 users: list[str] | None = None) -> dict[str, int]:
        """The state of ``checkpoint_id`` read back from Kafka alone (into memory, or a
        RocksDB table at ``into_rocksdb``), for the model's users and ``users``."""
        from kafka_changelog.state.rocksdb.table import RocksDBStateTable

        table = RocksDBStateTable(into_rocksdb) if into_rocksdb is not None else None
        backend = restore_backend(self.storage, self.snapshots, "op", ALL, 128,
                                  [self.handles[checkpoint_id]], table=table)
        try:
            found = {}
            for user in [*self.model, *(users or [])]:
                backend.set_current_key(user.encode())
                value = backend.state(COUNT).value()
                if value is not None:
                    found[user] = value
            return found
        finally:
            backend.close()

    @property
    def store(self) -> SubtaskStore:
        return SubtaskStore(self.config.local_state_root(), self.config.application, "op",
                            0, 1)


@contextmanager
def subtask_runner(bootstrap_servers: str, tmp_path: Path) -> Iterator[Subtask]:
    """A :class:`Subtask` of a new application (own topics), its stores under
    ``tmp_path / "state"``; its clients closed at the end."""
    prefix = f"bgm-{uuid.uuid4().hex[:8]}"
    config = StreamingStateConfig(
        application=prefix, operator_id="op", bootstrap_servers=bootstrap_servers,
        parallelism=1, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, state_backend="rocksdb", local_state_dir=str(tmp_path / "state"))
    storage = KafkaChangelogStorage(config.changelog())
    snapshots = KafkaSnapshotStore(config.snapshots())
    runner = Subtask(config, storage, snapshots, {}, {})
    try:
        yield runner
    finally:
        if runner.cached is not None:
            runner.cached.backend.close()
        snapshots.close()
        storage.close()
