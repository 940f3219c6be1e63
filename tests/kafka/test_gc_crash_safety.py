"""Garbage collection that stops half-way (a crash, a broker error) loses nothing and
leaks nothing: the next commit (by this process or a restarted one) finishes it, and a
failed collection never fails the checkpoint that was just committed."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_changelog.errors import ChangelogError
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import KafkaCheckpointStore
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.snapshots.snapshot import ChunkRef
from tests.kafka.apps import App

pytestmark = pytest.mark.broker


class CrashOnce(Exception):
    """Stands for the process dying at this point (the coordinator keeps no GC state)."""


class DiscardCrashesOnce(KafkaCheckpointStore):
    armed = False

    def discard(self, application: str, checkpoint_id: int) -> None:
        if DiscardCrashesOnce.armed:
            DiscardCrashesOnce.armed = False
            raise CrashOnce(f"crash before discarding checkpoint {checkpoint_id}")
        super().discard(application, checkpoint_id)


class DeleteCrashesOnce(KafkaSnapshotStore):
    armed = False

    def delete(self, chunks: Sequence[ChunkRef], backend_id: str) -> None:
        if DeleteCrashesOnce.armed:
            DeleteCrashesOnce.armed = False
            raise CrashOnce(f"crash before tombstoning {len(chunks)} chunks")
        super().delete(chunks, backend_id)


class GcFailsOnce(KafkaChangelogStorage):
    armed = False

    def collect_garbage(self, *args: Any, **kwargs: Any) -> Any:
        if GcFailsOnce.armed:
            GcFailsOnce.armed = False
            raise ChangelogError("cannot list offsets of the changelog: FENCED_LEADER_EPOCH")
        return super().collect_garbage(*args, **kwargs)


def live_snapshot_keys(cluster: Any, topic: str) -> set[str]:
    """Keys whose newest record in the snapshot topic is not a tombstone."""
    consumer = Consumer({**cluster.client_config(), "group.id": f"chk-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        latest: dict[bytes, bytes | None] = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            position = low
            while position < high:
                message = consumer.poll(30)
                assert message is not None and message.error() is None, message
                latest[message.key() or b""] = message.value()
                position = (message.offset() or 0) + 1
        return {k.decode() for k, v in latest.items() if v is not None}
    finally:
        consumer.close()


def referenced_chunk_keys(checkpoints: Sequence[CompletedCheckpoint]) -> set[str]:
    keys = set()
    for checkpoint in checkpoints:
        for subtask in checkpoint.subtasks:
            snapshot = subtask.keyed.snapshot if subtask.keyed is not None else None
            if snapshot is not None:
                keys |= {c.record_key(snapshot.backend_id) for c in snapshot.chunks}
    return keys


def run_checkpoint(app: App) -> None:
    """One checkpoint at parallelism 2 whose state is materialized (new chunks)."""
    app.open(2)
    app.work(10, materialize=True)
    app.commit(app.persist())
    app.close_backends()


@pytest.mark.parametrize("crash", ["before_tombstones", "before_discard"])
def test_a_crash_inside_gc_is_finished_by_the_next_commit(kafka_cluster: Any,
                                                          crash: str) -> None:
    topics = f"gccrash-{uuid.uuid4().hex[:8]}"
    app = App(kafka_cluster, "crashy", topics, store_type=DiscardCrashesOnce,
              snapshot_type=DeleteCrashesOnce)
    for _ in range(3):
        run_checkpoint(app)
    # Checkpoint 4 subsumes checkpoint 2 (retain 2); GC dies in the middle.
    (DeleteCrashesOnce if crash == "before_tombstones" else DiscardCrashesOnce).armed = True
    run_checkpoint(app)
    report = app.coordinator.last_garbage
    assert report.error is not None and "CrashOnce" in report.error, report
    assert app.checkpoints.checkpoint_ids("crashy")[-1] == 4  # committed all the same
    app.assert_restores_exactly(3)
    # The process is gone; a new one commits the next checkpoint and finishes the job.
    model, next_id = app.model, app.next_id
    app.close()
    restarted = App(kafka_cluster, "crashy", topics)
    restarted.model, restarted.next_id = model, next_id
    try:
        run_checkpoint(restarted)
        assert restarted.coordinator.last_garbage.error is None
        retained = [restarted.checkpoints.get("crashy", i)
                    for i in restarted.checkpoints.checkpoint_ids("crashy")]
        assert [c.checkpoint_id for c in retained] == [4, 5]
        # Exactly the chunks retained checkpoints use are live: none leaked.
        live = live_snapshot_keys(kafka_cluster, f"{topics}-snap")
        assert live == referenced_chunk_keys(retained)
        restarted.assert_restores_exactly(1)
    finally:
        restarted.close()


def test_a_failed_changelog_gc_does_not_fail_the_commit(kafka_cluster: Any) -> None:
    app = App(kafka_cluster, "gcfail", f"gcfail-{uuid.uuid4().hex[:8]}", storage_type=GcFailsOnce)
    try:
        for _ in range(3):
            run_checkpoint(app)
        GcFailsOnce.armed = True
        run_checkpoint(app)  # commits although changelog GC raised
        report = app.coordinator.last_garbage
        assert report.error == ("ChangelogError: cannot list offsets of the changelog: "
                                "FENCED_LEADER_EPOCH")
        assert report.discarded_checkpoints == [2]
        assert app.checkpoints.checkpoint_ids("gcfail") == [3, 4]
        run_checkpoint(app)
        assert app.coordinator.last_garbage.error is None
        assert max(app.coordinator.last_garbage.changelog_log_start.values()) > 0
        app.assert_restores_exactly(2)
    finally:
        app.close()
