"""The sweep's rules: which live snapshot keys no checkpoint can name any more."""

from __future__ import annotations

from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.state.snapshots.chunk_sweep import ChunkKey, chunks_to_sweep
from kafka_changelog.state.snapshots.snapshot import ChunkRef, SnapshotHandle, chunk_key
from kafka_changelog.state.snapshots.snapshot_store import LiveKey

NOW_S = 1_800_000_000.0
GRACE_S = 3600.0
#: Materialization ids are their start times in microseconds.
NAMED_M = int((NOW_S - 600) * 1e6)


def handle(backend: str, materialization_id: int, *chunks: tuple[int, int]) -> SnapshotHandle:
    """A snapshot of ``backend`` at ``materialization_id`` naming chunk 0 of each
    (key group, writing materialization) in ``chunks``."""
    refs = tuple(ChunkRef(kg, m, 0, 1, 0, offset, 10, 0)
                 for offset, (kg, m) in enumerate(chunks))
    return SnapshotHandle(backend, materialization_id, KeyGroupRange.of(0, 127), "snap", refs,
                          0)


def live(backend: str, key_group: int, materialization_id: int) -> LiveKey:
    return LiveKey(0, chunk_key(backend, key_group, materialization_id, 0), 0)


def test_a_named_chunk_is_kept_and_an_older_one_of_its_backend_is_swept() -> None:
    named = [handle("a", NAMED_M, (1, NAMED_M), (2, NAMED_M - 5))]  # key group 2 reused
    keys = [live("a", 1, NAMED_M), live("a", 2, NAMED_M - 5), live("a", 1, NAMED_M - 3),
            live("a", 3, NAMED_M + 7)]
    doomed, report = chunks_to_sweep(keys, named, NOW_S, GRACE_S)
    # Older than what is named and not named: never handed out again. Newer: a
    # materialization in flight (or a job to apply), kept.
    assert doomed == [live("a", 1, NAMED_M - 3)]
    assert (report.live, report.named, report.swept, report.kept_young) == (4, 3, 1, 0)


def test_a_backend_nothing_names_is_swept_only_after_the_grace() -> None:
    old = int((NOW_S - GRACE_S - 1) * 1e6)
    young = int((NOW_S - GRACE_S + 60) * 1e6)
    keys = [live("gone", 4, old), live("new", 5, young)]
    doomed, report = chunks_to_sweep(keys, [handle("a", NAMED_M, (1, NAMED_M))], NOW_S,
                                     GRACE_S)
    assert doomed == [live("gone", 4, old)]
    assert (report.swept, report.kept_young) == (1, 1)


def test_keys_that_are_not_chunk_keys_are_kept() -> None:
    old = int((NOW_S - 10 * GRACE_S) * 1e6)
    keys = [LiveKey(0, "not-a-chunk", 0), LiveKey(1, "b/x/1/0", 0), LiveKey(1, f"/1/{old}/0", 0)]
    assert chunks_to_sweep(keys, [], NOW_S, GRACE_S)[0] == []


def test_a_backend_id_may_contain_slashes() -> None:
    assert ChunkKey.parse("app/op/7/12/1700000000000000/3") == ChunkKey(
        "app/op/7", 12, 1_700_000_000_000_000, 3)
    assert ChunkKey.parse("12/3/4") is None
