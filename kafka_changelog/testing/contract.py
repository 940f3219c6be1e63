"""The contract every changelog storage must pass.

Subclass :class:`ChangelogStorageContract` in a test module, provide a
``storage`` fixture, and (for remote storages) override :meth:`read` to pass the
read context. The in-memory storage is the reference; the Kafka storage runs the
same tests against a real broker.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from ..change import StateChange
from ..errors import (
    HandleFormatError,
    KeyGroupOutOfRangeError,
    WriterClosedError,
)
from ..handle import ChangelogHandle
from ..keygroups import KeyGroupRange
from ..registry import WRITER_HOLD, checkpoint_hold
from ..sequence import SequenceNumber, SequenceNumberOutOfRangeError
from ..storage import StateChangelogStorage
from ..writer import StateChangelogWriter

#: How long a contract test waits for a persist.
PERSIST_TIMEOUT_S = 60.0


def _random_bytes(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size)


class ChangelogStorageContract:
    """Storage-independent semantics of writers and handles (the seed's tests and more)."""

    @pytest.fixture
    def storage(self) -> Iterator[StateChangelogStorage[Any]]:
        raise NotImplementedError("a contract subclass must provide the storage fixture")

    @pytest.fixture(autouse=True)
    def _remember_storage(self, storage: StateChangelogStorage[Any]) -> None:
        self._storage = storage

    # -- hooks ---------------------------------------------------------------------

    def read(self, handle: ChangelogHandle) -> list[StateChange]:
        """All changes of ``handle`` in order, through the storage's reader."""
        with self._storage.reader() as reader:
            return list(reader.read(handle))

    def persist(
        self, writer: StateChangelogWriter[Any], from_sqn: SequenceNumber, checkpoint_id: int = 1
    ) -> ChangelogHandle:
        result = writer.persist(from_sqn, checkpoint_id).result(timeout=PERSIST_TIMEOUT_S)
        assert isinstance(result.job_owned, ChangelogHandle)
        return result.job_owned

    def by_key_group(self, changes: list[StateChange]) -> dict[int, list[bytes]]:
        grouped: dict[int, list[bytes]] = {}
        for change in changes:
            grouped.setdefault(change.key_group, []).append(change.payload)
        return grouped

    # -- the seed's tests ----------------------------------------------------------

    def test_write_and_read(self, storage: StateChangelogStorage[Any]) -> None:
        rng = random.Random(7)
        key_groups = KeyGroupRange.of(0, 5)
        appends = {kg: [_random_bytes(rng, 10) for _ in range(20)] for kg in key_groups}
        with storage.create_writer("op-write-read", key_groups) as writer:
            start = writer.initial_sequence_number()
            for kg, payloads in appends.items():
                for payload in payloads:
                    writer.append(kg, payload)
            handle = self.persist(writer, start)
        assert self.by_key_group(self.read(handle)) == appends
        assert handle.key_group_range == key_groups

    def test_no_append_after_close(self, storage: StateChangelogStorage[Any]) -> None:
        writer = storage.create_writer("op-closed", KeyGroupRange.of(0, 0))
        writer.close()
        assert writer.closed
        with pytest.raises(WriterClosedError, match=rf"cannot append: .*{writer.log_id}.*closed"):
            writer.append(0, b"x")
        with pytest.raises(WriterClosedError):
            writer.append_meta(b"x")
        with pytest.raises(WriterClosedError, match="cannot persist"):
            writer.persist(writer.initial_sequence_number(), 1)
        writer.close()  # closing twice is allowed

    def test_key_group_out_of_range(self, storage: StateChangelogStorage[Any]) -> None:
        with storage.create_writer("op-range", KeyGroupRange.of(4, 7)) as writer:
            for bad in (3, 8, 1000):
                with pytest.raises(KeyGroupOutOfRangeError) as caught:
                    writer.append(bad, b"x")
                assert caught.value.key_group == bad
                assert caught.value.key_group_range == KeyGroupRange.of(4, 7)
                assert f"key group {bad} is outside" in str(caught.value)
                assert "[4, 7]" in str(caught.value)
            writer.append(4, b"ok")
            writer.append(7, b"ok")

    def test_append_all_keeps_order_with_single_appends(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        rng = random.Random(11)
        # More than one of the writer's slices, with single appends between bulk ones.
        bulk = [(rng.randrange(0, 4), _random_bytes(rng, rng.randrange(0, 30)))
                for _ in range(9_000)]
        with storage.create_writer("op-append-all", KeyGroupRange.of(0, 3)) as writer:
            start = writer.initial_sequence_number()
            writer.append(2, b"first")
            writer.append_all([kg for kg, _ in bulk[:5_000]], [p for _, p in bulk[:5_000]])
            writer.append(1, b"between")
            writer.append_all([kg for kg, _ in bulk[5_000:]], [p for _, p in bulk[5_000:]])
            writer.append_all([], [])
            handle = self.persist(writer, start)
        expected = [(2, b"first"), *bulk[:5_000], (1, b"between"), *bulk[5_000:]]
        assert [(c.key_group, c.payload) for c in self.read(handle)] == expected

    def test_append_all_refuses_bad_input_and_adds_nothing(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        with storage.create_writer("op-append-all-bad", KeyGroupRange.of(4, 7)) as writer:
            start = writer.initial_sequence_number()
            with pytest.raises(KeyGroupOutOfRangeError) as caught:
                writer.append_all([4, 5, 8, 6], [b"a", b"b", b"c", b"d"])
            assert caught.value.key_group == 8
            assert "key group 8 is outside" in str(caught.value) and "[4, 7]" in str(
                caught.value)
            with pytest.raises(TypeError, match="payload must be bytes, got str"):
                writer.append_all([4, 5], [b"a", "b"])  # type: ignore[list-item]
            with pytest.raises(ValueError, match="2 key groups but 1 payloads"):
                writer.append_all([4, 5], [b"a"])
            writer.append(7, b"only")
            handle = self.persist(writer, start)
        assert [(c.key_group, c.payload) for c in self.read(handle)] == [(7, b"only")]
        closed = storage.create_writer("op-append-all-closed", KeyGroupRange.of(0, 0))
        closed.close()
        with pytest.raises(WriterClosedError, match="cannot append"):
            closed.append_all([0], [b"x"])

    # -- sequence numbers and persist ------------------------------------------------

    def test_rollover_only_when_changes_were_appended(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        with storage.create_writer("op-rollover", KeyGroupRange.of(0, 3)) as writer:
            initial = writer.initial_sequence_number()
            assert writer.next_sequence_number() == initial
            assert writer.next_sequence_number() == initial
            writer.append(0, b"a")
            after_a = writer.next_sequence_number()
            assert after_a > initial
            assert writer.next_sequence_number() == after_a
            writer.append_meta(b"m")
            assert writer.next_sequence_number() > after_a

    def test_persist_subsets(self, storage: StateChangelogStorage[Any]) -> None:
        with storage.create_writer("op-subsets", KeyGroupRange.of(0, 3)) as writer:
            initial = writer.initial_sequence_number()
            writer.append(0, b"a")
            sqn_b = writer.next_sequence_number()
            writer.append(1, b"b")
            writer.append(0, b"b2")
            sqn_c = writer.next_sequence_number()
            writer.append(2, b"c")
            assert [c.payload for c in self.read(self.persist(writer, initial))] == [
                b"a", b"b", b"b2", b"c"]
            assert [c.payload for c in self.read(self.persist(writer, sqn_b))] == [
                b"b", b"b2", b"c"]
            assert [c.payload for c in self.read(self.persist(writer, sqn_c))] == [b"c"]
            # Persisting again is idempotent: nothing is duplicated.
            assert [c.payload for c in self.read(self.persist(writer, initial, 2))] == [
                b"a", b"b", b"b2", b"c"]
            latest = writer.next_sequence_number()
            assert self.read(self.persist(writer, latest)) == []

    def test_persist_beyond_the_active_sequence_number(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        with storage.create_writer("op-beyond", KeyGroupRange.of(0, 0)) as writer:
            writer.append(0, b"a")
            active = writer.next_sequence_number()
            with pytest.raises(SequenceNumberOutOfRangeError) as caught:
                writer.persist(SequenceNumber(active.value + 5), 1)
            assert caught.value.highest == active
            assert str(SequenceNumber(active.value + 5)) in str(caught.value)

    def test_appends_after_persist_go_to_later_persists(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        with storage.create_writer("op-after", KeyGroupRange.of(0, 1)) as writer:
            initial = writer.initial_sequence_number()
            writer.append(0, b"first")
            first = self.persist(writer, initial, 1)
            writer.append(1, b"second")
            second = self.persist(writer, initial, 2)
            assert [c.payload for c in self.read(first)] == [b"first"]
            assert [c.payload for c in self.read(second)] == [b"first", b"second"]
            assert first.checkpoint_id == 1 and second.checkpoint_id == 2

    # -- truncation ------------------------------------------------------------------

    def test_truncation(self, storage: StateChangelogStorage[Any]) -> None:
        with storage.create_writer("op-truncate", KeyGroupRange.of(0, 3)) as writer:
            initial = writer.initial_sequence_number()
            writer.append(0, b"old")
            self.persist(writer, initial)
            keep_from = writer.next_sequence_number()
            writer.append(1, b"new")
            writer.truncate(keep_from)
            with pytest.raises(SequenceNumberOutOfRangeError) as caught:
                writer.persist(initial, 2)
            assert caught.value.requested == initial
            assert caught.value.lowest == keep_from
            assert f"{initial}" in str(caught.value) and f"{keep_from}" in str(caught.value)
            assert [c.payload for c in self.read(self.persist(writer, keep_from))] == [b"new"]

    def test_truncate_beyond_the_active_sequence_number(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        with storage.create_writer("op-truncate-beyond", KeyGroupRange.of(0, 0)) as writer:
            active = writer.next_sequence_number()
            with pytest.raises(SequenceNumberOutOfRangeError, match="cannot truncate"):
                writer.truncate(active.next())

    def test_truncate_and_close(self, storage: StateChangelogStorage[Any]) -> None:
        writer = storage.create_writer("op-truncate-close", KeyGroupRange.of(0, 1))
        initial = writer.initial_sequence_number()
        writer.append(0, b"used")
        self.persist(writer, initial, 1)
        writer.confirm(initial, writer.next_sequence_number(), 1)
        tail = writer.next_sequence_number()
        writer.append(1, b"unused")
        self.persist(writer, tail, 2)
        writer.truncate_and_close(tail)
        assert writer.closed
        with pytest.raises(WriterClosedError):
            writer.append(0, b"x")
        # The confirmed head is still held by its checkpoint; the tail by nobody.
        assert storage.registry.holders(writer.log_id, initial) == {checkpoint_hold(1)}
        assert storage.registry.holders(writer.log_id, tail) == frozenset()

    # -- ownership -------------------------------------------------------------------

    def test_confirm_and_reset_track_ownership(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        registry = storage.registry
        with storage.create_writer("op-owner", KeyGroupRange.of(0, 1)) as writer:
            s0 = writer.initial_sequence_number()
            writer.append(0, b"a")
            s1 = writer.next_sequence_number()
            writer.append(1, b"b")
            s2 = writer.next_sequence_number()
            self.persist(writer, s0, 10)
            assert registry.holders(writer.log_id, s0) == {WRITER_HOLD}
            writer.confirm(s0, s2, 10)
            assert registry.holders(writer.log_id, s1) == {WRITER_HOLD, checkpoint_hold(10)}
            writer.reset(s1, s2, 10)
            assert registry.holders(writer.log_id, s1) == {WRITER_HOLD}
            writer.truncate(s2)
            # Truncation drops the writer's hold: only the confirmed checkpoint remains.
            assert registry.holders(writer.log_id, s0) == {checkpoint_hold(10)}
            assert registry.holders(writer.log_id, s1) == frozenset()
            storage.release_checkpoint(10)
            assert registry.holders(writer.log_id, s0) == frozenset()

    def test_close_releases_unconfirmed(self, storage: StateChangelogStorage[Any]) -> None:
        writer = storage.create_writer("op-close-release", KeyGroupRange.of(0, 0))
        s0 = writer.initial_sequence_number()
        writer.append(0, b"a")
        self.persist(writer, s0, 3)
        writer.close()
        assert storage.registry.holders(writer.log_id, s0) == frozenset()

    # -- meta changes and handles -------------------------------------------------------

    def test_meta_changes_are_persisted_in_order(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        with storage.create_writer("op-meta", KeyGroupRange.of(0, 3)) as writer:
            writer.append_meta(b"register-state")
            writer.append(2, b"value")
            writer.append_meta(b"register-other")
            changes = self.read(self.persist(writer, writer.initial_sequence_number()))
        assert changes == [
            StateChange.meta(b"register-state"),
            StateChange(2, b"value"),
            StateChange.meta(b"register-other"),
        ]
        assert changes[0].is_meta and not changes[1].is_meta

    def test_handle_intersection(self, storage: StateChangelogStorage[Any]) -> None:
        with storage.create_writer("op-intersect", KeyGroupRange.of(0, 9)) as writer:
            writer.append_meta(b"meta")
            for kg in range(10):
                writer.append(kg, f"kg{kg}".encode())
            handle = self.persist(writer, writer.initial_sequence_number())
        narrowed = handle.intersection(KeyGroupRange.of(3, 5))
        assert narrowed is not None
        assert narrowed.key_group_range == KeyGroupRange.of(3, 5)
        assert self.read(narrowed) == [StateChange.meta(b"meta")] + [
            StateChange(kg, f"kg{kg}".encode()) for kg in (3, 4, 5)
        ]
        wider = handle.intersection(KeyGroupRange.of(8, 100))
        assert wider is not None and wider.key_group_range == KeyGroupRange.of(8, 9)
        assert handle.intersection(KeyGroupRange.of(10, 20)) is None
        assert handle.intersection(KeyGroupRange.empty()) is None

    def test_handle_round_trip(self, storage: StateChangelogStorage[Any]) -> None:
        rng = random.Random(11)
        with storage.create_writer("op-serde", KeyGroupRange.of(2, 4)) as writer:
            writer.append_meta(b"m")
            for _ in range(50):
                writer.append(rng.randint(2, 4), _random_bytes(rng, rng.randint(0, 64)))
            handle = self.persist(writer, writer.initial_sequence_number(), 42)
        copy = ChangelogHandle.from_bytes(handle.to_bytes())
        assert type(copy) is type(handle)
        assert copy.log_id == handle.log_id
        assert copy.key_group_range == handle.key_group_range
        assert copy.checkpoint_id == 42
        assert copy.state_size == handle.state_size
        assert self.read(copy) == self.read(handle)
        with pytest.raises(HandleFormatError):
            ChangelogHandle.from_bytes(handle.to_bytes()[:-3])
        with pytest.raises(HandleFormatError):
            ChangelogHandle.from_bytes(b"definitely not a handle")

    def test_writers_do_not_see_each_other(self, storage: StateChangelogStorage[Any]) -> None:
        with (
            storage.create_writer("op-a", KeyGroupRange.of(0, 7)) as first,
            storage.create_writer("op-a", KeyGroupRange.of(0, 7)) as second,
        ):
            assert first.log_id != second.log_id
            first.append(1, b"first")
            second.append(1, b"second")
            assert [c.payload for c in self.read(
                self.persist(first, first.initial_sequence_number()))] == [b"first"]
            assert [c.payload for c in self.read(
                self.persist(second, second.initial_sequence_number()))] == [b"second"]

    def test_random_operations_match_the_model(
        self, storage: StateChangelogStorage[Any]
    ) -> None:
        """Random appends, rollovers, persists and truncations against a plain log model."""
        rng = random.Random(2024)
        key_groups = KeyGroupRange.of(10, 25)
        log: list[tuple[SequenceNumber, StateChange]] = []
        with storage.create_writer("op-random", key_groups) as writer:
            lowest = writer.initial_sequence_number()
            active = lowest
            for step in range(300):
                op = rng.random()
                if op < 0.6:
                    payload = _random_bytes(rng, rng.randint(1, 40))
                    change = (
                        StateChange.meta(payload) if rng.random() < 0.1
                        else StateChange(rng.randint(10, 25), payload)
                    )
                    if change.is_meta:
                        writer.append_meta(change.payload)
                    else:
                        writer.append(change.key_group, change.payload)
                    log.append((active, change))
                elif op < 0.8:
                    active = writer.next_sequence_number()
                elif op < 0.95:
                    from_sqn = SequenceNumber(rng.randint(lowest.value, active.value))
                    handle = self.persist(writer, from_sqn, step)
                    # A persist rolls the active set over.
                    if log and log[-1][0] == active:
                        active = active.next()
                    expected = [c for sqn, c in log if sqn >= from_sqn]
                    assert self.read(handle) == expected, f"step {step}: persist({from_sqn})"
                else:
                    to_sqn = SequenceNumber(rng.randint(lowest.value, active.value))
                    writer.truncate(to_sqn)
                    lowest = max(lowest, to_sqn)
                    log = [(sqn, c) for sqn, c in log if sqn >= to_sqn]
