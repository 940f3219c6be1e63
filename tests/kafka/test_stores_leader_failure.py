"""The snapshot and checkpoint stores on three nodes, the partition leader killed -9.

Replication factor 3 with ``min.insync.replicas=2``: every write acknowledged before,
during and after the outage reads back exactly, from the live store, from a fresh
instance while the node is down, and after it rejoined.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from kafka_changelog.kafka import (
    CheckpointStoreConfig,
    KafkaCheckpointStore,
    KafkaSnapshotStore,
    SnapshotStoreConfig,
)
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.state.snapshots.snapshot import SnapshotHandle

from .test_checkpoint_store import checkpoint

pytestmark = [pytest.mark.broker, pytest.mark.three_nodes]

R = KeyGroupRange.of


def client(cluster: Any) -> tuple[str, dict[str, Any]]:
    settings = dict(cluster.client_config())
    return settings.pop("bootstrap.servers"), settings


def test_snapshots_written_around_a_leader_kill_read_back_exactly(kafka_cluster_3: Any) -> None:
    servers, settings = client(kafka_cluster_3)
    config = SnapshotStoreConfig(
        bootstrap_servers=servers, client_config=settings,
        topic=f"snapshots-{uuid.uuid4().hex[:10]}", partitions=2, max_parallelism=16,
        max_chunk_bytes=1000, replication_factor=3, request_timeout_s=60.0)
    written: list[tuple[SnapshotHandle, dict[int, bytes]]] = []
    victim = None
    with KafkaSnapshotStore(config) as store:
        for materialization in range(1, 13):
            if materialization == 5:
                victim = kafka_cluster_3.leader_of(config.topic, 0)
                kafka_cluster_3.kill_node(victim)
            states = {kg: os.urandom(700 + 300 * (kg % 4)) for kg in range(16)
                      if (kg + materialization) % 3}
            handle = store.write("backend", materialization, R(0, 15), states, {}, 10)
            written.append((handle, states))
        assert victim is not None and kafka_cluster_3.pid(victim) is None
        for handle, states in written:
            assert dict(store.read(handle)) == states, handle.materialization_id
    with KafkaSnapshotStore(config) as fresh:  # new clients, the node still down
        for handle, states in written:
            assert dict(fresh.read(SnapshotHandle.from_bytes(handle.to_bytes()))) == states
    kafka_cluster_3.restart_node(victim)
    with KafkaSnapshotStore(config) as after:
        for handle, states in written:
            assert dict(after.read(handle)) == states


def test_checkpoints_committed_around_a_leader_kill_stay_exact(kafka_cluster_3: Any) -> None:
    servers, settings = client(kafka_cluster_3)
    config = CheckpointStoreConfig(
        bootstrap_servers=servers, client_config=settings,
        topic=f"checkpoints-{uuid.uuid4().hex[:10]}", retain=3, replication_factor=3,
        request_timeout_s=15.0)
    victim = None
    try:
        with KafkaCheckpointStore(config) as store:
            for cid in range(1, 9):
                if cid == 4:
                    victim = kafka_cluster_3.leader_of(config.topic, 0)
                    kafka_cluster_3.kill_node(victim)
                store.commit(checkpoint(cid))
                assert store.latest("app") == checkpoint(cid)
            assert victim is not None and kafka_cluster_3.pid(victim) is None
            retained = store.checkpoint_ids("app")
            assert retained[-3:] == [6, 7, 8]
        for phase in ("node down", "node back"):
            if phase == "node back":
                kafka_cluster_3.restart_node(victim)
                victim = None
            with KafkaCheckpointStore(config) as fresh:
                assert fresh.latest("app") == checkpoint(8), phase
                assert fresh.checkpoint_ids("app") == retained, phase
                for cid in retained:
                    assert fresh.get("app", cid) == checkpoint(cid), (phase, cid)
    finally:
        if victim is not None:
            kafka_cluster_3.restart_node(victim)
