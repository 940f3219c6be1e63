"""The checkpoint metadata store: completed checkpoints per application, with retention.

A checkpoint is complete once :meth:`CheckpointStore.commit` returns (its record
is acknowledged). Retention keeps the newest ``retain`` checkpoints of an
application always, and with ``retain_for_s`` also every older one committed less
than ``retain_for_s`` seconds ago (:meth:`CheckpointStore.subsumed_ids`: a checkpoint
goes only when it is beyond the count *and* older than the age); ``commit`` returns
the older ones still stored, the caller frees
what only they need and then calls :meth:`CheckpointStore.discard`, which
removes them for good. Until discarded they stay readable, so a caller that
crashed half-way through garbage collection is told again by the next commit.

:class:`KafkaCheckpointStore` keeps everything in one compacted, single-partition
topic (layout in ``docs/snapshots-and-checkpoints.md``) and rebuilds its view by
reading that topic, so a fresh process sees exactly what was committed.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from ...gc_types import LogFloor
from ...serialization import HEADER_SCHEMA, decode, encode
from ..errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CheckpointOrderError,
    CheckpointStoreError,
)
from ..records import OutRecord
from .checkpoint import CompletedCheckpoint
from .driver_claim import DriverClaim, parse_driver_claim_key
from .subtask_commit import (
    SUBTASK_COMMIT_SCHEMA_HEADER,
    SubtaskCommit,
    parse_subtask_commit_key,
    subtask_commit_key,
)

#: The single partition of a store kept as a log (one ordered log: a checkpoint record
#: comes before its latest pointer).
PARTITION = 0

#: The fewest checkpoints retention may keep (the latest and the one before it).
MIN_RETAIN = 2
DEFAULT_RETAIN = 3
#: ``retain`` of a reader that does not know the application's retention: every stored
#: checkpoint counts as retained (garbage collection discards the others promptly).
RETAIN_ALL = 2**31
#: How long a guard counts (seconds): an application's first checkpoint commits within
#: its first batch, so a week-old guard belongs to an application abandoned before it.
DEFAULT_GUARD_LIFETIME_S = 7 * 24 * 3600.0

CHECKPOINT_SCHEMA_HEADER = "checkpoint/1"
POINTER_SCHEMA = "checkpoint_pointer"
POINTER_SCHEMA_HEADER = f"{POINTER_SCHEMA}/1"

#: Largest checkpoint record the store writes (topic ``max.message.bytes`` when created).
MAX_CHECKPOINT_RECORD_BYTES = 8 * 1024 * 1024

_CHECKPOINT_KEY = re.compile(r"^(?P<application>.+)/checkpoint/(?P<checkpoint_id>\d{20})$")
_GUARD_KEY = re.compile(r"^(?P<application>.+)/guard/(?P<guard_id>[0-9a-f]{32})$")
_LATEST_SUFFIX = "/latest"
GUARD_SCHEMA = "changelog_guard"
GUARD_SCHEMA_HEADER = f"{GUARD_SCHEMA}/1"


def checkpoint_key(application: str, checkpoint_id: int) -> str:
    """Record key of a checkpoint: ``{application}/checkpoint/{checkpoint_id:020d}``."""
    return f"{application}/checkpoint/{checkpoint_id:020d}"


def guard_key(application: str, guard_id: str) -> str:
    """Record key of a changelog guard: ``{application}/guard/{guard_id}``."""
    return f"{application}/guard/{guard_id}"


def latest_key(application: str) -> str:
    """Record key of an application's latest-checkpoint pointer: ``{application}/latest``."""
    return f"{application}{_LATEST_SUFFIX}"


def check_guard_lifetime(lifetime_s: float | None) -> None:
    """Raise ``ValueError`` unless ``lifetime_s`` is None or positive."""
    if lifetime_s is not None and not lifetime_s > 0:
        raise ValueError(f"guard_lifetime_s must be None or positive, got {lifetime_s!r}")


def check_retain_for(retain_for_s: float | None) -> None:
    """Raise ``ValueError`` unless ``retain_for_s`` is None or positive."""
    if retain_for_s is not None and not retain_for_s > 0:
        raise ValueError(f"retain_for_s must be None or positive, got {retain_for_s!r}")


def check_retain(retain: int) -> None:
    """Raise ``ValueError`` unless ``retain`` is at least :data:`MIN_RETAIN`."""
    if retain < MIN_RETAIN:
        raise ValueError(
            f"retain must be at least {MIN_RETAIN} (the latest checkpoint and the one before "
            f"it), got {retain}"
        )


_Store = TypeVar("_Store", bound="CheckpointStore")


@dataclass(frozen=True)
class Guard:
    """A changelog guard: where an application started writing before its first checkpoint."""

    guard_id: str
    #: When it was written (epoch ms; None if not known).
    timestamp_ms: int | None
    floors: tuple[LogFloor, ...]


class CheckpointStore(ABC):
    """Completed checkpoints per application (see the module docstring).

    Thread-safe. Implementations provide durable writes and, for shared storage,
    catching up with what other instances wrote (:meth:`_refresh`).
    """

    def __init__(self, retain: int = DEFAULT_RETAIN,
                 guard_lifetime_s: float | None = DEFAULT_GUARD_LIFETIME_S,
                 retain_for_s: float | None = None) -> None:
        check_retain(retain)
        check_guard_lifetime(guard_lifetime_s)
        check_retain_for(retain_for_s)
        self.retain = retain
        #: Checkpoints beyond ``retain`` are kept too while younger than this (seconds,
        #: by their ``timestamp_ms``; None: by count only). See :meth:`subsumed_ids`.
        self.retain_for_s = retain_for_s
        #: How long a guard keeps other applications' GC off its offsets (None: until the
        #: application's first commit or ``reset``, however long that takes).
        self.guard_lifetime_s = guard_lifetime_s
        self._lock = threading.RLock()
        self._checkpoints: dict[str, dict[int, CompletedCheckpoint]] = {}
        self._pointers: dict[str, int] = {}
        self._guards: dict[str, dict[str, tuple[LogFloor, ...]]] = {}
        self._guard_times: dict[tuple[str, str], int] = {}
        #: Per application, (operator, subtask) -> the subtask's latest commit.
        self._subtask_commits: dict[str, dict[tuple[str, int], SubtaskCommit]] = {}
        #: Per application, the driver holding it (``driver_claim.py``).
        self._claims: dict[str, DriverClaim] = {}

    # -- the operations ------------------------------------------------------------------

    def commit(
        self,
        checkpoint: CompletedCheckpoint,
        persist: Callable[[CompletedCheckpoint], None] | None = None,
    ) -> list[CompletedCheckpoint]:
        """Store ``checkpoint`` as the application's latest; the checkpoints retention subsumed.

        Blocks until the checkpoint is durable: it is complete only when this
        returns. The returned checkpoints (oldest first) are those
        :meth:`subsumed_ids` names; they stay stored until :meth:`discard`. Raises
        :class:`CheckpointOrderError` unless the id is greater than the latest.
        ``persist`` replaces the store's own durable write (a transactional commit
        that writes the store's records with others, see ``transactional_commit``);
        it must make the checkpoint durable or raise.
        """
        application = checkpoint.application
        with self._lock:
            self._refresh()
            latest = self._latest_id(application)
            if latest is not None and checkpoint.checkpoint_id <= latest:
                raise CheckpointOrderError(application, checkpoint.checkpoint_id, latest)
            (persist or self._persist_commit)(checkpoint)
            # The commit records tombstone the application's guards (its checkpoints'
            # log floors protect its writes from now on).
            self._guards.pop(application, None)
            stored = self._checkpoints.setdefault(application, {})
            stored[checkpoint.checkpoint_id] = checkpoint
            self._pointers[application] = checkpoint.checkpoint_id
            return [stored[i] for i in self._subsumed(application, int(time.time() * 1000))]

    def subsumed_ids(self, application: str, now_ms: int | None = None) -> list[int]:
        """Stored checkpoints retention no longer keeps at ``now_ms`` (default: now),
        ascending: those beyond the newest ``retain`` that are also older than
        ``retain_for_s`` (committed at or before ``now_ms - retain_for_s``; any age when
        ``retain_for_s`` is None). The newest ``retain`` are always kept."""
        with self._lock:
            self._refresh()
            return self._subsumed(application,
                                  int(time.time() * 1000) if now_ms is None else now_ms)

    def retained_ids(self, application: str, now_ms: int | None = None) -> list[int]:
        """Stored checkpoints retention keeps at ``now_ms`` (default: now), ascending:
        what can be restored, read or rewound to."""
        with self._lock:
            self._refresh()
            return self._retained(application, now_ms)

    def retained_checkpoints(self, application: str, now_ms: int | None = None
                             ) -> list[CompletedCheckpoint]:
        """The checkpoints :meth:`retained_ids` names, ascending, read under one refresh of
        the view (one read of the store, not one per checkpoint)."""
        with self._lock:
            self._refresh()
            stored = self._checkpoints.get(application, {})
            return [stored[i] for i in self._retained(application, now_ms)]

    def _retained(self, application: str, now_ms: int | None) -> list[int]:
        subsumed = set(self._subsumed(
            application, int(time.time() * 1000) if now_ms is None else now_ms))
        return [i for i in self._ids(application) if i not in subsumed]

    def _subsumed(self, application: str, now_ms: int) -> list[int]:
        stored = self._checkpoints.get(application, {})
        ids = sorted(stored)
        beyond = ids[: max(0, len(ids) - self.retain)]
        if self.retain_for_s is None:
            return beyond
        oldest_kept_ms = now_ms - self.retain_for_s * 1000
        return [i for i in beyond if stored[i].timestamp_ms <= oldest_kept_ms]

    def latest(self, application: str) -> CompletedCheckpoint | None:
        """The application's latest completed checkpoint (None before the first)."""
        with self._lock:
            self._refresh()
            latest = self._latest_id(application)
            if latest is None:
                return None
            found = self._checkpoints.get(application, {}).get(latest)
            if found is None:
                raise CheckpointStoreError(
                    f"the latest pointer of application {application!r} names checkpoint "
                    f"{latest}, which is not stored (stored: {self._ids(application)}); "
                    "was it deleted by hand?"
                )
            return found

    def get(self, application: str, checkpoint_id: int) -> CompletedCheckpoint:
        """A stored checkpoint; :class:`CheckpointNotFoundError` names the stored ids if
        missing.

        A committed checkpoint never changes and its id is never used again (a rewind
        copies under a new id), so one the view holds is returned without reading the
        store: a discard by another process is seen at the view's next read (any other
        operation). Only a checkpoint the view lacks is read for."""
        with self._lock:
            found = self._checkpoints.get(application, {}).get(checkpoint_id)
            if found is not None:
                return found
            self._refresh()
            found = self._checkpoints.get(application, {}).get(checkpoint_id)
            if found is None:
                raise CheckpointNotFoundError(application, checkpoint_id,
                                              self._ids(application))
            return found

    def checkpoint_ids(self, application: str) -> list[int]:
        """Ids of the stored checkpoints (subsumed, undiscarded ones too), ascending."""
        with self._lock:
            self._refresh()
            return self._ids(application)

    def applications(self) -> list[str]:
        """Applications with at least one stored checkpoint, sorted."""
        with self._lock:
            self._refresh()
            return sorted(app for app, stored in self._checkpoints.items() if stored)

    def all_checkpoints(self) -> list[CompletedCheckpoint]:
        """Every stored checkpoint of every application (garbage collection of a shared
        changelog topic must keep what any of them needs)."""
        with self._lock:
            self._refresh()
            return [cp for stored in self._checkpoints.values() for cp in stored.values()]

    def all_subtask_commits(self) -> list[SubtaskCommit]:
        """Every subtask's latest committed part of a checkpoint, of every application
        (what a checkpoint in the making will name)."""
        with self._lock:
            self._refresh()
            return [commit for commits in self._subtask_commits.values()
                    for commit in commits.values()]

    def guard(self, application: str, floors: Sequence[LogFloor]) -> str:
        """Record that ``application`` (which has no checkpoint yet) may write changelog
        records at or above ``floors``; returns the guard's id.

        Call it before creating the application's first writers: until the application
        commits a checkpoint, garbage collection by any application sharing the topic
        keeps those offsets (see :meth:`log_floors`).
        """
        guard_id = uuid.uuid4().hex
        with self._lock:
            self._persist_guard(application, guard_id, tuple(floors))
            self._guards.setdefault(application, {})[guard_id] = tuple(floors)
            self._guard_times.setdefault((application, guard_id), int(time.time() * 1000))
        return guard_id

    def _guard_alive(self, application: str, guard_id: str, now_ms: int) -> bool:
        written = self._guard_times.get((application, guard_id))
        return (self.guard_lifetime_s is None or written is None
                or now_ms - written <= self.guard_lifetime_s * 1000)

    def log_floors(self) -> list[LogFloor]:
        """Offsets below which no application may still write records it will reference.

        Per application: the log floors of its latest checkpoint, or, before its first
        checkpoint, those of its guards younger than :attr:`guard_lifetime_s` (an
        application abandoned before its first checkpoint stops pinning the changelog).
        """
        with self._lock:
            self._refresh()
            now_ms = int(time.time() * 1000)
            floors: list[LogFloor] = []
            for application in set(self._checkpoints) | set(self._guards):
                latest_id = self._latest_id(application)
                latest = (self._checkpoints.get(application, {}).get(latest_id)
                          if latest_id is not None else None)
                if latest is not None:
                    floors.extend(latest.log_floors)
                elif latest_id is None:
                    for guard_id, guard in self._guards.get(application, {}).items():
                        if self._guard_alive(application, guard_id, now_ms):
                            floors.extend(guard)
            return floors

    def guards(self, application: str) -> list[Guard]:
        """The application's guards (before its first checkpoint, or left by a crash)."""
        with self._lock:
            self._refresh()
            return [Guard(g, self._guard_times.get((application, g)), floors)
                    for g, floors in sorted(self._guards.get(application, {}).items())]

    def known_applications(self) -> list[str]:
        """Every application with a checkpoint, a latest pointer or a guard, sorted."""
        with self._lock:
            self._refresh()
            found = {a for a, stored in self._checkpoints.items() if stored}
            found |= set(self._pointers)
            found |= {a for a, guards in self._guards.items() if guards}
            return sorted(found)

    def subtask_commits(self, application: str, operator_id: str) -> dict[int, SubtaskCommit]:
        """The latest commit of every subtask of the operator that committed its own part
        of a checkpoint (streaming tasks writing their outputs), by subtask index."""
        with self._lock:
            self._refresh()
            return {subtask: commit for (operator, subtask), commit
                    in sorted(self._subtask_commits.get(application, {}).items())
                    if operator == operator_id}

    def driver_claim(self, application: str) -> DriverClaim | None:
        """The claim of the driver holding ``application`` (None: never claimed or reset)."""
        with self._lock:
            self._refresh()
            return self._claims.get(application)

    def has_pointer(self, application: str) -> bool:
        """Whether the store holds a latest pointer of ``application``."""
        with self._lock:
            self._refresh()
            return application in self._pointers

    def discard(self, application: str, checkpoint_id: int) -> None:
        """Remove a subsumed checkpoint for good (blocking); nothing happens if it is gone.

        The latest checkpoint cannot be discarded (:class:`CheckpointStoreError`).
        """
        with self._lock:
            self._refresh()
            if checkpoint_id == self._latest_id(application):
                raise CheckpointStoreError(
                    f"cannot discard checkpoint {checkpoint_id} of application "
                    f"{application!r}: it is the latest; only subsumed checkpoints "
                    f"({self._ids(application)[:-1]}) can be discarded"
                )
            stored = self._checkpoints.get(application, {})
            if checkpoint_id not in stored:
                return
            self._persist_discard(application, checkpoint_id)
            del stored[checkpoint_id]

    def close(self) -> None:  # noqa: B027 - nothing to release unless overridden
        """Release clients (idempotent)."""

    def __enter__(self: _Store) -> _Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the view --------------------------------------------------------------------------

    def _ids(self, application: str) -> list[int]:
        return sorted(self._checkpoints.get(application, {}))

    def _latest_id(self, application: str) -> int | None:
        candidates = list(self._checkpoints.get(application, {}))
        pointer = self._pointers.get(application)
        if pointer is not None:
            candidates.append(pointer)
        return max(candidates) if candidates else None

    # -- the records of a store kept as a log ---------------------------------------------

    def commit_records(self, checkpoint: CompletedCheckpoint) -> list[OutRecord]:
        """The records (to :attr:`topic`) that make ``checkpoint`` complete once durable:
        the checkpoint itself, then the application's latest pointer."""
        application, checkpoint_id = checkpoint.application, checkpoint.checkpoint_id
        pointer = encode(POINTER_SCHEMA, {
            "application": application, "checkpoint_id": checkpoint_id,
            "timestamp_ms": checkpoint.timestamp_ms})
        with self._lock:
            guards = sorted(self._guards.get(application, {}))
        return [
            OutRecord(PARTITION, checkpoint_key(application, checkpoint_id).encode(),
                      checkpoint.to_bytes(),
                      [(HEADER_SCHEMA, CHECKPOINT_SCHEMA_HEADER.encode())]),
            OutRecord(PARTITION, latest_key(application).encode(), pointer,
                      [(HEADER_SCHEMA, POINTER_SCHEMA_HEADER.encode())]),
            *(OutRecord(PARTITION, guard_key(application, g).encode(), None, [])
              for g in guards),
        ]

    def discard_records(self, application: str, checkpoint_id: int) -> list[OutRecord]:
        """The record that removes a checkpoint: its tombstone."""
        return [OutRecord(PARTITION, checkpoint_key(application, checkpoint_id).encode(), None,
                          [])]

    def guard_records(self, application: str, guard_id: str,
                      floors: tuple[LogFloor, ...]) -> list[OutRecord]:
        """The record of a guard (see :meth:`guard`)."""
        value = encode(GUARD_SCHEMA, {
            "application": application, "timestamp_ms": int(time.time() * 1000),
            "floors": [{"topic": f.topic, "partition": f.partition, "offset": f.offset}
                       for f in floors]})
        return [OutRecord(PARTITION, guard_key(application, guard_id).encode(), value,
                          [(HEADER_SCHEMA, GUARD_SCHEMA_HEADER.encode())])]

    @staticmethod
    def subtask_commit_records(commit: SubtaskCommit) -> list[OutRecord]:
        """The record of a subtask's commit (written in the task's own transaction)."""
        return [OutRecord(PARTITION, commit.key.encode(), commit.to_bytes(),
                          [(HEADER_SCHEMA, SUBTASK_COMMIT_SCHEMA_HEADER.encode())])]

    def subtask_commit_keys(self, application: str) -> list[str]:
        """The record keys of every subtask commit of ``application`` (what a reset
        tombstones)."""
        with self._lock:
            self._refresh()
            return [subtask_commit_key(application, op, s)
                    for op, s in sorted(self._subtask_commits.get(application, {}))]

    def apply_record(self, key_bytes: bytes | None, value: bytes | None, where: str) -> None:
        """Apply one record of the store's log (``where`` names it in errors) to the view."""
        key = (key_bytes or b"").decode(errors="replace")
        subtask_key = parse_subtask_commit_key(key)
        if subtask_key is not None:
            application, operator_id, subtask = subtask_key
            commits = self._subtask_commits.setdefault(application, {})
            if value is None:
                commits.pop((operator_id, subtask), None)
            else:
                commits[(operator_id, subtask)] = SubtaskCommit.from_bytes(value, where)
            return
        claimed = parse_driver_claim_key(key)
        if claimed is not None:
            if value is None:
                self._claims.pop(claimed, None)
            else:
                self._claims[claimed] = DriverClaim.from_bytes(value, where)
            return
        if key.endswith(_LATEST_SUFFIX):
            application = key[: -len(_LATEST_SUFFIX)]
            if value is None:
                self._pointers.pop(application, None)
                return
            try:
                pointer = decode(POINTER_SCHEMA, value)
            except Exception as exc:
                raise CheckpointFormatError(
                    f"cannot decode the latest pointer {key!r} at {where}: {exc}") from exc
            self._pointers[application] = int(pointer["checkpoint_id"])
            return
        guard = _GUARD_KEY.match(key)
        if guard is not None:
            self._apply_guard(guard["application"], guard["guard_id"], value, where)
            return
        match = _CHECKPOINT_KEY.match(key)
        if match is None:
            raise CheckpointFormatError(
                f"unexpected record key {key!r} at {where}; expected "
                "'{application}/checkpoint/{id:020d}', '{application}/latest', "
                "'{application}/guard/{id}', '{application}/driver' or "
                "'{application}/subtask/{operator}/{subtask:05d}'"
            )
        application = match["application"]
        checkpoint_id = int(match["checkpoint_id"])
        if value is None:
            self._checkpoints.get(application, {}).pop(checkpoint_id, None)
            return
        try:
            checkpoint = CompletedCheckpoint.from_bytes(value)
        except CheckpointFormatError as exc:
            raise CheckpointFormatError(f"record {key!r} at {where}: {exc}") from exc
        if (checkpoint.application, checkpoint.checkpoint_id) != (application, checkpoint_id):
            raise CheckpointFormatError(
                f"record {key!r} at {where} holds checkpoint {checkpoint.checkpoint_id} of "
                f"application {checkpoint.application!r}; expected checkpoint {checkpoint_id} "
                f"of application {application!r}"
            )
        self._checkpoints.setdefault(application, {})[checkpoint_id] = checkpoint

    def _apply_guard(self, application: str, guard_id: str, value: bytes | None,
                     where: str) -> None:
        if value is None:
            self._guards.get(application, {}).pop(guard_id, None)
            return
        try:
            record = decode(GUARD_SCHEMA, value)
        except Exception as exc:
            raise CheckpointFormatError(
                f"cannot decode the changelog guard at {where}: {exc}") from exc
        self._guards.setdefault(application, {})[guard_id] = tuple(
            LogFloor(f["topic"], f["partition"], f["offset"]) for f in record["floors"])
        self._guard_times[(application, guard_id)] = int(record["timestamp_ms"])

    # -- what implementations provide ------------------------------------------------------

    @abstractmethod
    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        """Make the checkpoint and the latest pointer durable (blocking)."""

    @abstractmethod
    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        """Remove the checkpoint durably (blocking)."""

    @abstractmethod
    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        """Make a guard durable (blocking)."""

    def _refresh(self) -> None:  # noqa: B027 - a store that is its own truth has nothing to do
        """Bring the view up to date with the durable storage."""


class InMemoryCheckpointStore(CheckpointStore):
    """Checkpoints in a dict, for tests: the same rules as the Kafka store."""

    def _persist_commit(self, checkpoint: CompletedCheckpoint) -> None:
        pass

    def _persist_discard(self, application: str, checkpoint_id: int) -> None:
        pass

    def _persist_guard(self, application: str, guard_id: str,
                       floors: tuple[LogFloor, ...]) -> None:
        pass
