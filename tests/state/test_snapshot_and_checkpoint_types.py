"""Snapshot handles, checkpoints, chunking and the in-memory stores (no broker)."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_changelog.change import StateChange
from kafka_changelog.change_set import ChangeSet
from kafka_changelog.errors import ChangelogError, HandleFormatError
from kafka_changelog.kafka.handle import KafkaChangelogHandle, PartitionRange
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.memory.handle import InMemoryChangelogHandle
from kafka_changelog.sequence import SequenceNumber
from kafka_changelog.serialization import encode
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    OperatorStateHandle,
    SubtaskState,
    _subtask_record,
)
from kafka_changelog.state.checkpoints.checkpoint_store import (
    InMemoryCheckpointStore,
    checkpoint_key,
    latest_key,
)
from kafka_changelog.state.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CheckpointOrderError,
    CheckpointStoreError,
    SnapshotCorruptError,
    SnapshotMissingError,
)
from kafka_changelog.state.snapshots.snapshot import ChunkRef, SnapshotHandle, chunk_key
from kafka_changelog.state.snapshots.snapshot_store import (
    InMemorySnapshotStore,
    StoredRecord,
    split_chunks,
)

R = KeyGroupRange.of


def chunk(kg: int, no: int = 0, count: int = 1, mid: int = 1, offset: int = 0,
          size: int = 3) -> ChunkRef:
    return ChunkRef(kg, mid, no, count, partition=kg // 8, offset=offset, size=size, crc32=7)


ALL = R(0, 15)


def handle(chunks: tuple[ChunkRef, ...], key_groups: KeyGroupRange = ALL) -> SnapshotHandle:
    return SnapshotHandle("backend-a", 5, key_groups, "snapshots", chunks, 42)


# -- ChunkRef / SnapshotHandle -----------------------------------------------------------------


class TestSnapshotHandle:
    def test_chunks_are_sorted_and_indexed(self) -> None:
        h = handle((chunk(3, 1, 2), chunk(1), chunk(3, 0, 2)))
        assert [(c.key_group, c.chunk_no) for c in h.chunks] == [(1, 0), (3, 0), (3, 1)]
        assert h.key_groups == (1, 3)
        assert [c.chunk_no for c in h.chunks_of(3)] == [0, 1]
        assert h.chunks_of(2) == ()
        assert h.state_size == 9

    def test_intersection_keeps_overlapping_key_groups(self) -> None:
        h = handle((chunk(1), chunk(3, 0, 2), chunk(3, 1, 2), chunk(9)))
        narrowed = h.intersection(R(2, 8))
        assert narrowed is not None
        assert narrowed.key_group_range == R(2, 8)
        assert narrowed.key_groups == (3,)
        assert (narrowed.backend_id, narrowed.materialization_id, narrowed.topic,
                narrowed.materialized_sequence_number) == ("backend-a", 5, "snapshots", 42)
        assert h.intersection(R(0, 100)) == h
        assert h.intersection(R(16, 20)) is None
        empty = h.intersection(R(10, 12))
        assert empty is not None and empty.chunks == ()

    def test_rejects_incomplete_or_foreign_chunks(self) -> None:
        with pytest.raises(ValueError, match="not one complete set"):
            handle((chunk(3, 0, 2),))
        with pytest.raises(ValueError, match="not one complete set"):
            handle((chunk(3, 0, 2), chunk(3, 1, 2, mid=2)))
        with pytest.raises(ValueError, match="outside the handle's key-group range"):
            handle((chunk(20),))
        with pytest.raises(ValueError, match="chunk number 2"):
            chunk(1, 2, 2)
        with pytest.raises(ValueError, match="crc32"):
            ChunkRef(1, 1, 0, 1, 0, 0, 0, 1 << 32)

    def test_round_trip(self) -> None:
        h = handle((chunk(1, offset=10), chunk(3, 0, 2, mid=4), chunk(3, 1, 2, mid=4)))
        again = SnapshotHandle.from_bytes(h.to_bytes())
        assert again == h
        assert again.chunks_of(3) == h.chunks_of(3)

    @pytest.mark.parametrize("garbage", [b"", b"\x00\x01garbage", b"x" * 100])
    def test_garbage_is_refused(self, garbage: bytes) -> None:
        with pytest.raises(HandleFormatError, match="snapshot handle"):
            SnapshotHandle.from_bytes(garbage)

    def test_wrong_magic_and_newer_version(self) -> None:
        record = {
            "magic": "something-else", "format_version": 1, "backend_id": "b",
            "materialization_id": 1, "key_group_start": 0, "key_group_end": 1, "topic": "t",
            "materialized_sequence_number": 0, "chunks": [],
        }
        with pytest.raises(HandleFormatError, match="magic"):
            SnapshotHandle.from_bytes(encode("snapshot_handle", record))
        record.update(magic="kafka-changelog-snapshot", format_version=99)
        with pytest.raises(HandleFormatError, match="version 99"):
            SnapshotHandle.from_bytes(encode("snapshot_handle", record))

    def test_chunk_key(self) -> None:
        assert chunk_key("op-1", 7, 123, 2) == "op-1/7/123/2"
        assert chunk(7, mid=123).record_key("op-1") == "op-1/7/123/0"


# -- chunking ------------------------------------------------------------------------------------


class TestChunking:
    def test_split(self) -> None:
        assert split_chunks(b"", 4) == [b""]
        assert split_chunks(b"abcd", 4) == [b"abcd"]
        assert split_chunks(b"abcdefghij", 4) == [b"abcd", b"efgh", b"ij"]

    @settings(max_examples=50, deadline=None)
    @given(st.dictionaries(st.integers(0, 15), st.binary(max_size=40), max_size=8),
           st.integers(1, 9))
    def test_write_read_round_trip(self, states: dict[int, bytes], max_chunk: int) -> None:
        store = InMemorySnapshotStore(max_chunk_bytes=max_chunk, partitions=4, max_parallelism=16)
        h = store.write("b", 1, R(0, 15), states, {}, 10)
        assert dict(store.read(h)) == states
        for kg, data in states.items():
            refs = h.chunks_of(kg)
            assert len(refs) == max(1, -(-len(data) // max_chunk))
            assert all(r.size <= max_chunk for r in refs)
            assert {r.partition for r in refs} == {kg * 4 // 16}
        assert [kg for kg, _ in store.read(h)] == sorted(states)


# -- in-memory snapshot store ----------------------------------------------------------------------


class TestInMemorySnapshotStore:
    def test_write_read_exact_with_empty_groups(self) -> None:
        store = InMemorySnapshotStore(max_chunk_bytes=5)
        states = {2: b"0123456789ab", 3: b"", 7: b"x"}
        h = store.write("b", 1, R(0, 7), states, {}, 99)
        assert h.materialized_sequence_number == 99
        assert h.chunks_of(5) == ()
        assert list(store.read(h)) == [(2, b"0123456789ab"), (3, b""), (7, b"x")]
        assert list(store.read(h, R(3, 10))) == [(3, b""), (7, b"x")]
        assert list(store.read(h, R(20, 30))) == []
        refs = h.chunks_of(2)
        assert [r.size for r in refs] == [5, 5, 2]
        assert refs[0].crc32 == zlib.crc32(b"01234")

    def test_reuse_across_materializations(self) -> None:
        store = InMemorySnapshotStore(max_chunk_bytes=4)
        first = store.write("b", 1, R(0, 3), {0: b"aaaaaa", 1: b"bb"}, {}, 5)
        second = store.write("b", 2, R(0, 3), {1: b"BBBBBBBBB"}, {0: first.chunks_of(0)}, 9)
        assert second.chunks_of(0) == first.chunks_of(0)
        assert {c.materialization_id for c in second.chunks_of(1)} == {2}
        assert dict(store.read(second)) == {0: b"aaaaaa", 1: b"BBBBBBBBB"}
        assert dict(store.read(first)) == {0: b"aaaaaa", 1: b"bb"}  # old handle still exact

    def test_write_validation(self) -> None:
        store = InMemorySnapshotStore()
        with pytest.raises(ValueError, match="outside the written key-group range"):
            store.write("b", 1, R(0, 3), {4: b"x"}, {}, 0)
        prior = store.write("b", 1, R(0, 3), {1: b"x"}, {}, 0)
        with pytest.raises(ValueError, match="both written and reused"):
            store.write("b", 2, R(0, 3), {1: b"y"}, {1: prior.chunks_of(1)}, 0)
        with pytest.raises(ValueError, match="belong to key group 1"):
            store.write("b", 2, R(0, 3), {}, {2: prior.chunks_of(1)}, 0)
        with pytest.raises(ValueError, match="expected an earlier one"):
            store.write("b", 1, R(0, 3), {}, {1: prior.chunks_of(1)}, 0)

    def test_deleted_chunk_is_missing(self) -> None:
        store = InMemorySnapshotStore(max_chunk_bytes=2)
        h = store.write("b", 3, R(0, 7), {4: b"abcde", 5: b"z"}, {}, 0)
        store.delete(h.chunks_of(4)[1:2], "b")
        assert list(store.read(h, R(5, 5))) == [(5, b"z")]
        with pytest.raises(SnapshotMissingError) as info:
            list(store.read(h))
        error = info.value
        assert (error.key_group, error.chunk_no, error.materialization_id, error.backend_id) == (
            4, 1, 3, "b")
        assert error.offset == h.chunks_of(4)[1].offset
        assert "key group 4" in str(error) and "deleted" in str(error)
        store.delete(h.chunks_of(4), "b")  # deleting again is harmless

    def test_other_key_or_tombstone_at_offset_is_missing(self) -> None:
        store = InMemorySnapshotStore()
        h = store.write("b", 1, R(0, 3), {1: b"x"}, {}, 0)
        ref = h.chunks_of(1)[0]
        store.put_record(ref.partition, ref.offset, StoredRecord(b"other/1/1/0", b"v", []))
        with pytest.raises(SnapshotMissingError, match="key 'other/1/1/0'"):
            list(store.read(h))
        store.put_record(ref.partition, ref.offset, StoredRecord(b"b/1/1/0", None, []))
        with pytest.raises(SnapshotMissingError, match="tombstone"):
            list(store.read(h))

    def test_corrupt_chunk(self) -> None:
        store = InMemorySnapshotStore()
        h = store.write("b", 1, R(0, 3), {1: b"good"}, {}, 0)
        ref = h.chunks_of(1)[0]
        original = store.record_at(ref.partition, ref.offset)
        assert original is not None and original.value is not None
        bad = original.value.replace(b"good", b"evil")
        store.put_record(ref.partition, ref.offset, original._replace(value=bad))
        with pytest.raises(SnapshotCorruptError, match="CRC-32") as info:
            list(store.read(h))
        assert info.value.expected == f"{zlib.crc32(b'good'):#010x}"
        assert info.value.found == f"{zlib.crc32(b'evil'):#010x}"
        store.put_record(ref.partition, ref.offset, original._replace(value=b"\xff"))
        with pytest.raises(SnapshotCorruptError, match="undecodable"):
            list(store.read(h))
        lying = replace(h, chunks=(replace(ref, size=9),))
        store.put_record(ref.partition, ref.offset, original)
        with pytest.raises(SnapshotCorruptError, match="data size expected 9, found 4"):
            list(store.read(lying))

    def test_errors_are_changelog_errors(self) -> None:
        assert issubclass(SnapshotMissingError, ChangelogError)
        assert issubclass(SnapshotCorruptError, ChangelogError)
        assert issubclass(CheckpointStoreError, ChangelogError)


# -- checkpoint types ----------------------------------------------------------------------------


def memory_changelog(kgs: range) -> InMemoryChangelogHandle:
    changes = (*(StateChange(kg, bytes([kg])) for kg in kgs), StateChange.meta(b"m"))
    return InMemoryChangelogHandle("log-1", R(kgs.start, kgs.stop - 1),
                                   [ChangeSet.of(SequenceNumber(3), changes)], checkpoint_id=7)


FIRST_HALF = R(0, 7)


def keyed(kgs: KeyGroupRange = FIRST_HALF) -> KeyedStateHandle:
    snapshot = SnapshotHandle("be", 4, kgs, "snaps",
                              (chunk(kgs.start + 1), chunk(kgs.start + 6, offset=3)), 11)
    kafka = KafkaChangelogHandle("log-1", "changelog", kgs,
                                 [PartitionRange(0, 5, 9, kgs, 100)], 11, 20, 0, 7)
    return KeyedStateHandle("be", kgs, 4, snapshot,
                            (memory_changelog(range(kgs.start, kgs.end + 1)), kafka))


def checkpoint(cid: int, application: str = "app") -> CompletedCheckpoint:
    operator = OperatorStateHandle("src", 0, {"offsets": (b"1", b"2")}, {"u": (b"x",)})
    return CompletedCheckpoint(application, cid, 1_700_000_000_000 + cid, 16, (
        SubtaskState("agg", 0, 2, keyed(R(0, 7)), None),
        SubtaskState("agg", 1, 2, keyed(R(8, 15)), None),
        SubtaskState("src", 0, 1, None, operator),
    ))


class TestCheckpointTypes:
    def test_keyed_intersection(self) -> None:
        h = keyed()
        narrowed = h.intersection(R(4, 20))
        assert narrowed is not None
        assert narrowed.key_group_range == R(4, 7)
        assert narrowed.snapshot is not None and narrowed.snapshot.key_groups == (6,)
        assert [c.key_group_range for c in narrowed.changelog] == [R(4, 7), R(4, 7)]
        assert h.intersection(R(0, 7)) is h
        assert h.intersection(R(8, 9)) is None

    def test_keyed_intersection_drops_parts_without_overlap(self) -> None:
        h = KeyedStateHandle("be", R(0, 7), 4, None, (memory_changelog(range(0, 4)),))
        narrowed = h.intersection(R(5, 7))
        assert narrowed is not None and narrowed.changelog == () and narrowed.snapshot is None

    def test_round_trip(self) -> None:
        c = checkpoint(12)
        again = CompletedCheckpoint.from_bytes(c.to_bytes())
        assert again == c
        assert again.operators() == ["agg", "src"]
        assert [s.subtask_index for s in again.subtasks_of("agg")] == [0, 1]
        assert again.subtasks_of("nope") == []
        agg = again.subtasks_of("agg")[1].keyed
        assert agg is not None and isinstance(agg.changelog[1], KafkaChangelogHandle)

    def test_the_entry_count_round_trips_and_a_narrowed_handle_has_none(self) -> None:
        counted = replace(keyed(), entry_count=1234)
        c = CompletedCheckpoint("app", 3, 1, 16, (SubtaskState("agg", 0, 2, counted, None),))
        again = CompletedCheckpoint.from_bytes(c.to_bytes())
        assert again == c
        assert again.subtasks[0].keyed is not None
        assert again.subtasks[0].keyed.entry_count == 1234
        assert SubtaskState.from_bytes(c.subtasks[0].to_bytes()) == c.subtasks[0]
        assert counted.intersection(R(0, 7)) is counted
        narrowed = counted.intersection(R(4, 7))
        assert narrowed is not None and narrowed.entry_count is None

    @pytest.mark.parametrize("version", [1, 2])
    def test_checkpoints_of_older_formats_are_read_without_a_count(self, version: int) -> None:
        """Format 1 (0.1: no log floors, no properties) and 2 (0.2: no entry counts)."""
        c = checkpoint(5)
        record = {
            "magic": "kafka-changelog-checkpoint", "format_version": version,
            "application": c.application, "checkpoint_id": c.checkpoint_id,
            "timestamp_ms": c.timestamp_ms, "max_parallelism": c.max_parallelism,
            "subtasks": [_subtask_record(s) for s in c.subtasks],
            "log_floors": [], "properties": {"k": "v"}}
        for subtask in record["subtasks"]:
            if subtask["keyed"] is not None:
                del subtask["keyed"]["entry_count"]
        if version == 1:
            del record["log_floors"], record["properties"]
        again = CompletedCheckpoint.from_bytes(encode(f"checkpoint_v{version}", record))
        assert again == replace(
            c, properties={} if version == 1 else {"k": "v"})
        assert all(s.keyed is None or s.keyed.entry_count is None for s in again.subtasks)

    def test_garbage_is_refused(self) -> None:
        with pytest.raises(CheckpointFormatError, match="not a serialised checkpoint"):
            CompletedCheckpoint.from_bytes(b"\x01\x02nonsense")

    def test_a_newer_format_is_refused_naming_the_versions_read(self) -> None:
        data = CompletedCheckpoint("app", 1, 1, 16, ()).to_bytes()
        newer = data.replace(b"\x06", b"\x08", 1)  # format version 3 -> 4 (zig-zag)
        with pytest.raises(CheckpointFormatError, match="format version 4 is not readable "
                                                        r"by this library \(reads 1 to 3\)"):
            CompletedCheckpoint.from_bytes(newer)

    def test_validation(self) -> None:
        with pytest.raises(ValueError, match="outside"):
            SubtaskState("a", 2, 2, None, None)
        with pytest.raises(ValueError, match="twice"):
            CompletedCheckpoint("app", 1, 0, 16, (SubtaskState("a", 0, 1, None, None),) * 2)
        with pytest.raises(ValueError, match="parallelism 2 and 3"):
            CompletedCheckpoint("app", 1, 0, 16, (SubtaskState("a", 0, 2, None, None),
                                                  SubtaskState("a", 1, 3, None, None)))


# -- in-memory checkpoint store ------------------------------------------------------------------


class TestInMemoryCheckpointStore:
    def test_retain_minimum(self) -> None:
        with pytest.raises(ValueError, match="at least 2"):
            InMemoryCheckpointStore(retain=1)

    def test_commit_latest_get_retention_discard(self) -> None:
        store = InMemoryCheckpointStore(retain=2)
        assert store.latest("app") is None
        assert store.commit(checkpoint(1)) == []
        assert store.commit(checkpoint(2)) == []
        subsumed = store.commit(checkpoint(5))
        assert [c.checkpoint_id for c in subsumed] == [1]
        # Still readable until discarded, and reported again by the next commit.
        assert store.checkpoint_ids("app") == [1, 2, 5]
        assert [c.checkpoint_id for c in store.commit(checkpoint(6))] == [1, 2]
        store.discard("app", 1)
        store.discard("app", 1)  # idempotent
        assert store.checkpoint_ids("app") == [2, 5, 6]
        latest = store.latest("app")
        assert latest is not None and latest.checkpoint_id == 6
        assert store.get("app", 5) == checkpoint(5)
        with pytest.raises(CheckpointNotFoundError, match=r"'app' has no checkpoint 1;.*2, 5, 6"):
            store.get("app", 1)
        with pytest.raises(CheckpointStoreError, match="it is the latest"):
            store.discard("app", 6)

    def test_refuses_non_increasing_id(self) -> None:
        store = InMemoryCheckpointStore()
        store.commit(checkpoint(4))
        for cid in (4, 3):
            with pytest.raises(CheckpointOrderError, match=f"checkpoint {cid} .* latest .* 4"):
                store.commit(checkpoint(cid))

    def test_applications_are_independent(self) -> None:
        store = InMemoryCheckpointStore()
        store.commit(checkpoint(9, "one"))
        store.commit(checkpoint(1, "two"))
        assert store.applications() == ["one", "two"]
        assert store.checkpoint_ids("one") == [9]
        assert store.checkpoint_ids("two") == [1]

    def test_keys(self) -> None:
        assert checkpoint_key("app/x", 12) == "app/x/checkpoint/00000000000000000012"
        assert latest_key("app/x") == "app/x/latest"
