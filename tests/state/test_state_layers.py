"""A replacing state write's snapshot layers (``state_layers``), in process: tasks' rows
spread any way over key groups, written as layers of new backends, committed, and
restored at any parallelism to exactly the rows' entries (in-memory stores; the same
through Spark and Kafka in ``tests/spark/test_state_writer.py``)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kafka_changelog import InMemoryChangelogStorage, key_group_range_for_operator
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.history.entry_changes import (
    EntryChange,
    StateWriteError,
    write_entry_changes,
)
from kafka_changelog.state.history.state_layers import write_entry_layers
from kafka_changelog.state.history.state_write import (
    NewApplication,
    WriteMode,
    commit_state_write,
    plan_state_write,
)
from kafka_changelog.state.schema.descriptors import list_state, map_state, value_state
from kafka_changelog.state.schema.evolution import requested_meta
from kafka_changelog.state.schema.ops import StateMeta
from kafka_changelog.state.schema.serializers import INT64, UTF8
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore

COUNT = value_state("count", INT64)
EVENTS = list_state("events", UTF8)
PAGES = map_state("pages", UTF8, INT64)
METAS: dict[str, StateMeta] = {d.name: requested_meta(d) for d in (COUNT, EVENTS, PAGES)}
MAX_P = 16
USERS = [f"user-{i:03d}".encode() for i in range(300)]


def rows_of(user: bytes, n: int) -> list[EntryChange]:
    """A user's rows: a count, a list of ``n % 3 + 1`` events, a map of two pages."""
    return [EntryChange("count", user, n.to_bytes(8, "big")),
            *(EntryChange("events", user, f"e{i}".encode(), list_index=i)
              for i in range(n % 3 + 1)),
            EntryChange("pages", user, (n + 1).to_bytes(8, "big"), map_key=b"home"),
            EntryChange("pages", user, (n + 2).to_bytes(8, "big"), map_key=b"cart")]


def expected(user: bytes, n: int) -> dict[str, Any]:
    return {"count": n.to_bytes(8, "big"),
            "events": [f"e{i}".encode() for i in range(n % 3 + 1)],
            "pages": {b"home": (n + 1).to_bytes(8, "big"), b"cart": (n + 2).to_bytes(8, "big")}}


def written_by_tasks(tasks: int, seed: int = 3) -> tuple[list[list[EntryChange]], dict[bytes, Any]]:
    """Each user's rows in one random task (a key's rows together), users of a key group
    spread over every task."""
    rng = random.Random(seed)
    parts: list[list[EntryChange]] = [[] for _ in range(tasks)]
    model = {}
    for n, user in enumerate(USERS):
        parts[rng.randrange(tasks)].extend(rows_of(user, n))
        model[user] = expected(user, n)
    return parts, model


def restored(coordinator: CheckpointCoordinator, checkpoint: CompletedCheckpoint,
             parallelism: int) -> dict[bytes, Any]:
    found: dict[bytes, dict[str, Any]] = {}
    for index in range(parallelism):
        backend = coordinator.restore_keyed(
            "op", key_group_range_for_operator(MAX_P, parallelism, index), checkpoint)
        try:
            table = backend.table
            for group in table.key_groups():
                for name, key, entry in table.entries(group):
                    found.setdefault(key, {})[name] = (dict(entry) if isinstance(entry, dict)
                                                       else entry)
        finally:
            backend.close()
    return found


@pytest.mark.parametrize("parallelism", [1, 3])
def test_layers_of_any_tasks_restore_to_exactly_their_rows(parallelism: int) -> None:
    checkpoints, snapshots = InMemoryCheckpointStore(), InMemorySnapshotStore(
        max_parallelism=MAX_P)
    storage = InMemoryChangelogStorage()
    plan = plan_state_write(checkpoints, "app", mode=WriteMode.REPLACE,
                            new=NewApplication("op", parallelism, MAX_P, "changes"),
                            snapshot_topic=snapshots.topic)
    assert plan.layers is not None and plan.layers.parallelism == parallelism
    parts, model = written_by_tasks(4)
    written = [(task, write_entry_layers(snapshots, plan.layers, task, METAS, rows))
               for task, rows in enumerate(parts)]
    checkpoint = commit_state_write(checkpoints, plan, written, mode=WriteMode.REPLACE)
    assert checkpoint.checkpoint_id == 1 and len(checkpoint.subtasks) == parallelism
    handles = [s.keyed.snapshot for s in checkpoint.subtasks if s.keyed is not None]
    assert all(h is not None for h in handles)
    # Four tasks wrote users of every key group: each key group has a layer per task.
    assert {len(h.layers_of(kg)) for h in handles if h is not None for kg in h.key_groups} == {4}
    coordinator = CheckpointCoordinator("app", checkpoints, snapshots, storage, MAX_P)
    for at in (parallelism, 2):  # as written, and rescaled
        assert restored(coordinator, checkpoint, at) == model


def test_a_key_whose_map_rows_are_in_two_tasks_is_refused_naming_the_fix() -> None:
    checkpoints, snapshots = InMemoryCheckpointStore(), InMemorySnapshotStore(
        max_parallelism=MAX_P)
    plan = plan_state_write(checkpoints, "app", mode=WriteMode.REPLACE,
                            new=NewApplication("op", 2, MAX_P, "changes"),
                            snapshot_topic=snapshots.topic)
    assert plan.layers is not None
    home, cart = rows_of(b"u1", 0)[-2:]
    written = [(0, write_entry_layers(snapshots, plan.layers, 0, METAS, [home])),
               (1, write_entry_layers(snapshots, plan.layers, 1, METAS, [cart]))]
    with pytest.raises(StateWriteError, match=r"state\(s\) \['pages'\] \(a list, or a "
                                              r"map the write replaces\) must all be in one "
                                              r"Spark task"):
        commit_state_write(checkpoints, plan, written, mode=WriteMode.REPLACE)
    assert checkpoints.latest("app") is None


SEEN = value_state("seen", INT64, ttl=60.0)
T0 = 1_800_000_000_000


@pytest.mark.parametrize("mode", [WriteMode.REPLACE, WriteMode.APPLY])
def test_written_ttl_entries_get_expiry_timers_that_remove_them(mode: WriteMode) -> None:
    """Each TTL'd key written gets its expiry timer (in the log of its task), so expired
    entries nobody reads are removed like those the backend wrote itself."""
    checkpoints, snapshots = InMemoryCheckpointStore(), InMemorySnapshotStore(
        max_parallelism=MAX_P)
    storage = InMemoryChangelogStorage()
    metas = {**METAS, "seen": requested_meta(SEEN)}
    plan = plan_state_write(checkpoints, "app", mode=mode,
                            new=NewApplication("op", 2, MAX_P, "changes"),
                            snapshot_topic=snapshots.topic)
    users = USERS[:40]
    rows = [EntryChange("seen", u, i.to_bytes(8, "big"), expires_at_ms=T0 + i * 1000)
            for i, u in enumerate(users)]
    parts = [rows[0::3], rows[1::3], rows[2::3]]
    if plan.layers is not None:
        written = [(t, write_entry_layers(snapshots, plan.layers, t, metas, part, storage,
                                          plan.checkpoint_id))
                   for t, part in enumerate(parts)]
    else:
        written = [(t, write_entry_changes(storage, "op", MAX_P, plan.checkpoint_id, metas,
                                           part)) for t, part in enumerate(parts)]
    checkpoint = commit_state_write(checkpoints, plan, written, mode=mode)
    coordinator = CheckpointCoordinator("app", checkpoints, snapshots, storage, MAX_P)
    backend = coordinator.restore_keyed("op", key_group_range_for_operator(MAX_P, 1, 0),
                                        checkpoint)
    try:
        def seen() -> set[bytes]:
            return {key for kg in backend.table.key_groups()
                    for name, key, _ in backend.table.entries(kg) if name == "seen"}

        assert seen() == set(users)
        backend.set_processing_time(T0 + 19_500)  # users 0..19 expired
        backend.expire_due()
        assert seen() == set(users[20:])
        backend.set_processing_time(T0 + 60_000)
        backend.expire_due()
        assert seen() == set()
    finally:
        backend.close()
