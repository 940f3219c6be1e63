"""Planning of the change feed: its options, its offsets, which checkpoints a range spans.

The feed's position is a checkpoint id: offset ``{"checkpoint": c}`` means the changes
of every checkpoint up to ``c`` were emitted, and the range ``(start, end]`` emits the
changes each retained checkpoint ``start < id <= end`` committed over its predecessor
(:mod:`.checkpoint_changes`). :data:`BEGINNING` (``-1``) is the position
before the earliest retained checkpoint, whose changes are then its whole changelog
(allowed only when it restores from no snapshot, so that its changelog holds every
change before it). Pure Python, no pyspark.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kafka_changelog.kafka.checkpoint_store import KafkaCheckpointView
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.checkpoint_store import CheckpointStore

from .checkpoint_changes import FeedTask, committed_changes
from .planning import (
    FORMAT,
    MODE_CHANGES,
    CheckpointSelectionError,
    ReaderOptionError,
    ReaderOptions,
    check_topics,
    existing_topics,
    key_types_of,
    parse_options,
)

logger = logging.getLogger(__name__)

#: The feed position before the earliest retained checkpoint (``startingCheckpoint``
#: ``earliest``).
BEGINNING = -1

#: The feed's options (lower case, as Spark passes them), with what each means.
FEED_OPTIONS: dict[str, str] = {
    "startingcheckpoint": "where the feed starts, exclusive: a checkpoint id (its changes "
                          "are not emitted, those of the checkpoints after it are), "
                          "'latest' or 'earliest' (before the earliest retained checkpoint)",
    "endingcheckpoint": "batch reads: the last checkpoint whose changes are read "
                        "(default: the latest)",
    "failondataloss": "'true' (default): a checkpoint the feed needs that is no longer "
                      "retained is an error; 'false': continue after the earliest retained",
}

LATEST = "latest"
EARLIEST = "earliest"


class GroupSelection(Protocol):
    """What pushed filters select (``spark_integration.reader.pushdown.KeySelection``)."""

    def groups(self, max_parallelism: int, key_types: Sequence[str] | None
               ) -> frozenset[int] | None:
        """The key groups that can hold matching rows (None: all)."""
        ...


class FeedDataLossError(CheckpointSelectionError):
    """A checkpoint the change feed needs is no longer retained (with failOnDataLoss)."""


@dataclass(frozen=True)
class FeedOptions:
    """The parsed options of a change feed (stream) or of changes between checkpoints
    (batch)."""

    reader: ReaderOptions
    #: ``"latest"``, ``"earliest"`` or a checkpoint id (exclusive).
    starting: str | int
    #: Batch reads: the last checkpoint read (None: the latest).
    ending: int | None = None
    #: True (default): a needed checkpoint that is gone raises :class:`FeedDataLossError`.
    fail_on_data_loss: bool = True


def is_feed_read(options: Mapping[str, str]) -> bool:
    """True when the options ask for checkpoints' committed changes (``startingCheckpoint``
    or ``endingCheckpoint`` given): the feed's schema."""
    names = {str(k).lower() for k in options}
    return "startingcheckpoint" in names or "endingcheckpoint" in names


def _checkpoint_value(option: str, raw: str, allowed: tuple[str, ...]) -> str | int:
    value = raw.strip().lower()
    if value in allowed:
        return value
    try:
        number = int(value)
    except ValueError:
        raise ReaderOptionError(
            f"option {option} must be a checkpoint id (an integer) or one of "
            f"{', '.join(allowed)}; got {raw!r}") from None
    if number < 0:
        raise ReaderOptionError(f"option {option} must be >= 0, got {number}")
    return number


def parse_feed_options(options: Mapping[str, str], streaming: bool) -> FeedOptions:
    """Check and parse the options of a feed (``streaming``) or of a batch read between
    checkpoints; raises :class:`ReaderOptionError` naming the option and what is wrong."""
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    feed = {k: lowered.pop(k) for k in list(lowered) if k in FEED_OPTIONS}
    what = "a change feed (readStream)" if streaming else "changes between checkpoints"
    if "checkpoint" in lowered:
        raise ReaderOptionError(
            f"option checkpoint does not go with {what}: use startingCheckpoint"
            + ("" if streaming else " and endingCheckpoint"))
    mode = lowered.get("mode", MODE_CHANGES).strip().lower()
    if mode != MODE_CHANGES:
        raise ReaderOptionError(
            f"{what} is read in mode {MODE_CHANGES!r} only; got option mode {mode!r}")
    reader = parse_options(lowered)
    if "startingcheckpoint" not in feed:
        raise ReaderOptionError(
            f"format('{FORMAT}') needs the option startingCheckpoint for {what}: "
            f"{FEED_OPTIONS['startingcheckpoint']}")
    starting = _checkpoint_value("startingCheckpoint", feed["startingcheckpoint"],
                                 (LATEST, EARLIEST))
    ending: int | None = None
    if "endingcheckpoint" in feed:
        if streaming:
            raise ReaderOptionError(
                "option endingCheckpoint is for batch reads (spark.read); a change feed "
                "runs until it is stopped")
        parsed = _checkpoint_value("endingCheckpoint", feed["endingcheckpoint"], (LATEST,))
        ending = parsed if isinstance(parsed, int) else None
    if isinstance(starting, int) and ending is not None and ending < starting:
        raise ReaderOptionError(
            f"option endingCheckpoint ({ending}) must be >= startingCheckpoint ({starting})")
    raw_loss = feed.get("failondataloss", "true").strip().lower()
    if raw_loss not in ("true", "false"):
        raise ReaderOptionError(f"option failOnDataLoss must be true or false, got {raw_loss!r}")
    return FeedOptions(reader, starting, ending, raw_loss == "true")


def _shown(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids) or "none"


class FeedPlanner:
    """Reads the checkpoint topic (read-only) to place and plan a feed's ranges."""

    def __init__(self, options: FeedOptions) -> None:
        self.options = options

    def _view(self) -> KafkaCheckpointView:
        return KafkaCheckpointView(self.options.reader.checkpoint_config())

    def _ids(self, store: CheckpointStore) -> list[int]:
        reader = self.options.reader
        ids = store.checkpoint_ids(reader.application)
        if not ids:
            raise CheckpointSelectionError(
                f"application {reader.application!r} has no checkpoint in checkpoint topic "
                f"{reader.checkpoint_topic} (options application, checkpoint.topic), so there "
                f"is no change feed to read; applications with checkpoints there: "
                f"{', '.join(store.applications()) or 'none'}")
        return ids

    def start(self) -> int:
        """The position the feed starts from (its initial offset)."""
        starting = self.options.starting
        with self._view() as store:
            ids = self._ids(store)
            latest = store.latest(self.options.reader.application)
        if starting == LATEST:
            return latest.checkpoint_id if latest is not None else ids[-1]
        if starting == EARLIEST:
            return BEGINNING
        assert isinstance(starting, int)
        if starting not in ids and self.options.fail_on_data_loss:
            raise self._lost(starting, ids, "option startingCheckpoint")
        return starting

    def latest(self) -> int:
        """The latest committed checkpoint's id."""
        with self._view() as store:
            self._ids(store)
            latest = store.latest(self.options.reader.application)
        assert latest is not None
        return latest.checkpoint_id

    def _lost(self, checkpoint_id: int, ids: list[int], why: str) -> FeedDataLossError:
        reader = self.options.reader
        return FeedDataLossError(
            f"application {reader.application!r}: the change feed needs checkpoint "
            f"{checkpoint_id} ({why}) to tell what the checkpoints after it committed, but "
            f"it is not retained in checkpoint topic {reader.checkpoint_topic}; retained "
            f"checkpoint ids: {_shown(ids)}. Set failOnDataLoss=false to continue after "
            f"checkpoint {ids[0]} (the changes committed up to it are then not emitted)")

    def checkpoints(self, start: int, end: int
                    ) -> tuple[CompletedCheckpoint | None, list[CompletedCheckpoint]]:
        """The checkpoint at ``start`` (None: :data:`BEGINNING`) and the retained ones in
        ``(start, end]``, oldest first."""
        reader = self.options.reader
        with self._view() as store:
            ids = self._ids(store)
            if start == BEGINNING:
                base: CompletedCheckpoint | None = None
            elif start in ids:
                base = store.get(reader.application, start)
            elif self.options.fail_on_data_loss:
                raise self._lost(start, ids, "where the feed stands")
            else:
                logger.warning(
                    "application %r: checkpoint %d is not retained (retained: %s); the "
                    "change feed continues after checkpoint %d, the changes committed up to "
                    "it are not emitted", reader.application, start, _shown(ids), ids[0])
                below = [i for i in ids if i <= start]
                start = below[-1] if below else ids[0]
                base = store.get(reader.application, start)
            todo = [store.get(reader.application, i) for i in ids if start < i <= end]
        if start == BEGINNING and todo:
            require_whole_changelog(todo[0])
        return base, todo

    def plan(self, start: int, end: int, selection: GroupSelection | None = None
             ) -> list[FeedTask]:
        """The tasks reading the changes of the checkpoints in ``(start, end]``, in order of
        checkpoint (``selection``: only the key groups it selects in each checkpoint, see
        :func:`~.checkpoint_changes.committed_changes`)."""
        reader = self.options.reader
        previous, todo = self.checkpoints(start, end)
        topics = existing_topics(reader) if todo else set()
        tasks: list[FeedTask] = []
        for current in todo:
            operators = current.operators()
            if reader.operator is not None:
                operators = [o for o in operators if o == reader.operator]
            check_topics(current, operators, reader, topics)
            groups = (selection.groups(current.max_parallelism, key_types_of(current))
                      if selection is not None else None)
            tasks.extend(committed_changes(previous, current, operators, reader.slice_offsets,
                                           groups, self.options.fail_on_data_loss))
            previous = current
        return tasks


def require_whole_changelog(checkpoint: CompletedCheckpoint) -> None:
    for subtask in checkpoint.subtasks:
        keyed = subtask.keyed
        if keyed is not None and keyed.snapshot is not None:
            raise CheckpointSelectionError(
                f"checkpoint {checkpoint.checkpoint_id} of application "
                f"{checkpoint.application!r}, the earliest retained, restores operator "
                f"{subtask.operator_id!r} subtask {subtask.subtask_index} from a snapshot "
                f"(materialization {keyed.materialization_id}): its changelog does not hold "
                f"every change before it, so startingCheckpoint=earliest cannot start before "
                f"it; use startingCheckpoint={checkpoint.checkpoint_id} to read the changes "
                f"committed after it")


__all__ = [
    "BEGINNING",
    "EARLIEST",
    "FEED_OPTIONS",
    "LATEST",
    "FeedDataLossError",
    "FeedOptions",
    "FeedPlanner",
    "GroupSelection",
    "is_feed_read",
    "parse_feed_options",
    "require_whole_changelog",
]
