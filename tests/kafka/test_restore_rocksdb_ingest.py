"""Over Kafka, a restore into a fresh RocksDB store (snapshot key groups ingested as SST
files, the changelog tail merged into them) gives exactly the state of the in-memory
restore and of the replay path: every key group's bytes, the entry count, reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog import KeyGroupRange, key_group_for_key
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.state.backend import restore as restore_module
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.descriptors import list_state, map_state, value_state
from kafka_changelog.state.schema.serializers import BYTES, INT64, UTF8
from kafka_changelog.state.schema.ttl import StateTtl
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.tables.memory import StateTable
from kafka_changelog.state.tables.protocol import KeyedStateTable

pytestmark = pytest.mark.broker

MAX_P = 16
ALL = KeyGroupRange.of(0, MAX_P - 1)
VALUE = value_state("value", BYTES)
EXPIRING = value_state("expiring", INT64, ttl=StateTtl(3_600_000))
KINDS = map_state("kinds", UTF8, INT64)
PAGES = list_state("pages", UTF8)


class Stores:
    def __init__(self, cluster: Any) -> None:
        settings = dict(cluster.client_config())
        servers = settings.pop("bootstrap.servers")
        run = uuid.uuid4().hex[:8]
        self.storage = KafkaChangelogStorage(KafkaChangelogConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"ingest-log-{run}",
            partitions=4, max_parallelism=MAX_P))
        self.snapshots = KafkaSnapshotStore(SnapshotStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"ingest-snap-{run}",
            partitions=4, max_parallelism=MAX_P))

    def close(self) -> None:
        self.snapshots.close()
        self.storage.close()


@pytest.fixture
def stores(kafka_cluster: Any) -> Iterator[Stores]:
    found = Stores(kafka_cluster)
    yield found
    found.close()


def _user(i: int) -> bytes:
    return b"user\x00%04d" % i  # a NUL byte: escaped in the map entries' stored keys


def _write(stores: Stores, tail: bool) -> KeyedStateHandle:
    """400 users with every kind of state, materialized; then (``tail``) updates, new
    users, deletions, map removals and list appends in the changelog."""
    backend = ChangelogKeyedStateBackend(stores.storage, stores.snapshots, "op", ALL, MAX_P,
                                         MaterializationConfig(interval_s=None))

    def at(i: int) -> None:
        key = _user(i)
        backend.set_current_key(key, key_group_for_key(key, MAX_P))

    try:
        for i in range(400):
            at(i)
            backend.state(VALUE).update(b"v%d" % i)
            backend.state(EXPIRING).update(i)
            backend.state(KINDS).put("view", i)
            if i % 3:
                backend.state(KINDS).put("buy\x00", 1)
            backend.state(PAGES).update([f"/p/{i}", "/home"])
        backend.materialize_now(timeout=60)
        if tail:
            for i in range(0, 450, 7):  # some users new in the tail
                at(i)
                backend.state(VALUE).update(b"w%d" % i)
                backend.state(KINDS).put("cart", i)
                backend.state(PAGES).add("/tail")
                if i % 2:
                    backend.state(KINDS).remove("view")
                    backend.state(KINDS).remove("buy\x00")  # the map may end empty
                    backend.state(EXPIRING).clear()
                if i % 5 == 0:
                    backend.state(VALUE).clear()
                    backend.state(PAGES).clear()
        return backend.snapshot(1).result(timeout=60)
    finally:
        backend.close()


def _restore(stores: Stores, handle: KeyedStateHandle, table: KeyedStateTable
             ) -> ChangelogKeyedStateBackend:
    return restore_backend(stores.storage, stores.snapshots, "op", ALL, MAX_P, [handle],
                           table=table)


def _state(backend: ChangelogKeyedStateBackend) -> tuple[int, dict[int, bytes]]:
    table = backend.table
    return table.entry_count(), {kg: table.serialize_group(kg) for kg in table.key_groups()}


@pytest.mark.parametrize("tail", [True, False])
def test_an_ingested_restore_gives_exactly_the_replayed_and_the_in_memory_state(
        stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: bool) -> None:
    handle = _write(stores, tail)
    assert handle.snapshot is not None and not handle.snapshot.layered
    memory = _restore(stores, handle, StateTable())
    ingesting = RocksDBStateTable(tmp_path / "merged")
    replays: list[int] = []
    apply_batch = ingesting.apply_batch

    def counted(ops: Any) -> None:
        replays.append(len(ops))
        apply_batch(ops)

    ingesting.apply_batch = counted  # type: ignore[method-assign]
    merged = _restore(stores, handle, ingesting)
    assert replays == []  # the tail went into the ingested files
    monkeypatch.setattr(restore_module, "MERGED_TAIL_BYTES", -1)  # tail replayed after
    replayed = _restore(stores, handle, RocksDBStateTable(tmp_path / "replayed"))
    try:
        expected = _state(memory)
        assert expected[0] > 1000
        assert _state(merged) == expected
        assert _state(replayed) == expected
        assert merged.state_rows() == memory.state_rows()
        for i in (0, 1, 7, 14, 35, 49, 399, 406, 420):
            key = _user(i)
            reads = []
            for backend in (memory, merged, replayed):
                backend.set_current_key(key, key_group_for_key(key, MAX_P))
                reads.append((backend.state(VALUE).value(), backend.state(EXPIRING).value(),
                              dict(backend.state(KINDS).items()),
                              list(backend.state(PAGES).get())))
            assert reads[1] == reads[2] == reads[0]
        assert list(tmp_path.glob("*/restore-*.sst")) == []
    finally:
        for backend in (memory, merged, replayed):
            backend.close()
