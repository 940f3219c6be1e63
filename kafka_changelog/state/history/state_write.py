"""A state write: rows of entries applied to a stopped application's latest checkpoint, or
replacing its keyed state.

Planned on a driver (:func:`plan_state_write`), written by tasks
(:func:`~.entry_changes.write_entry_changes`: each task appends its rows' state ops to a
log of its own) and committed by the driver (:func:`commit_state_write`): a new checkpoint
``M = L + 2`` (as a rewind's copy, see :mod:`.rewind` for why not ``L + 1``) whose keyed
handles of the written operator are the latest's with the tasks' logs appended, in task
order, each narrowed to the subtask's key groups (:attr:`WriteMode.APPLY`), or, replacing
the operator's keyed state (:attr:`WriteMode.REPLACE`), a new materialization: backends of
their own whose snapshots are the layers the tasks wrote (:mod:`.state_layers`) and
nothing else. Everything else is the latest's: the
parallelism, the snapshots, the operator state, the log floors and the properties (the
input offsets the streaming query continues from, its processing time, its Spark query
and batch), plus :data:`STATE_WRITE_FROM_PROPERTY` and the state registrations the write
declared.

An application that has no checkpoint yet gets its first one from a write (a bootstrap,
:class:`NewApplication`): checkpoint 1, the operator's subtasks at the parallelism given,
each holding the tasks' logs narrowed to its key groups, and the input offsets the user
gives (the streaming query continues from them).

All or nothing: until ``M``'s record is durable no checkpoint names the tasks' logs, and a
write that fails or is killed before leaves the application at ``L`` (the logs' records
are released by the changelog's garbage collection like any unreferenced records: the
latest's log floors lie below them, so no application's collection removes them while
they may still be named). A live driver must not hold the application, neither when the
write is planned nor when it commits, and ``L`` must still be the latest at the commit.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...enums import StrEnum
from ...gc_types import LogFloor
from ...handle import ChangelogHandle
from ...keygroups import KeyGroupRange, key_group_range_for_operator
from ..checkpoints.checkpoint import CompletedCheckpoint, KeyedStateHandle, SubtaskState
from ..checkpoints.checkpoint_store import CheckpointStore
from ..snapshots.snapshot import SnapshotHandle
from .entry_changes import StateWriteError, WrittenChanges, colliding_units
from .rewind import COPY_ID_GAP, RewindError, check_not_held
from .state_layers import LayerTarget, joined_snapshot, layers_by_subtask

#: Property of a state write's checkpoint: the checkpoint it applied its rows to.
STATE_WRITE_FROM_PROPERTY = "state_write.from_checkpoint"
#: Property of a state write's checkpoint: how many rows it applied.
STATE_WRITE_ROWS_PROPERTY = "state_write.rows"
#: Property of a state write's checkpoint: when it was committed (epoch ms).
STATE_WRITE_AT_PROPERTY = "state_write.at_ms"
#: Property of a state write's checkpoint: ``apply`` or ``replace`` (:class:`WriteMode`).
STATE_WRITE_MODE_PROPERTY = "state_write.mode"


class WriteMode(StrEnum):
    """What a state write does with the latest checkpoint's keyed state."""

    #: The rows are applied on top of it (upserts and deletes per entry).
    APPLY = "apply"
    #: The rows are the whole keyed state of the operator: nothing of it is carried
    #: (timers neither), its operator state and everything else are.
    REPLACE = "replace"


@dataclass(frozen=True)
class NewApplication:
    """The layout of an application's first checkpoint, written by a state write (a
    bootstrap): what its streaming query's ``StreamingStateConfig`` says."""

    #: The keyed operator (the query's ``operator_id``).
    operator: str
    #: Its subtasks (the query rescales from it when it runs at another).
    parallelism: int
    #: Key groups in all: fixed for the life of the application.
    max_parallelism: int
    #: The changelog topic its state logs to (created when missing).
    changelog_topic: str

    def __post_init__(self) -> None:
        if not self.operator:
            raise StateWriteError("a new application's operator must not be empty")
        if not 1 <= self.parallelism <= self.max_parallelism:
            raise StateWriteError(
                f"a new application's parallelism must be in [1, max parallelism "
                f"{self.max_parallelism}], got {self.parallelism}")


#: The id of an application's first checkpoint when a state write makes it.
FIRST_CHECKPOINT_ID = 1


@dataclass(frozen=True)
class StateWritePlan:
    """What a state write applies its rows to: ``base``, the application's latest
    checkpoint when planned, and the keyed operator written; ``checkpoint_id`` is the
    new checkpoint's id (``base`` + 2). For a bootstrap (``new``), ``base`` is an empty
    checkpoint of id 0 that was never committed, and the new checkpoint is the first."""

    application: str
    operator: str
    base: CompletedCheckpoint
    #: The operator's parallelism in the new checkpoint (None: the base's).
    parallelism: int | None = None
    #: The application's layout when it has no checkpoint (a bootstrap).
    new: NewApplication | None = None
    #: A replacing write's: where its tasks write their snapshot layers.
    layers: LayerTarget | None = None
    #: The application's own changelog topic: where the tasks append when ``base`` names
    #: none (its state all in snapshots) or names it among others (a fork's origin's).
    default_changelog_topic: str | None = None

    @property
    def base_parallelism(self) -> int:
        """The operator's parallelism in the base checkpoint (a new application's)."""
        if self.new is not None:
            return self.new.parallelism
        return len(self.base.subtasks_of(self.operator))

    @property
    def checkpoint_id(self) -> int:
        if self.new is not None:
            return FIRST_CHECKPOINT_ID
        return self.base.checkpoint_id + COPY_ID_GAP

    @property
    def max_parallelism(self) -> int:
        return self.base.max_parallelism

    @property
    def changelog_topic(self) -> str:
        """The topic the operator's state logs to (where the tasks append)."""
        if self.new is not None:
            return self.new.changelog_topic
        return self.chosen_topic("changelog", self.base.topics([self.operator]).changelog,
                                 self.default_changelog_topic)

    def chosen_topic(self, kind: str, named: Iterable[str], own: str | None) -> str:
        """Where the write puts its ``kind`` data: ``own`` (the application's topic) when
        the base names none or names it among others (a fork's data may name its
        origin's too), else the one topic the base names; refused naming the topics."""
        topics = sorted(named)
        if own is not None and (not topics or own in topics):
            return own
        if len(topics) != 1:
            raise StateWriteError(
                f"application {self.application!r} operator {self.operator!r}: checkpoint "
                f"{self.base.checkpoint_id} keeps its {kind} in {len(topics)} topics "
                f"({topics}); name the application's own (option {kind}.topic)")
        return topics[0]


def plan_state_write(store: CheckpointStore, application: str, operator: str | None = None,
                     mode: WriteMode = WriteMode.APPLY, parallelism: int | None = None,
                     new: NewApplication | None = None, snapshot_topic: str | None = None,
                     changelog_topic: str | None = None) -> StateWritePlan:
    """The plan of a state write to ``application``'s latest checkpoint (nothing written).

    ``operator``: the keyed operator written (None: the checkpoint's only one);
    ``parallelism``: the operator's in the new checkpoint (None: the latest's; another
    only when replacing a state without operator state); ``new``: the layout of the
    application's first checkpoint, used only when it has none (a bootstrap);
    ``snapshot_topic`` and ``changelog_topic``: the application's own, where a replacing
    write's layers and an applying write's logs go when the latest checkpoint names none,
    or names them among others (a fork's origin's); otherwise the one it names. Refused
    (:class:`StateWriteError`, naming why) when the application has no checkpoint and no
    ``new`` is given, when a live driver holds it, when the operator is not one of its
    keyed operators, or when the parallelism cannot change."""
    latest = store.latest(application)
    if latest is None:
        if new is None:
            known = store.known_applications()
            raise StateWriteError(
                f"cannot write the state of application {application!r}: it has no "
                f"checkpoint in the checkpoint store (applications there: "
                f"{', '.join(known) or 'none'}); to start it from the rows, give its layout "
                "(options operator and parallelism, see docs/writing-state.md), or let its "
                "query start from them with stateful_foreach_batch(initial_state=...)")
        _check_free(store, application)
        if operator is not None and operator != new.operator:
            raise StateWriteError(
                f"a new application's operator is {new.operator!r}, not {operator!r}")
        if parallelism is not None and parallelism != new.parallelism:
            raise StateWriteError(
                f"a new application's parallelism is {new.parallelism}, not {parallelism}")
        empty = CompletedCheckpoint(application, 0, 0, new.max_parallelism, ())
        return _with_layers(StateWritePlan(application, new.operator, empty, new.parallelism,
                                           new), mode, snapshot_topic)
    _check_free(store, application)
    keyed = [o for o in latest.operators()
             if any(s.keyed is not None for s in latest.subtasks_of(o))]
    if operator is None:
        if len(keyed) != 1:
            raise StateWriteError(
                f"application {application!r} checkpoint {latest.checkpoint_id} has keyed "
                f"operators {keyed}: say which one to write (option operator)")
        operator = keyed[0]
    elif operator not in keyed:
        raise StateWriteError(
            f"application {application!r} checkpoint {latest.checkpoint_id} has no keyed "
            f"operator {operator!r} (keyed operators: {keyed})")
    plan = StateWritePlan(application, operator, latest, parallelism,
                          default_changelog_topic=changelog_topic)
    if parallelism is not None and parallelism != plan.base_parallelism:
        _check_rescale(plan, mode, parallelism)
    return _with_layers(plan, mode, snapshot_topic)


def _with_layers(plan: StateWritePlan, mode: WriteMode, snapshot_topic: str | None
                 ) -> StateWritePlan:
    """``plan`` with the target of its snapshot layers when it replaces the state."""
    if mode is not WriteMode.REPLACE:
        return plan
    topic = plan.chosen_topic("snapshot", plan.base.topics([plan.operator]).snapshot,
                              snapshot_topic)
    used = [s.keyed.materialization_id for s in plan.base.subtasks_of(plan.operator)
            if s.keyed is not None]
    return dataclasses.replace(plan, layers=LayerTarget.planned(
        plan.operator, plan.parallelism or plan.base_parallelism, plan.max_parallelism, topic,
        max(used, default=0)))


def _check_rescale(plan: StateWritePlan, mode: WriteMode, parallelism: int) -> None:
    where = (f"application {plan.application!r} operator {plan.operator!r} runs at "
             f"parallelism {plan.base_parallelism} (checkpoint {plan.base.checkpoint_id})")
    if mode is not WriteMode.REPLACE:
        raise StateWriteError(
            f"{where}: a write applying rows keeps it (they go on top of each subtask's "
            f"state); to write at parallelism {parallelism}, replace the state, or let the "
            "query rescale when it restarts")
    if not 1 <= parallelism <= plan.max_parallelism:
        raise StateWriteError(f"{where}: parallelism must be in [1, max parallelism "
                              f"{plan.max_parallelism}], got {parallelism}")
    if any(s.operator is not None for s in plan.base.subtasks_of(plan.operator)):
        raise StateWriteError(
            f"{where} and has operator state, which a state write does not redistribute: "
            f"write at parallelism {plan.base_parallelism}, and let the query rescale")


def _check_free(store: CheckpointStore, application: str) -> None:
    try:
        check_not_held(store, application, action="write the state of")
    except RewindError as exc:
        raise StateWriteError(str(exc)) from None


def commit_state_write(store: CheckpointStore, plan: StateWritePlan,
                       written: Sequence[tuple[int, WrittenChanges]],
                       properties: Mapping[str, str] | None = None,
                       now_ms: int | None = None,
                       mode: WriteMode = WriteMode.APPLY,
                       log_floors: Sequence[LogFloor] = ()) -> CompletedCheckpoint:
    """Commit the checkpoint of ``plan`` with what the tasks wrote (``(task, written)``
    pairs) and ``properties`` over the base's: their logs appended to the operator's keyed
    handles in task order (:attr:`WriteMode.APPLY`), or their snapshot layers as the
    operator's whole keyed state, under the plan's new backends (:attr:`WriteMode.REPLACE`,
    see :mod:`.state_layers`).

    ``log_floors``: a bootstrap's (the changelog's end offsets before the tasks wrote;
    a write to an existing application keeps the base's).

    Refused (:class:`StateWriteError`, nothing committed) when an entry was written more
    than once, when a driver holds the application, or when a checkpoint was committed
    since the plan was made (for a bootstrap: any checkpoint)."""
    collisions = colliding_units(written)
    if collisions is not None:
        raise StateWriteError(f"state write to application {plan.application!r}: {collisions}")
    _check_free(store, plan.application)
    latest = store.latest(plan.application)
    if plan.new is not None:
        if latest is not None:
            raise StateWriteError(
                f"application {plan.application!r} got checkpoint {latest.checkpoint_id} "
                "while its first state was written (a query or another write started it); "
                "write again, to apply the rows to it")
    elif latest is None or latest.checkpoint_id != plan.base.checkpoint_id:
        found = "none" if latest is None else str(latest.checkpoint_id)
        raise StateWriteError(
            f"application {plan.application!r} moved on while its state was written: the "
            f"write applied its rows to checkpoint {plan.base.checkpoint_id}, the latest is "
            f"now {found}; write again")
    pieces: list[ChangelogHandle] = [
        ChangelogHandle.from_bytes(w.handle_bytes)
        for _, w in sorted(written, key=lambda pair: pair[0]) if w.handle_bytes is not None]
    if plan.layers is not None:
        layers = layers_by_subtask(written)
        subtasks = _made_subtasks(plan, plan.layers.backend_ids, pieces, {
            index: snapshot for index in range(plan.layers.parallelism)
            if (snapshot := joined_snapshot(plan.layers, index, layers.get(index, [])))
            is not None})
    elif plan.new is not None:
        subtasks = _made_subtasks(plan, tuple(
            f"{plan.operator}-{uuid.uuid4().hex[:12]}" for _ in range(plan.base_parallelism)),
            pieces)
    else:
        subtasks = tuple(_with_pieces(s, plan.operator, pieces) for s in plan.base.subtasks)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    checkpoint = dataclasses.replace(
        plan.base, checkpoint_id=plan.checkpoint_id, timestamp_ms=now, subtasks=subtasks,
        log_floors=plan.base.log_floors if plan.new is None else tuple(log_floors),
        properties={**plan.base.properties, **(properties or {}),
                    **({STATE_WRITE_FROM_PROPERTY: str(plan.base.checkpoint_id)}
                       if plan.new is None else {}),
                    STATE_WRITE_ROWS_PROPERTY: str(sum(w.rows for _, w in written)),
                    STATE_WRITE_MODE_PROPERTY: mode.value,
                    STATE_WRITE_AT_PROPERTY: str(now)})
    store.commit(checkpoint)
    return checkpoint


def _made_subtasks(plan: StateWritePlan, backend_ids: Sequence[str],
                   pieces: Sequence[ChangelogHandle],
                   snapshots: Mapping[int, SnapshotHandle] | None = None
                   ) -> tuple[SubtaskState, ...]:
    """The base's subtasks with the written operator's replaced by new backends (one per
    id: the parallelism), each holding its snapshot (a replacing write's joined layers)
    and the tasks' logs narrowed to its key groups; a subtask keeps the base's operator
    state at the same parallelism (another one has none: the plan checked)."""
    parallelism = len(backend_ids)
    same = {s.subtask_index: s for s in plan.base.subtasks_of(plan.operator)
            if s.parallelism == parallelism}
    kept = tuple(s for s in plan.base.subtasks if s.operator_id != plan.operator)
    made = []
    for index, backend_id in enumerate(backend_ids):
        owned = key_group_range_for_operator(plan.max_parallelism, parallelism, index)
        snapshot = (snapshots or {}).get(index)
        keyed = KeyedStateHandle(backend_id, owned,
                                 snapshot.materialization_id if snapshot is not None else 0,
                                 snapshot, _narrowed(pieces, owned))
        base = same.get(index)
        made.append(dataclasses.replace(base, keyed=keyed) if base is not None else
                    SubtaskState(plan.operator, index, parallelism, keyed, None))
    return kept + tuple(made)


def _narrowed(pieces: Sequence[ChangelogHandle], key_groups: KeyGroupRange
              ) -> tuple[ChangelogHandle, ...]:
    """The parts of ``pieces`` in ``key_groups``, in order."""
    return tuple(narrowed for piece in pieces
                 if (narrowed := piece.intersection(key_groups)) is not None)


def _with_pieces(subtask: SubtaskState, operator: str, pieces: Sequence[ChangelogHandle]
                 ) -> SubtaskState:
    keyed = subtask.keyed
    if subtask.operator_id != operator or keyed is None:
        return subtask
    added = _narrowed(pieces, keyed.key_group_range)
    # The entry count is not known any more: a restore counts the entries itself.
    return dataclasses.replace(subtask, keyed=dataclasses.replace(
        keyed, changelog=keyed.changelog + added, entry_count=None))


__all__ = [
    "FIRST_CHECKPOINT_ID",
    "STATE_WRITE_AT_PROPERTY",
    "STATE_WRITE_FROM_PROPERTY",
    "STATE_WRITE_MODE_PROPERTY",
    "STATE_WRITE_ROWS_PROPERTY",
    "NewApplication",
    "StateWritePlan",
    "WriteMode",
    "commit_state_write",
    "plan_state_write",
]
