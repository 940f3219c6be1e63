"""The model-based checkpoint/restore test against real Kafka, with compaction running.

Changelog, snapshot chunks and checkpoint records all live in a real broker whose
log cleaner runs constantly (tiny segments, dirty ratio ~0, no compaction lag),
while checkpoints are subsumed and garbage-collected (DeleteRecords, tombstones).
Every restore must still be exact.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from tests.state.model_machine import CheckpointMachine, Environment, FailingSnapshots, fresh_totals

pytestmark = pytest.mark.broker

#: Topic settings that keep the log cleaner busy during the test.
FAST_COMPACTION = {
    "segment.ms": "200",
    "segment.bytes": "1048576",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}

CLUSTER: LocalKafkaCluster | None = None


@pytest.fixture(scope="module", autouse=True)
def compacting_cluster() -> Iterator[LocalKafkaCluster]:
    """A broker whose cleaner wakes up every 100 ms."""
    global CLUSTER
    with LocalKafkaCluster(nodes=1, broker_overrides={
        "log.cleaner.backoff.ms": "100",
        "log.retention.check.interval.ms": "200",
        "log.segment.delete.delay.ms": "0",
    }) as cluster:
        CLUSTER = cluster
        yield cluster
        CLUSTER = None


def kafka_environment() -> Environment:
    assert CLUSTER is not None
    settings_ = dict(CLUSTER.client_config())
    servers = settings_.pop("bootstrap.servers")
    run = uuid.uuid4().hex[:8]
    changelog = KafkaChangelogConfig(bootstrap_servers=servers, client_config=settings_,
                                     topic=f"model-log-{run}", partitions=4,
                                     preemptive_persist_threshold_bytes=4096)
    storage = KafkaChangelogStorage(changelog)
    snapshots = KafkaSnapshotStore(SnapshotStoreConfig(
        bootstrap_servers=servers, client_config=settings_, topic=f"model-snap-{run}",
        partitions=4, max_chunk_bytes=512, topic_overrides=FAST_COMPACTION))
    checkpoints = KafkaCheckpointStore(CheckpointStoreConfig(
        bootstrap_servers=servers, client_config=settings_, topic=f"model-cp-{run}",
        retain=2, topic_overrides=FAST_COMPACTION))
    wrapped = FailingSnapshots(snapshots)
    coordinator = CheckpointCoordinator(
        "model-app", checkpoints, wrapped, storage)  # type: ignore[arg-type]

    def close() -> None:
        storage.close()
        snapshots.close()
        checkpoints.close()

    return Environment(coordinator, wrapped, close)


class KafkaMachine(CheckpointMachine):
    totals: ClassVar[dict[str, int]] = fresh_totals()
    make_environment = staticmethod(kafka_environment)


#: Enough steps that restores, garbage collection and materializations all happen.
SETTINGS = settings(
    max_examples=4, stateful_step_count=30, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])


def test_the_machine_keeps_the_model_through_restores_gc_and_materialization() -> None:
    """The machine's runs keep state equal to the model (its invariants), and they did
    exercise restores, garbage collection and materialization (counted on this run)."""
    KafkaMachine.totals = fresh_totals()
    run_state_machine_as_test(KafkaMachine, settings=SETTINGS)
    totals = KafkaMachine.totals
    assert totals["restores"] > 0, totals
    assert totals["discarded"] > 0, totals
    assert totals["deleted_chunks"] > 0, totals
    assert totals["materializations"] > 0, totals
