"""Sequence numbers, state changes, key-group ranges and key-group assignment."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_changelog import (
    MAX_SEQUENCE_NUMBER,
    KeyGroupRange,
    SequenceNumber,
    SequenceNumberOverflowError,
    StateChange,
    key_group_for_key,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from kafka_changelog.keygroups import key_groups_for_keys
from kafka_changelog.murmur3 import spark_hash_bytes, spark_hash_int


class TestSequenceNumber:
    def test_ordering_and_next(self) -> None:
        first = SequenceNumber.initial()
        assert first.value == 0
        assert first < first.next() < first.next().next()
        assert first.next() == SequenceNumber(1)
        assert len({SequenceNumber(3), SequenceNumber(3), SequenceNumber(4)}) == 2

    def test_immutable(self) -> None:
        sqn = SequenceNumber(5)
        with pytest.raises(AttributeError):
            sqn.value = 6  # type: ignore[misc]

    def test_fails_past_the_maximum(self) -> None:
        last = SequenceNumber(MAX_SEQUENCE_NUMBER)
        with pytest.raises(SequenceNumberOverflowError, match="maximum"):
            last.next()
        with pytest.raises(ValueError, match="outside"):
            SequenceNumber(MAX_SEQUENCE_NUMBER + 1)
        with pytest.raises(ValueError):
            SequenceNumber(-1)
        with pytest.raises(TypeError):
            SequenceNumber(True)


class TestStateChange:
    def test_meta_and_keyed(self) -> None:
        assert StateChange.meta(b"m").is_meta
        assert not StateChange(0, b"x").is_meta
        with pytest.raises(ValueError, match="key group must be >= 0"):
            StateChange(-2, b"x")
        with pytest.raises(TypeError, match="payload must be bytes"):
            StateChange(1, "text")  # type: ignore[arg-type]


class TestChangeSet:
    def test_size_is_the_payload_bytes_counted_once(self) -> None:
        from kafka_changelog.change_set import ChangeSet
        from kafka_changelog.memory import InMemoryChangelogStorage

        changes = (StateChange(0, b"abc"), StateChange.meta(b"de"), StateChange(3, b""))
        counted = ChangeSet.of(SequenceNumber(1), changes)
        assert counted.size_bytes == 5
        assert counted == ChangeSet(SequenceNumber(1), [0, -1, 3], [b"abc", b"de", b""], 5)
        assert counted.restricted_to(KeyGroupRange.of(1, 3)).size_bytes == 2
        # What a writer hands over: its count of the bytes as appended.
        storage = InMemoryChangelogStorage()
        writer = storage.create_writer("op", KeyGroupRange.of(0, 7))
        writer.append(0, b"abc")
        writer.append(5, b"0123456789")
        assert writer.unpersisted_bytes == 13
        handle = writer.persist(writer.initial_sequence_number(), 1).result().job_owned
        assert handle is not None
        assert handle.state_size == 13 and writer.unpersisted_bytes == 0
        writer.close()
        storage.close()


class TestKeyGroupRange:
    def test_basics(self) -> None:
        kgr = KeyGroupRange.of(3, 6)
        assert list(kgr) == [3, 4, 5, 6]
        assert len(kgr) == 4
        assert 3 in kgr and 6 in kgr and 7 not in kgr and 2 not in kgr
        assert str(kgr) == "[3, 6]"

    def test_empty(self) -> None:
        empty = KeyGroupRange.empty()
        assert empty.is_empty and len(empty) == 0 and list(empty) == []
        assert 0 not in empty
        assert KeyGroupRange.of(5, 4).is_empty
        with pytest.raises(ValueError, match="below start"):
            KeyGroupRange.of(5, 3)
        with pytest.raises(ValueError, match=">= 0"):
            KeyGroupRange.of(-1, 3)

    @given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50), st.integers(0, 50))
    def test_intersection_is_set_intersection(self, a: int, b: int, c: int, d: int) -> None:
        left = KeyGroupRange.of(min(a, b), max(a, b))
        right = KeyGroupRange.of(min(c, d), max(c, d))
        assert set(left.intersection(right)) == set(left) & set(right)


class TestKeyGroupAssignment:
    def test_flink_ranges(self) -> None:
        assert [key_group_range_for_operator(128, 3, i) for i in range(3)] == [
            KeyGroupRange.of(0, 42), KeyGroupRange.of(43, 85), KeyGroupRange.of(86, 127)]
        assert key_group_range_for_operator(128, 1, 0) == KeyGroupRange.of(0, 127)

    @given(st.integers(1, 4096).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
    def test_ranges_partition_all_key_groups(self, params: tuple[int, int]) -> None:
        max_p, p = params
        ranges = [key_group_range_for_operator(max_p, p, i) for i in range(p)]
        assert ranges[0].start == 0 and ranges[-1].end == max_p - 1
        for before, after in itertools.pairwise(ranges):
            assert after.start == before.end + 1
        assert max(len(r) for r in ranges) - min(len(r) for r in ranges) <= 1
        for i, kgr in enumerate(ranges):
            for kg in (kgr.start, kgr.end):
                assert operator_index_for_key_group(max_p, p, kg) == i

    def test_bad_parameters_are_named(self) -> None:
        with pytest.raises(ValueError, match="max parallelism must be in"):
            key_group_range_for_operator(0, 1, 0)
        with pytest.raises(ValueError, match="parallelism must be in"):
            key_group_range_for_operator(8, 9, 0)
        with pytest.raises(ValueError, match="operator index must be in"):
            key_group_range_for_operator(8, 2, 2)
        with pytest.raises(ValueError, match="key group must be in"):
            operator_index_for_key_group(8, 2, 8)

    def test_spark_hash_vectors(self) -> None:
        # Values printed by Spark 4 SQL `hash(...)` on this project's machine.
        assert spark_hash_bytes(b"") == 142593372
        assert spark_hash_bytes(b"a") == 1485273170
        assert spark_hash_bytes(b"abcd") == -396302900
        assert spark_hash_bytes(b"hello world") == -1528836094
        assert spark_hash_bytes(b"Spark") == 228093765
        assert spark_hash_bytes(bytes.fromhex("FF80")) == -577813652
        assert spark_hash_bytes(bytes.fromhex("0102030405FE")) == -476376593

    def test_spark_int_hash_vectors(self) -> None:
        # Values printed by Spark 4 SQL `hash(cast(x as int))`.
        assert [spark_hash_int(i) for i in (0, 1, 2, -1, 123456)] == [
            933211791, -559580957, 1765031574, -1604776387, 1905992991]

    @given(st.binary(max_size=40), st.integers(1, 1 << 15))
    def test_key_group_in_range_and_stable(self, key: bytes, max_p: int) -> None:
        kg = key_group_for_key(key, max_p)
        assert 0 <= kg < max_p
        assert kg == spark_hash_bytes(key) % max_p

    @given(st.lists(st.binary(max_size=23), max_size=40), st.integers(1, 1 << 15),
           st.integers(0, 3))
    def test_key_groups_of_many_keys_are_each_keys(self, keys: list[bytes], max_p: int,
                                                   skip: int) -> None:
        # As an Arrow binary array lays them out, sliced (offsets not from 0).
        array = pa.array([b"x" * 5] * skip + keys, pa.binary()).slice(skip)
        offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)
        data = np.frombuffer(array.buffers()[2], np.uint8)
        assert key_groups_for_keys(offsets, data, max_p).tolist() == [
            key_group_for_key(key, max_p) for key in keys]
