"""Rewind planning and execution on the in-memory store (the rules; the Kafka store and
the command line are tested in tests/cli/test_cli_rewind.py), and retention by age."""

from __future__ import annotations

import pytest

from kafka_changelog import KeyGroupRange
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    SubtaskState,
)
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.checkpoints.driver_claim import (
    DriverClaim,
    DriverIdentity,
    driver_claim_key,
)
from kafka_changelog.state.checkpoints.source_offsets import SOURCE_OFFSETS_PROPERTY
from kafka_changelog.state.errors import CheckpointOrderError
from kafka_changelog.state.history.rewind import (
    REWOUND_AT_PROPERTY,
    REWOUND_FROM_PROPERTY,
    REWOUND_LATEST_PROPERTY,
    Chunk,
    RewindError,
    check_not_held,
    execute_rewind,
    plan_rewind,
)
from kafka_changelog.state.snapshots.snapshot import ChunkRef, SnapshotHandle

ALL = KeyGroupRange.of(0, 1)
T0 = 1_700_000_000_000
NOW = T0 + 10_000_000


def snapshot(materialization: int) -> SnapshotHandle:
    chunks = tuple(ChunkRef(kg, materialization, 0, 1, partition=kg, offset=materialization,
                            size=3, crc32=7) for kg in (0, 1))
    return SnapshotHandle("be", materialization, ALL, "snaps", chunks, 0)


def checkpoint(cid: int, materialization: int, application: str = "app",
               minutes_ago: int = 100) -> CompletedCheckpoint:
    keyed = KeyedStateHandle("be", ALL, materialization, snapshot(materialization), ())
    return CompletedCheckpoint(
        application, cid, NOW - minutes_ago * 60_000, 2,
        (SubtaskState("op", 0, 1, keyed, None),), (),
        {SOURCE_OFFSETS_PROPERTY: f'{{"in":{{"0":{cid * 10}}}}}', "spark.batch_id": str(cid)})


def chunks(materialization: int) -> list[Chunk]:
    return [("snaps", kg, f"be/{kg}/{materialization}/0") for kg in (0, 1)]


@pytest.fixture
def store() -> InMemoryCheckpointStore:
    """app: checkpoints 1..5 (materializations 1, 1, 3, 4, 4); other: 7 (shares
    materialization 4's chunks)."""
    found = InMemoryCheckpointStore(retain=10)
    for cid, materialization in [(1, 1), (2, 1), (3, 3), (4, 4), (5, 4)]:
        found.commit(checkpoint(cid, materialization))
    found.commit(checkpoint(7, 4, "other"))
    return found


def test_a_rewind_commits_a_copy_under_a_new_id_then_discards_what_came_after(
    store: InMemoryCheckpointStore,
) -> None:
    plan = plan_rewind(store, "app", 2, NOW)
    assert (plan.target_id, plan.latest_id, plan.discard) == (2, 5, (3, 4, 5))
    # Materialization 3 is only checkpoint 3's; 4 is checkpoint 7's of "other" too.
    assert plan.chunks == tuple(chunks(3))
    assert plan.copy is not None and plan.resume_from == plan.copy
    assert plan.copy.checkpoint_id == 7  # 6 may be a batch in the making's
    assert plan.copy.subtasks == store.get("app", 2).subtasks
    assert plan.copy.timestamp_ms == store.get("app", 2).timestamp_ms
    assert plan.copy.properties == {
        **store.get("app", 2).properties, REWOUND_FROM_PROPERTY: "2",
        REWOUND_LATEST_PROPERTY: "5", REWOUND_AT_PROPERTY: str(NOW)}
    assert plan.starting_offsets == '{"in":{"0":20}}'
    assert store.checkpoint_ids("app") == [1, 2, 3, 4, 5]  # planning writes nothing

    deleted: list[Chunk] = []
    execute_rewind(store, plan, deleted.extend)
    assert deleted == chunks(3)
    assert store.checkpoint_ids("app") == [1, 2, 7]
    assert store.latest("app") == plan.copy
    assert store.checkpoint_ids("other") == [7]
    # Nothing is left to do; rewinding to the copy's origin again changes nothing.
    again = plan_rewind(store, "app", 2, NOW)
    assert again.nothing_to_do and again.resume_from == plan.copy


def test_an_interrupted_rewind_is_finished_by_running_it_again(
    store: InMemoryCheckpointStore,
) -> None:
    plan = plan_rewind(store, "app", 2, NOW)
    assert plan.copy is not None
    store.commit(plan.copy)  # the first step only: then the process died
    assert store.latest("app") == plan.copy  # a valid latest at every point
    # A checkpoint being discarded cannot be rewound to.
    with pytest.raises(RewindError) as refused:
        plan_rewind(store, "app", 4, NOW)
    assert str(refused.value) == (
        "cannot rewind application 'app' to checkpoint 4: the application was rewound to "
        "checkpoint 2, and the checkpoints after it are being discarded; retained "
        "checkpoints: 1, 2, 7 (retain=10, retain_for_s=None)")
    second = plan_rewind(store, "app", 2, NOW + 1)
    assert second.finishing and second.copy is None
    assert (second.discard, second.chunks, second.resume_from) == (
        (3, 4, 5), tuple(chunks(3)), plan.copy)
    deleted: list[Chunk] = []
    execute_rewind(store, second, deleted.extend)
    assert (deleted, store.checkpoint_ids("app")) == (chunks(3), [1, 2, 7])


def test_rewinding_to_a_checkpoint_not_retained_names_the_retained_ones(
    store: InMemoryCheckpointStore,
) -> None:
    store.discard("app", 1)
    with pytest.raises(RewindError) as gone:
        plan_rewind(store, "app", 1, NOW)
    assert str(gone.value) == (
        "cannot rewind application 'app' to checkpoint 1: it was discarded by garbage "
        "collection or never existed; retained checkpoints: 2, 3, 4, 5 (retain=10, "
        "retain_for_s=None)")
    with pytest.raises(RewindError) as unknown:
        plan_rewind(store, "nobody", 1, NOW)
    assert str(unknown.value) == (
        "cannot rewind application 'nobody': it has no checkpoint in the checkpoint store "
        "(applications there: app, other)")
    store.retain = 2
    with pytest.raises(RewindError) as beyond:
        plan_rewind(store, "app", 2, NOW)
    assert str(beyond.value) == (
        "cannot rewind application 'app' to checkpoint 2: it is beyond retention and being "
        "garbage collected; retained checkpoints: 4, 5 (retain=2, retain_for_s=None)")


def test_a_checkpoint_committed_after_the_plan_fails_the_rewind_before_any_write(
    store: InMemoryCheckpointStore,
) -> None:
    plan = plan_rewind(store, "app", 2, NOW)
    store.commit(checkpoint(7, 5))
    deleted: list[Chunk] = []
    with pytest.raises(CheckpointOrderError):
        execute_rewind(store, plan, deleted.extend)
    assert (deleted, store.checkpoint_ids("app")) == ([], [1, 2, 3, 4, 5, 7])


def test_retention_by_age_keeps_the_count_always_and_younger_ones_too() -> None:
    store = InMemoryCheckpointStore(retain=2, retain_for_s=3600)
    for cid, minutes_ago in [(1, 120), (2, 61), (3, 59), (4, 30), (5, 1)]:
        store.commit(checkpoint(cid, cid, minutes_ago=minutes_ago))
    # Beyond the newest two (4, 5): 1 and 2 are older than an hour, 3 is not.
    assert store.subsumed_ids("app", NOW) == [1, 2]
    assert store.retained_ids("app", NOW) == [3, 4, 5]
    assert store.retained_checkpoints("app", NOW) == [store.get("app", i) for i in (3, 4, 5)]
    # An hour later every one but the newest two is old enough to go.
    assert store.subsumed_ids("app", NOW + 3_600_000) == [1, 2, 3]
    by_count = InMemoryCheckpointStore(retain=2)
    for cid in range(1, 6):
        by_count.commit(checkpoint(cid, cid, minutes_ago=1))
    assert by_count.subsumed_ids("app", NOW) == [1, 2, 3]
    with pytest.raises(ValueError, match="retain_for_s must be None or positive, got 0"):
        InMemoryCheckpointStore(retain_for_s=0)


def test_a_live_driver_holding_the_application_is_refused(
    store: InMemoryCheckpointStore,
) -> None:
    def claim(heartbeat_ms: int, released: bool = False) -> None:
        driver = DriverIdentity("d" * 32, "elsewhere", 4242, "1")
        record = DriverClaim("app", 3, driver, "q1", NOW - 60_000, heartbeat_ms, released)
        store.apply_record(driver_claim_key("app").encode(), record.to_bytes(), "test")

    claim(NOW - 1_000)
    with pytest.raises(RewindError) as held:
        check_not_held(store, "app", 60.0, NOW)
    assert str(held.value) == (
        f"cannot rewind application 'app': driver dddddddd (host elsewhere, pid 4242, Spark "
        f"query q1, epoch 3, last heartbeat at {NOW - 1_000} ms since the epoch) holds it; "
        "stop its streaming query first (its driver releases it at its next heartbeat, "
        "within a quarter of driver_lease_s; a driver that died stops holding it 60 s after "
        "its last heartbeat)")
    claim(NOW - 1_000, released=True)
    check_not_held(store, "app", 60.0, NOW)
    claim(NOW - 61_000)  # no heartbeat for longer than the lease
    check_not_held(store, "app", 60.0, NOW)
