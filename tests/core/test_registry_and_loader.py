"""Ownership registry, preemptive persistence and the storage loader."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kafka_changelog import (
    InMemoryChangelogStorage,
    KeyGroupRange,
    SequenceNumber,
    UnknownStorageError,
    available_storages,
    load_storage,
)
from kafka_changelog.errors import HandleFormatError
from kafka_changelog.handle import ChangelogHandle
from kafka_changelog.kafka.handle import KafkaChangelogHandle, PartitionRange
from kafka_changelog.memory.handle import InMemoryChangelogHandle
from kafka_changelog.registry import WRITER_HOLD, ChangelogRegistry, RegistryEntry
from kafka_changelog.serialization import encode


def test_loader_finds_memory_and_names_the_alternatives() -> None:
    assert "memory" in available_storages()
    storage = load_storage("memory")
    assert isinstance(storage, InMemoryChangelogStorage)
    with pytest.raises(UnknownStorageError) as caught:
        load_storage("s3")
    assert caught.value.name == "s3"
    assert "memory" in caught.value.available
    assert "'s3'" in str(caught.value) and "memory" in str(caught.value)


def test_registry_discards_when_the_last_holder_leaves() -> None:
    discarded: list[RegistryEntry[str]] = []
    registry: ChangelogRegistry[str] = ChangelogRegistry(discarded.append)
    registry.register("log", SequenceNumber(0), "loc0")
    registry.register("log", SequenceNumber(1), "loc1")
    registry.add_hold("log", SequenceNumber(0), SequenceNumber(1), "checkpoint:1")
    registry.release("log", None, None, WRITER_HOLD)
    assert [e.location for e in discarded] == ["loc1"]
    registry.release_everywhere("checkpoint:1")
    assert [e.location for e in discarded] == ["loc1", "loc0"]
    assert registry.live_entries() == []


def test_preemptive_persistence_hands_changes_over_before_persist() -> None:
    storage = InMemoryChangelogStorage(preemptive_persist_threshold_bytes=100)
    with storage.create_writer("op", KeyGroupRange.of(0, 0)) as writer:
        for _ in range(9):
            writer.append(0, b"x" * 10)
        assert writer.unpersisted_bytes == 90
        assert storage.registry.live_entries() == []
        writer.append(0, b"x" * 10)
        # The threshold was reached: the change set went to the storage on its own.
        assert writer.unpersisted_bytes == 0
        assert len(storage.registry.live_entries()) == 1
        writer.append(0, b"tail")
        result = writer.persist(writer.initial_sequence_number(), 1).result()
        assert result.job_owned is not None
        assert [c.payload for c in storage.reader().read(result.job_owned)] == \
            [b"x" * 10] * 10 + [b"tail"]


def test_preemptive_persistence_during_a_bulk_append() -> None:
    # A bulk append far above the threshold hands change sets over as it goes: what stays
    # in memory is less than the threshold plus one slice of the bulk.
    storage = InMemoryChangelogStorage(preemptive_persist_threshold_bytes=10_000)
    with storage.create_writer("op", KeyGroupRange.of(0, 1)) as writer:
        payloads = [i.to_bytes(4, "big") * 5 for i in range(20_000)]  # 400 kB
        writer.append_all([i % 2 for i in range(20_000)], payloads)
        assert writer.unpersisted_bytes < 10_000 + 4096 * 20
        assert len(storage.registry.live_entries()) >= 4
        result = writer.persist(writer.initial_sequence_number(), 1).result()
        assert result.job_owned is not None
        assert [c.payload for c in storage.reader().read(result.job_owned)] == payloads



def test_a_fresh_process_reads_the_librarys_handles_without_scanning_distributions() -> None:
    """Nothing of the storages imported beforehand (a materialization process, the CLI):
    the library's own handle kinds are found by module, with no scan of every installed
    distribution's entry points."""
    script = (
        "import sys, importlib.metadata\n"
        "from kafka_changelog.handle import ChangelogHandle\n"
        "assert 'kafka_changelog.kafka.handle' not in sys.modules\n"
        "importlib.metadata.entry_points = None  # a scan would fail\n"
        "for data in sys.argv[1:]:\n"
        "    handle = ChangelogHandle.from_bytes(bytes.fromhex(data))\n"
        "    print(type(handle).__name__, handle.log_id)\n")
    kafka_handle = KafkaChangelogHandle(
        "log-1", "orders-changelog", KeyGroupRange(0, 7),
        [PartitionRange(2, 10, 25, KeyGroupRange(0, 7), 1500)], 3, 9)
    memory_handle = InMemoryChangelogHandle("log-2", KeyGroupRange(0, 3), [])
    done = subprocess.run(
        [sys.executable, "-c", script, kafka_handle.to_bytes().hex(),
         memory_handle.to_bytes().hex()], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["KafkaChangelogHandle log-1",
                                        "InMemoryChangelogHandle log-2"]


def test_a_handle_of_an_unknown_kind_names_the_known_ones() -> None:
    data = encode("handle_envelope", {"magic": "kafka-changelog-handle", "format_version": 1,
                                      "kind": "s3", "body": b""})
    with pytest.raises(HandleFormatError) as caught:
        ChangelogHandle.from_bytes(data)
    assert "unknown handle kind 's3'" in str(caught.value)
    assert "'kafka'" in str(caught.value) and "'memory'" in str(caught.value)
