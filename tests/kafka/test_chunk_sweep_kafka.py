"""The snapshot sweep on a real broker: after a commit, the chunks no checkpoint can name
are tombstoned, exactly those, and every checkpoint still restores exactly."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_changelog.state.snapshots.snapshot_store import LiveKey
from tests.kafka.apps import App
from tests.state.state_helpers import ranges

pytestmark = pytest.mark.broker


def chunk_keys(handle: Any) -> set[str]:
    return {chunk.record_key(handle.backend_id) for chunk in handle.chunks}


def live(app: App) -> set[str]:
    return {key.key for key in app.snapshots.live_keys()}


def named(app: App) -> set[str]:
    """The chunk keys the application's stored checkpoints name."""
    return {key for checkpoint in app.checkpoints.all_checkpoints()
            for subtask in checkpoint.subtasks
            if subtask.keyed is not None and subtask.keyed.snapshot is not None
            for key in chunk_keys(subtask.keyed.snapshot)}


def test_a_commit_sweeps_exactly_the_chunks_no_checkpoint_can_name(kafka_cluster: Any) -> None:
    app = App(kafka_cluster, "sweeper", f"sweep-{uuid.uuid4().hex[:8]}")
    try:
        app.open(2)
        for _ in range(2):
            app.work(40, materialize=True)
            app.commit(app.persist())
        backend = app.backends[0]
        key_groups = ranges(2)[0]
        named_m = backend.materialization_id
        hour_ago_m = int((time.time() - 2 * 3600) * 1e6)
        # Left behind: a materialization of a named backend older than the one named
        # (its process was killed before it was handed out), and one of a backend that
        # no checkpoint names, two hours old; kept: one of such a backend just written
        # (its checkpoint may still come), and a record that is not a chunk.
        superseded = app.snapshots.write(backend.backend_id, named_m - 1, key_groups,
                                         {key_groups.start: os.urandom(300)}, {}, 0)
        dead = app.snapshots.write("killed-backend", hour_ago_m, key_groups,
                                   {key_groups.start: b"x", key_groups.start + 1: b"y"}, {}, 0)
        young = app.snapshots.write("new-backend", int(time.time() * 1e6), key_groups,
                                    {key_groups.start: b"z"}, {}, 0)
        settings = dict(kafka_cluster.client_config())
        producer = Producer(settings)
        producer.produce(app.snapshots.topic, b"other", key=b"not-a-chunk", partition=0)
        assert producer.flush(30) == 0
        before, named_before = live(app), named(app)
        assert chunk_keys(superseded) | chunk_keys(dead) | chunk_keys(young) <= before

        app.coordinator.sweep_interval_s = 3600.0
        app.work(40)
        app.commit(app.persist())  # the first commit with sweeps on starts one
        app.coordinator.wait_for_sweep(60)
        report = app.coordinator.last_sweep
        assert report is not None
        after = live(app)
        # The commit subsumed the oldest checkpoint: garbage collection removed its chunks
        # that no retained one names; the sweep removed the two left-behind ones.
        collected = named_before - named(app)
        assert collected
        assert before - after == chunk_keys(superseded) | chunk_keys(dead) | collected
        assert chunk_keys(young) | {"not-a-chunk"} <= after
        assert (report.swept, report.kept_young) == (3, 1)
        # A second commit within the interval starts none.
        app.coordinator.last_sweep = None
        app.commit(app.persist())
        app.coordinator.wait_for_sweep(60)
        assert app.coordinator.last_sweep is None
        # Every retained checkpoint's chunks are still there: both restore exactly.
        app.close_backends()
        app.assert_restores_exactly(3)
        assert all(isinstance(k, LiveKey) for k in app.snapshots.live_keys())
    finally:
        app.close()
