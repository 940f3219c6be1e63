"""Garbage collection never deletes what a writer or checkpoint still needs."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_changelog import ChangelogTruncatedError, KeyGroupRange, SequenceNumber, StateChange
from kafka_changelog.kafka import KafkaChangelogHandle, KafkaChangelogStorage, KafkaChangelogWriter

from .kafka_helpers import changes_of, storage_config

pytestmark = pytest.mark.broker


def persist_set(
    writer: KafkaChangelogWriter, label: bytes
) -> tuple[SequenceNumber, KafkaChangelogHandle]:
    """Append one change per key group as a new change set; persist just that set."""
    sqn = writer.next_sequence_number()
    for kg in writer.key_group_range:
        writer.append(kg, label + b"-%d" % kg)
    handle = writer.persist(sqn, 1).result(30).job_owned
    assert handle is not None
    return sqn, handle


def payloads(handle: KafkaChangelogHandle, config: Any) -> list[bytes]:
    return [c.payload for c in changes_of(handle, config)]


def test_gc_deletes_exactly_what_nobody_needs(kafka_cluster: Any) -> None:
    config = storage_config(kafka_cluster, partitions=2, max_parallelism=4)
    with KafkaChangelogStorage(config) as storage:
        one = storage.create_writer("one", KeyGroupRange.of(0, 3))
        two = storage.create_writer("two", KeyGroupRange.of(0, 3))
        sets: dict[str, list[tuple[SequenceNumber, KafkaChangelogHandle]]] = {"one": [], "two": []}
        for i in range(3):  # interleaved: both writers share both partitions
            sets["one"].append(persist_set(one, b"one%d" % i))
            sets["two"].append(persist_set(two, b"two%d" % i))
        # Offsets per partition: one/0 -> 0, two/0 -> 1, one/1 -> 2, two/1 -> 3, ...
        assert [h.ranges[0].start_offset for _, h in sets["one"]] == [0, 2, 4]

        s = [sqn for sqn, _ in sets["one"]]
        active = one.next_sequence_number()
        one.confirm(s[2], active, 3)  # confirmations arrive out of order
        one.confirm(s[0], s[1], 1)
        one.truncate(active)  # the writer lets go: only checkpoints 1 and 3 hold sets
        assert storage.collect_garbage().deleted_below == {0: 0, 1: 0}
        assert payloads(sets["one"][0][1], config) == [b"one0-%d" % kg for kg in range(4)]

        storage.release_checkpoint(1)  # one/0 is free, but two/0 at offset 1 is still live
        assert storage.collect_garbage().deleted_below == {0: 1, 1: 1}
        with pytest.raises(ChangelogTruncatedError):
            payloads(sets["one"][0][1], config)
        assert payloads(sets["two"][0][1], config) == [b"two0-%d" % kg for kg in range(4)]

        two.truncate(two.next_sequence_number())  # now only checkpoint 3 (one/2 at 4) holds
        assert storage.collect_garbage().deleted_below == {0: 4, 1: 4}
        assert changes_of(sets["one"][2][1], config) == [
            StateChange(kg, b"one2-%d" % kg) for kg in range(4)]
        with pytest.raises(ChangelogTruncatedError):
            payloads(sets["two"][1][1], config)  # offset 3: gone
        # two/2 (offset 5) is needed by nobody but lies above what checkpoint 3 needs.
        assert payloads(sets["two"][2][1], config) == [b"two2-%d" % kg for kg in range(4)]

        # A handle kept by the caller (e.g. a retained checkpoint) protects its ranges too.
        retained = sets["one"][2][1]
        storage.release_checkpoint(3)
        assert storage.collect_garbage([retained]).deleted_below == {0: 4, 1: 4}
        assert storage.collect_garbage().deleted_below == {0: 6, 1: 6}
        one.close()
        two.close()
