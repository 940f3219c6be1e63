"""A replacing state write's snapshot: each task's rows written as snapshot layers.

A write replacing an operator's keyed state (:attr:`~.state_write.WriteMode.REPLACE`) makes
a new materialization of it. Its rows may come partitioned any way (a key group's rows
spread over several tasks), so each task writes its own rows' entries of each key group as
one *layer* of that key group (the key-group snapshot format, ``schemas/
key_group_state.avsc``), under the new backend id of the subtask that owns the key group
and a materialization id of its own (the plan's first plus the task's number): chunk keys
never collide, and a key group's layers are ordered by task. The driver joins every task's
chunks per subtask into one snapshot handle (:func:`joined_snapshot`). A restore loads a
key group's first layer as its state and applies each later one as a delta, which sets
each of its keys' entries: exactly the union of the tasks' entries, since an entry is
written by one task (a key's list, and a key's map, are one entry here: their rows must be
in one task, which the driver checks with the other collisions).

TTL'd entries need expiry timers (the timers that remove them once expired). A key's timers
are one map of the timers state, holding the timers of all its states, whose rows may be
in several tasks: as layers, a later task's map would replace an earlier one's. So each
task appends its expiry timers to a small log of its own instead (map puts compose), which
the checkpoint names as the changelog of the new backends, after their snapshots.

Nothing names the chunks until the driver commits the checkpoint: a failed or killed write
leaves chunks of backends no checkpoint names, which the snapshot sweep removes once their
materialization is older than its grace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...keygroups import KeyGroupRange, key_group_range_for_operator
from ...storage import StateChangelogStorage
from ..schema.ops import StateMeta
from ..snapshots.materialization import next_materialization_id
from ..snapshots.snapshot import SnapshotHandle
from ..snapshots.snapshot_store import SnapshotStore
from ..tables.memory import StateTable
from .entry_changes import (
    CountedRows,
    EntryChange,
    Expiries,
    StateWriteError,
    WrittenChanges,
    WrittenUnits,
    append_timer_ops,
    persisted_log,
    state_ops,
    whole_states,
)


@dataclass(frozen=True)
class LayerTarget:
    """Where a replacing write's tasks write their layers (planned on the driver): the
    new checkpoint's subtasks, each a backend of its own, and the snapshot topic."""

    operator: str
    #: The new backend id of each subtask of the new checkpoint.
    backend_ids: tuple[str, ...]
    max_parallelism: int
    #: Task ``t`` writes its layers as materialization ``first_materialization_id + t``.
    first_materialization_id: int
    snapshot_topic: str

    @staticmethod
    def planned(operator: str, parallelism: int, max_parallelism: int, snapshot_topic: str,
                after_materialization: int = 0) -> LayerTarget:
        """New backend ids at ``parallelism``; materialization ids after
        ``after_materialization`` (the latest the replaced state used)."""
        return LayerTarget(
            operator, tuple(f"{operator}-{uuid.uuid4().hex[:12]}" for _ in range(parallelism)),
            max_parallelism, next_materialization_id(after_materialization), snapshot_topic)

    @property
    def parallelism(self) -> int:
        return len(self.backend_ids)

    def key_groups_of(self, subtask: int) -> KeyGroupRange:
        return key_group_range_for_operator(self.max_parallelism, self.parallelism, subtask)


def write_entry_layers(store: SnapshotStore, target: LayerTarget, task: int,
                       metas: Mapping[str, StateMeta], changes: Iterable[EntryChange],
                       timers: StateChangelogStorage[Any] | None = None,
                       checkpoint_id: int = 0) -> WrittenChanges:
    """Write the entries of ``changes`` (Spark task ``task``'s rows) as one layer per key
    group they touch (module docstring); what was written. The rows are held in memory
    until written: a task's share of the state must fit its worker. TTL'd entries' expiry
    timers go to a log of ``timers`` persisted for ``checkpoint_id`` (needed when a state
    has a TTL)."""
    units = WrittenUnits(sorted(metas))
    table = StateTable()
    for meta in metas.values():
        table.register(meta)
    rows = CountedRows(changes)
    expiries: Expiries = {}
    ops = list(state_ops(rows, metas, units, deletes=False,
                         max_parallelism=target.max_parallelism, expiries=expiries))
    table.apply_batch(ops)
    handle = _timer_log(timers, target, expiries, checkpoint_id) if expiries else None
    materialization = target.first_materialization_id + task
    groups = table.key_groups()
    layers: list[tuple[int, bytes]] = []
    for subtask in range(target.parallelism):
        owned = target.key_groups_of(subtask)
        mine = [kg for kg in groups if owned.contains(kg)]
        if mine:
            layers.append((subtask, _write_layers(store, target.backend_ids[subtask],
                                                  materialization, owned, table, mine)))
    return units.changes(handle, rows.count, len(ops), whole_states(metas, deletes=False),
                         tuple(layers))


def _timer_log(timers: StateChangelogStorage[Any] | None, target: LayerTarget,
               expiries: Expiries, checkpoint_id: int) -> bytes | None:
    """The handle of a persisted log of the expiry timers of ``expiries``."""
    if timers is None:
        raise StateWriteError(
            f"a replacing write of TTL'd states needs a changelog for their expiry timers "
            f"(operator {target.operator!r})")
    handle, _ = persisted_log(timers, target.operator, target.max_parallelism,
                              checkpoint_id, lambda writer: append_timer_ops(writer, expiries))
    return handle


def _write_layers(store: SnapshotStore, backend_id: str, materialization: int,
                  owned: KeyGroupRange, table: StateTable, key_groups: Sequence[int]) -> bytes:
    writer = store.begin_write(backend_id, materialization, owned, 0)
    try:
        for key_group in key_groups:
            writer.add(key_group, table.serialize_group(key_group))
        return writer.finish({}).to_bytes()
    except BaseException:
        writer.abandon()
        raise


def joined_snapshot(target: LayerTarget, subtask: int, layers: Sequence[bytes]
                    ) -> SnapshotHandle | None:
    """The snapshot of ``subtask``: every task's chunks of its key groups (``layers``, the
    tasks' handles of it, in task order) in one handle; None when no task wrote any."""
    handles = [SnapshotHandle.from_bytes(data) for data in layers]
    if not handles:
        return None
    return SnapshotHandle(
        backend_id=target.backend_ids[subtask],
        materialization_id=max(h.materialization_id for h in handles),
        key_group_range=target.key_groups_of(subtask), topic=target.snapshot_topic,
        chunks=tuple(c for h in handles for c in h.chunks), materialized_sequence_number=0)


def layers_by_subtask(written: Sequence[tuple[int, WrittenChanges]]
                      ) -> dict[int, list[bytes]]:
    """Subtask -> the tasks' handles of it, in task order."""
    found: dict[int, list[bytes]] = {}
    for _, changes in sorted(written, key=lambda pair: pair[0]):
        for subtask, data in changes.layers:
            found.setdefault(subtask, []).append(data)
    return found


__all__ = ["LayerTarget", "joined_snapshot", "layers_by_subtask", "write_entry_layers"]
