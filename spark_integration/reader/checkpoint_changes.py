"""The changes one checkpoint committed: its changelog handles minus its predecessor's.

A checkpoint's keyed handle holds, per writer log, the log since the last
materialization (and, after a restore, the logs it restored from). So consecutive
checkpoints share most of their changelog: the changes checkpoint N *committed* are
those its handles cover that checkpoint N-1's handles do not. A change is identified
by (log id, key group, sequence number), which is what a handle covers: its log, its
key-group range and its sequence numbers ``[from, to]`` (registrations, key group -1,
are covered by any handle of the log whose sequence numbers include theirs).

:func:`committed_changes` cuts each handle of N against the handles of the same log in
N-1 into pieces (a key-group range and sequence numbers not covered before) and plans
offset slices reading them. Where all covered sequence numbers come before the new ones,
a piece's reading starts at the offset where N-1's ranges ended on that partition: a
writer produces its change sets in sequence-number order through one idempotent
producer, so on one partition the records of later sets come after those of earlier
ones. A materialization between N-1 and N only moves N's ``from`` up: the pieces are
then N's handles past N-1's ``to``. Pure Python, no pyspark.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kafka_changelog.kafka.handle import KafkaChangelogHandle
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint

from .feed_schema import CheckpointStamp
from .planning import (
    CheckpointSelectionError,
    UnreadableCheckpointError,
    key_types_of,
    split_offsets,
)
from .scan import OffsetSlice

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeedTask:
    """One offset slice of the changes one checkpoint committed (one input partition)."""

    operator: str
    subtask: int
    slice: OffsetSlice
    stamp: CheckpointStamp
    #: The key column types the checkpoint records (None: not recorded): ``key_decoded``.
    key_types: tuple[str, ...] | None = None
    #: False: the slice's registrations (``op = 'META'``) are emitted by another task.
    with_meta: bool = True
    #: The slice's share of its range's record bytes (what grouping weighs).
    estimated_bytes: int = 0


def contiguous_groups(tasks: Sequence[FeedTask], groups: int) -> list[tuple[FeedTask, ...]]:
    """``tasks`` cut into at most ``groups`` runs of consecutive tasks of about equal bytes.

    Runs keep the tasks' order, so reading the runs in order reads the tasks in order (what
    keeps a key's changes in commit order across input partitions)."""
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    if not tasks:
        return []
    total = sum(t.estimated_bytes + 1 for t in tasks)
    share = total / min(groups, len(tasks))
    runs: list[tuple[FeedTask, ...]] = []
    current: list[FeedTask] = []
    filled = 0.0
    for task in tasks:
        current.append(task)
        filled += task.estimated_bytes + 1
        if filled >= share * (len(runs) + 1) and len(runs) < groups - 1:
            runs.append(tuple(current))
            current = []
    if current:
        runs.append(tuple(current))
    return runs


@dataclass(frozen=True)
class Piece:
    """Part of a handle not covered before: key groups ``key_groups`` (empty: its
    registrations only) and sequence numbers ``[first, last]``."""

    key_groups: KeyGroupRange
    first: int
    last: int
    with_meta: bool
    #: Per partition, the offset reading may start at (where earlier handles ended).
    resume: dict[int, int] = field(default_factory=dict)


def subtract(first: int, last: int, covered: Iterable[tuple[int, int]]
             ) -> list[tuple[int, int]]:
    """``[first, last]`` minus the union of the inclusive intervals ``covered``, as
    sorted disjoint inclusive intervals."""
    result = []
    at = first
    for low, high in sorted(covered):
        if high < at or low > last:
            continue
        if low > at:
            result.append((at, low - 1))
        at = max(at, high + 1)
        if at > last:
            break
    if at <= last:
        result.append((at, last))
    return result


def _resume(earlier: Sequence[KafkaChangelogHandle], first: int) -> dict[int, int]:
    """Where each partition's reading may start for sequence numbers from ``first``: after
    the ranges of ``earlier``, if all they cover comes before ``first``."""
    if any(e.to_sequence_number >= first for e in earlier):
        return {}
    resume: dict[int, int] = {}
    for e in earlier:
        for r in e.ranges:
            resume[r.partition] = max(resume.get(r.partition, 0), r.end_offset)
    return resume


def new_pieces(handle: KafkaChangelogHandle, earlier: Sequence[KafkaChangelogHandle]
               ) -> list[Piece]:
    """The parts of ``handle`` that the handles ``earlier`` (of the same log) do not cover.

    Key-group pieces never carry registrations, except when the handle is one piece whose
    sequence numbers are exactly the new ones of registrations; otherwise an extra piece
    with no key group carries them (so each is emitted once)."""
    own = handle.key_group_range
    first, last = handle.from_sequence_number, handle.to_sequence_number
    if last < first:
        return []
    # Registrations are new where no earlier handle of the log covered their number.
    meta_new = subtract(first, last, [(e.from_sequence_number, e.to_sequence_number)
                                      for e in earlier])
    pieces: list[Piece] = []
    if not own.is_empty:
        cuts = {own.start, own.end + 1}
        for e in earlier:
            overlap = e.key_group_range.intersection(own)
            if not overlap.is_empty:
                cuts.update((overlap.start, overlap.end + 1))
        bounds = sorted(cuts)
        for low, high in itertools.pairwise(bounds):
            groups = KeyGroupRange(low, high - 1)
            covering = [e for e in earlier if e.key_group_range.contains(low)]
            for a, b in subtract(first, last, [(e.from_sequence_number, e.to_sequence_number)
                                               for e in covering]):
                pieces.append(Piece(groups, a, b, False, _resume(covering, a)))
    if len(pieces) == 1 and meta_new == [(pieces[0].first, pieces[0].last)]:
        only = pieces[0]
        return [Piece(only.key_groups, only.first, only.last, True, only.resume)]
    if handle.meta_partition is not None:
        pieces.extend(Piece(KeyGroupRange.empty(), a, b, True, _resume(earlier, a))
                      for a, b in meta_new)
    return pieces


def kafka_handles(checkpoint: CompletedCheckpoint, operator: str | None = None
                  ) -> Iterable[tuple[str, int, KafkaChangelogHandle]]:
    """(operator, subtask, handle) of every changelog handle of the checkpoint's keyed
    state (of ``operator`` only if given); other kinds than Kafka handles are refused."""
    for subtask in checkpoint.subtasks:
        if subtask.keyed is None or (operator is not None and subtask.operator_id != operator):
            continue
        for handle in subtask.keyed.changelog:
            if not isinstance(handle, KafkaChangelogHandle):
                raise UnreadableCheckpointError(
                    f"checkpoint {checkpoint.checkpoint_id} of application "
                    f"{checkpoint.application!r} holds a changelog handle of kind "
                    f"{handle.kind!r} (operator {subtask.operator_id!r}, subtask "
                    f"{subtask.subtask_index}, log {handle.log_id}); the change feed reads "
                    "Kafka handles only")
            yield subtask.operator_id, subtask.subtask_index, handle


def selected_runs(key_groups: KeyGroupRange, selection: frozenset[int] | None
                  ) -> list[KeyGroupRange]:
    """``key_groups`` (None: all of it) or its selected key groups, as contiguous ranges."""
    if selection is None:
        return [key_groups]
    runs: list[KeyGroupRange] = []
    for group in sorted(g for g in selection if key_groups.contains(g)):
        if runs and runs[-1].end == group - 1:
            runs[-1] = KeyGroupRange(runs[-1].start, group)
        else:
            runs.append(KeyGroupRange(group, group))
    return runs


class ChangesOnlyInSnapshotError(CheckpointSelectionError):
    """Changes a checkpoint committed are in its snapshot only, not in any changelog."""


def check_no_gap(previous: CompletedCheckpoint, current: CompletedCheckpoint, operator: str,
                 subtask: int, handle: KafkaChangelogHandle,
                 earlier: Sequence[KafkaChangelogHandle]) -> None:
    """Raise :class:`ChangesOnlyInSnapshotError` when ``handle`` starts past the sequence
    number after the last one ``earlier`` (its log's handles in ``previous``) covered.

    A log's non-empty change sets have consecutive sequence numbers, so a hole means a
    materialization took the changes in it into its snapshot before they were uploaded:
    the log never held them, and no feed can emit them one by one."""
    covered = [e.to_sequence_number for e in earlier if e.to_sequence_number >= 0]
    if not covered or handle.to_sequence_number < handle.from_sequence_number:
        return
    last = max(covered)
    if handle.from_sequence_number > last + 1:
        raise ChangesOnlyInSnapshotError(
            f"application {current.application!r}: checkpoint {current.checkpoint_id} "
            f"committed the change sets {last + 1}..{handle.from_sequence_number - 1} of log "
            f"{handle.log_id} (operator {operator!r}, subtask {subtask}) inside a "
            f"materialization only: checkpoint {previous.checkpoint_id} covers them up to "
            f"{last}, checkpoint {current.checkpoint_id}'s changelog starts at "
            f"{handle.from_sequence_number}, and they were never written to the changelog. "
            "Read the state of both checkpoints (mode state) for their net effect, or set "
            "failOnDataLoss=false to skip them")


def committed_changes(previous: CompletedCheckpoint | None, current: CompletedCheckpoint,
                      operators: Iterable[str], slice_offsets: int,
                      selection: frozenset[int] | None = None,
                      fail_on_data_loss: bool = True) -> list[FeedTask]:
    """The tasks reading the changes ``current`` committed over ``previous`` (None: every
    change of ``current``'s handles), for ``operators``; slices of at most
    ``slice_offsets`` offsets, in order of operator, subtask, handle, piece, partition.

    ``selection``: only those key groups are read, and no registration (filters on keys
    or key groups, which registrations never pass). Changes only in a materialization
    raise :class:`ChangesOnlyInSnapshotError` (:func:`check_no_gap`) unless
    ``fail_on_data_loss`` is False (then a warning is logged and they are skipped)."""
    earlier: dict[str, list[KafkaChangelogHandle]] = {}
    if previous is not None:
        for _, _, handle in kafka_handles(previous):
            earlier.setdefault(handle.log_id, []).append(handle)
    stamp = CheckpointStamp.of(current.checkpoint_id, current.timestamp_ms, current.properties)
    key_types = key_types_of(current)
    tasks = []
    for operator in operators:
        for _, subtask, handle in sorted(kafka_handles(current, operator),
                                         key=lambda found: found[1]):
            before = earlier.get(handle.log_id, [])
            if previous is not None:
                try:
                    check_no_gap(previous, current, operator, subtask, handle, before)
                except ChangesOnlyInSnapshotError as exc:
                    if fail_on_data_loss:
                        raise
                    logger.warning("%s", exc)
            for piece in new_pieces(handle, before):
                with_meta = piece.with_meta and selection is None
                if piece.key_groups.is_empty and not with_meta:
                    continue
                runs = ([piece.key_groups] if piece.key_groups.is_empty
                        else selected_runs(piece.key_groups, selection))
                for run in runs:
                    for r in handle.ranges:
                        holds_keys = not r.key_groups.intersection(run).is_empty
                        holds_meta = with_meta and r.partition == handle.meta_partition
                        if not (holds_keys or holds_meta):
                            continue
                        start = max(r.start_offset, piece.resume.get(r.partition, 0))
                        for low, high in split_offsets(start, r.end_offset, slice_offsets):
                            share = r.record_bytes * (high - low) // max(1, r.offset_count)
                            tasks.append(FeedTask(operator, subtask, OffsetSlice(
                                handle.topic, r.partition, low, high, handle.log_id,
                                run.start, run.end, piece.first, piece.last), stamp,
                                key_types, with_meta, share))
    return tasks


__all__ = [
    "ChangesOnlyInSnapshotError",
    "FeedTask",
    "Piece",
    "check_no_gap",
    "committed_changes",
    "contiguous_groups",
    "kafka_handles",
    "new_pieces",
    "selected_runs",
    "subtract",
]
