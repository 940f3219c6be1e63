"""Forking an application: NEW starts from a checkpoint of APP, sharing its data by reference.

A fork writes one checkpoint record for NEW into the checkpoint topic APP uses, then NEW's
latest pointer. Nothing else is copied: NEW's checkpoint names APP's snapshot chunks and
changelog ranges as they are. What keeps them while either application needs them:

- every application's garbage collection keeps the chunks and changelog ranges that a
  stored checkpoint of *any* application on the checkpoint topic names (the coordinator's
  GC, ``reset`` and the chunk sweep all read every application's checkpoints), so APP's GC
  keeps what NEW's checkpoints name, and NEW's GC keeps what APP's name;
- NEW's checkpoint records log floors at the changelog's end when the fork was made (no
  higher than APP's floors at the checkpoint), so nothing NEW writes before its first own
  checkpoint is collected by APP.

What NEW inherits and what it does not (invariants):

- **Inherited:** the checkpoint id (NEW's next checkpoint is ``N + 1``), the subtasks'
  key-group ranges, snapshots, changelog handles and operator state, the checkpoint's
  timestamp and properties (processing time, watermark, key types, Spark query and batch),
  plus :data:`FORK_APPLICATION` and :data:`FORK_CHECKPOINT` naming where it came from.
- **Not inherited:** backend ids (each keyed handle gets a fresh one: NEW's backends never
  write chunks under APP's backend ids, so the two never collide and each backend's
  materializations only move forward), guards, subtask commits of a checkpoint in the
  making, and the driver claim (NEW's driver claims NEW; neither fences the other).

Crash-safe order (:func:`plan_fork`, then the caller writes and checks):

1. NEW's checkpoint record (:attr:`ForkPlan.checkpoint_records`);
2. :func:`check_source_retained`: APP's checkpoint N is still among APP's newest ``retain``
   ones, read *after* step 1 is durable. Chunks and changelog ranges of a checkpoint are
   deleted only after retention subsumed it, and every collection that starts after step 1
   sees NEW's record; so while N was never subsumed, nothing it names can be gone. If the
   check fails, step 1 is undone (:attr:`ForkPlan.undo_records`) and the fork is refused;
3. NEW's latest pointer (:attr:`ForkPlan.pointer_records`): from now on the fork is complete.

A fork stopped after step 1 leaves NEW with the checkpoint but no pointer; running the fork
again recognizes it (:attr:`ForkOutcome.COMPLETED`) and does steps 2 and 3.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ...enums import StrEnum
from ...errors import ChangelogError
from ...gc_types import LogFloor
from ..checkpoints.checkpoint import CompletedCheckpoint, KeyedStateHandle, StateTopics
from ..checkpoints.checkpoint_store import (
    DEFAULT_RETAIN,
    CheckpointStore,
    check_retain,
    checkpoint_key,
    latest_key,
)
from ..records import OutRecord

#: Checkpoint property of a forked checkpoint: the application it was forked from.
FORK_APPLICATION = "fork.application"
#: Checkpoint property of a forked checkpoint: the checkpoint id it was forked from.
FORK_CHECKPOINT = "fork.checkpoint_id"


class ForkError(ChangelogError):
    """A fork that cannot be made: what was wrong and what to do instead."""


class ForkOutcome(StrEnum):
    """What :func:`plan_fork` found to do (a ``str``: reports carry the value)."""

    #: NEW does not exist: both records are to be written.
    CREATED = "created"
    #: NEW holds the checkpoint of an interrupted fork of the same source: check and
    #: write the pointer.
    COMPLETED = "completed"
    #: NEW is that fork already, complete: nothing to write.
    ALREADY_FORKED = "already-forked"


@dataclass(frozen=True)
class ForkRequest:
    """``fork SOURCE TARGET [--checkpoint N]``."""

    source: str
    target: str
    #: The source's checkpoint to fork from (None: its latest).
    checkpoint_id: int | None = None
    #: The source's retention (its checkpoint store's ``retain``): only its newest
    #: ``retain`` checkpoints are forked from, since older stored ones may be half collected.
    retain: int = DEFAULT_RETAIN

    def __post_init__(self) -> None:
        try:
            check_retain(self.retain)
        except ValueError as exc:
            raise ForkError(str(exc)) from exc


@dataclass(frozen=True)
class ForkPlan:
    """What a fork writes, in order (module docstring)."""

    request: ForkRequest
    outcome: ForkOutcome
    #: The source's checkpoint forked from.
    source_checkpoint: CompletedCheckpoint
    #: The target's checkpoint (as written, or as found when completing).
    forked: CompletedCheckpoint
    #: Where the checkpoint records are (the checkpoint topic's name, for messages).
    where: str

    @property
    def checkpoint_records(self) -> list[OutRecord]:
        """Step 1: the target's checkpoint record (written again when completing: the
        same bytes, so a compacted topic keeps one)."""
        return [] if self.outcome is ForkOutcome.ALREADY_FORKED else _records(self.forked)[:1]

    @property
    def pointer_records(self) -> list[OutRecord]:
        """Step 3: the target's latest pointer."""
        return [] if self.outcome is ForkOutcome.ALREADY_FORKED else _records(self.forked)[1:]

    @property
    def undo_records(self) -> list[OutRecord]:
        """Tombstones of everything the fork wrote (the pointer first)."""
        target, checkpoint_id = self.forked.application, self.forked.checkpoint_id
        return [OutRecord(0, key.encode(), None, [])
                for key in (latest_key(target), checkpoint_key(target, checkpoint_id))]

    @property
    def topics(self) -> StateTopics:
        """The changelog and snapshot topics the forked state is in (the target must run
        with them)."""
        return self.source_checkpoint.topics()


def fork_origin(checkpoint: CompletedCheckpoint) -> tuple[str, int] | None:
    """The (application, checkpoint id) ``checkpoint`` was forked from; None if it was not."""
    application = checkpoint.properties.get(FORK_APPLICATION)
    source_id = checkpoint.properties.get(FORK_CHECKPOINT)
    if application is None or source_id is None or not source_id.isdigit():
        return None
    return application, int(source_id)


def forked_checkpoint(source: CompletedCheckpoint, target: str,
                      end_offsets: Mapping[str, Mapping[int, int]]) -> CompletedCheckpoint:
    """``source`` as the first checkpoint of ``target`` (module docstring: what is
    inherited). ``end_offsets``: per changelog topic the target will write to, per
    partition, its end offset now; the log floors are these, lowered to the source's."""
    subtasks = tuple(dataclasses.replace(s, keyed=_fresh_backend(s.operator_id, s.keyed))
                     if s.keyed is not None else s for s in source.subtasks)
    floors = {(f.topic, f.partition): f.offset for f in source.log_floors}
    for topic, ends in end_offsets.items():
        for partition, offset in ends.items():
            floors[(topic, partition)] = min(offset, floors.get((topic, partition), offset))
    properties = {**source.properties, FORK_APPLICATION: source.application,
                  FORK_CHECKPOINT: str(source.checkpoint_id)}
    return CompletedCheckpoint(
        target, source.checkpoint_id, source.timestamp_ms, source.max_parallelism, subtasks,
        tuple(LogFloor(t, p, o) for (t, p), o in sorted(floors.items())), properties)


def _fresh_backend(operator_id: str, keyed: KeyedStateHandle) -> KeyedStateHandle:
    # The form of a backend's own ids (keyed_backend.py). The snapshot keeps the source's
    # backend id: its chunks' record keys are made from it.
    return dataclasses.replace(keyed, backend_id=f"{operator_id}-{uuid.uuid4().hex[:12]}")


def _records(checkpoint: CompletedCheckpoint) -> list[OutRecord]:
    # The checkpoint store's own records: the checkpoint, then the latest pointer (a new
    # application has no guards to tombstone).
    return _RECORDS_OF.commit_records(checkpoint)[:2]


class _RecordsOnly(CheckpointStore):
    """A store used only to build records (``commit_records`` needs an instance)."""

    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        raise AssertionError("never written")

    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        raise AssertionError("never written")

    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        raise AssertionError("never written")


_RECORDS_OF = _RecordsOnly()


def retained_ids(view: CheckpointStore, application: str, retain: int) -> list[int]:
    """The application's newest ``retain`` stored checkpoint ids, ascending."""
    return view.checkpoint_ids(application)[-retain:]


#: Per changelog topic (of those given), per partition: its end offset now.
EndOffsets = Callable[[frozenset[str]], Mapping[str, Mapping[int, int]]]


def changelog_topics_of(checkpoint: CompletedCheckpoint) -> frozenset[str]:
    """The changelog topics a checkpoint's handles and log floors name."""
    return checkpoint.topics().changelog | {f.topic for f in checkpoint.log_floors}


def plan_fork(view: CheckpointStore, request: ForkRequest, where: str,
              end_offsets: EndOffsets, changelog_topics: Iterable[str] = ()) -> ForkPlan:
    """What forking ``request.source`` onto ``request.target`` writes, from ``view`` as it
    is now; :class:`ForkError` naming what is wrong when it cannot be done (target equal
    to the source or existing, source unknown or without checkpoints, checkpoint not
    retained). ``where`` names the checkpoint topic in messages; ``end_offsets`` gives
    the end offsets of the source checkpoint's changelog topics and of
    ``changelog_topics`` (the target's log floors, :func:`forked_checkpoint`)."""
    source, target = request.source, request.target
    if source == target:
        raise ForkError(f"cannot fork application {source!r} onto itself: name a new "
                        "application to fork it to")
    known = view.known_applications()
    if source not in known:
        raise ForkError(
            f"application {source!r} is unknown in checkpoint topic {where}; applications "
            f"there: {', '.join(known) or 'none'}")
    retained = retained_ids(view, source, request.retain)
    if not retained:
        raise ForkError(f"application {source!r} has no completed checkpoint in checkpoint "
                        f"topic {where} yet: there is no state to fork")
    wanted = retained[-1] if request.checkpoint_id is None else request.checkpoint_id
    if wanted not in retained:
        raise ForkError(
            f"checkpoint {wanted} of application {source!r} is not retained (retained, with "
            f"retain={request.retain}: {', '.join(map(str, retained))}): its data may be "
            "garbage collected already; fork from a retained checkpoint")
    source_checkpoint = view.get(source, wanted)
    interrupted = _interrupted_fork(view, request, where, source_checkpoint)
    if interrupted is not None:
        return interrupted
    ends = end_offsets(changelog_topics_of(source_checkpoint) | frozenset(changelog_topics))
    return ForkPlan(request, ForkOutcome.CREATED, source_checkpoint,
                    forked_checkpoint(source_checkpoint, target, ends), where)


def _interrupted_fork(view: CheckpointStore, request: ForkRequest, where: str,
                      wanted: CompletedCheckpoint) -> ForkPlan | None:
    """None when the target does not exist; the plan finishing an earlier run of the
    same fork; else :class:`ForkError` (the target exists)."""
    source, target = request.source, request.target
    ids = view.checkpoint_ids(target)
    what = []
    if ids:
        what.append(f"checkpoints {', '.join(map(str, ids))}")
    elif view.has_pointer(target):
        what.append("a latest pointer")
    guards = view.guards(target)
    if guards:
        what.append(f"{len(guards)} changelog guard(s)")
    commits = view.subtask_commit_keys(target)
    if commits:
        what.append(f"{len(commits)} subtask commit(s)")
    claim = view.driver_claim(target)
    if claim is not None:
        what.append("a driver claim")
    if not what:
        return None
    if ids and not guards and not commits and claim is None and len(ids) == 1:
        found = view.get(target, ids[0])
        origin = fork_origin(found)
        if origin is not None and origin[0] == source and (
                request.checkpoint_id is None or request.checkpoint_id == origin[1]):
            # Fork again from what the first run wrote (its checkpoint may be older than
            # the source's latest now): it must still be retained, like any fork's.
            retained = retained_ids(view, source, request.retain)
            if origin[1] not in retained:
                raise ForkError(
                    f"application {target!r} holds an interrupted fork of checkpoint "
                    f"{origin[1]} of application {source!r}, which is no longer retained "
                    f"(retained: {', '.join(map(str, retained)) or 'none'}): its data may "
                    f"be garbage collected. Delete it with 'kafka-changelog reset {target} "
                    "--yes' and fork again")
            outcome = (ForkOutcome.ALREADY_FORKED if view.has_pointer(target)
                       else ForkOutcome.COMPLETED)
            return ForkPlan(request, outcome, view.get(source, origin[1]), found, where)
    raise ForkError(
        f"application {target!r} exists already in checkpoint topic {where} "
        f"({'; '.join(what)}): a fork starts a new application; choose another name, or "
        f"delete it first with 'kafka-changelog reset {target} --yes'")


def check_source_retained(view: CheckpointStore, plan: ForkPlan) -> None:
    """Step 2 (module docstring), with ``view`` read after step 1 is durable:
    :class:`ForkError` when the source checkpoint is no longer among the source's newest
    ``retain`` (its data may have been collected before NEW's record was seen)."""
    source = plan.source_checkpoint
    retained = retained_ids(view, source.application, plan.request.retain)
    if source.checkpoint_id not in retained:
        raise ForkError(
            f"checkpoint {source.checkpoint_id} of application {source.application!r} was "
            f"subsumed while it was forked to {plan.forked.application!r} (retained now: "
            f"{', '.join(map(str, retained)) or 'none'}): its data may be garbage collected, "
            f"so the fork was undone; fork again from a retained checkpoint")


__all__ = ["FORK_APPLICATION", "FORK_CHECKPOINT", "EndOffsets", "ForkError", "ForkOutcome",
           "ForkPlan", "ForkRequest", "changelog_topics_of", "check_source_retained",
           "fork_origin", "forked_checkpoint", "plan_fork", "retained_ids"]
