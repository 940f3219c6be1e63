"""What a completed checkpoint holds: per operator subtask, its keyed and operator state.

Keyed state is a materialized snapshot plus the changelog written since (Flink's
changelog state backend); operator state is small and stored inline. A
:class:`CompletedCheckpoint` round-trips through bytes (Avro,
``schemas/checkpoint.avsc``) so the checkpoint store can keep it in Kafka.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...avro_binary import AvroDecodeError, read_long, read_string
from ...errors import HandleFormatError
from ...gc_types import LogFloor
from ...handle import ChangelogHandle
from ...keygroups import KeyGroupRange, check_parallelism
from ...serialization import decode, encode
from ..errors import CheckpointFormatError, MaxParallelismMismatchError
from ..snapshots.snapshot import SnapshotHandle

SCHEMA_NAME = "checkpoint"
SUBTASK_SCHEMA_NAME = "subtask_state"
#: Version 2 added ``log_floors`` and ``properties``; version 1 records still read.
FORMAT_VERSION = 3
_SCHEMA_OF_VERSION = {1: "checkpoint_v1", 2: "checkpoint_v2", 3: SCHEMA_NAME}
_MAGIC = "kafka-changelog-checkpoint"


@dataclass(frozen=True)
class KeyedStateHandle:
    """Keyed state of one backend: a snapshot (or none yet) plus the changelog since.

    ``changelog`` is replayed in order on top of ``snapshot``. ``entry_count``, when
    known, is the number of entries of that state (what
    :meth:`~kafka_changelog.state.tables.protocol.KeyedStateTable.entry_count` gives
    after restoring it): the backend's count when it took the snapshot; a narrowed handle
    has none.
    """

    backend_id: str
    key_group_range: KeyGroupRange
    materialization_id: int
    snapshot: SnapshotHandle | None
    changelog: tuple[ChangelogHandle, ...]
    entry_count: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "changelog", tuple(self.changelog))

    def intersection(self, key_group_range: KeyGroupRange) -> KeyedStateHandle | None:
        """The handle narrowed to ``key_group_range``; None when the ranges do not overlap.

        The snapshot and every changelog handle are narrowed; parts that do not
        overlap are dropped.
        """
        overlap = self.key_group_range.intersection(key_group_range)
        if overlap.is_empty:
            return None
        if overlap == self.key_group_range:
            return self
        snapshot = self.snapshot.intersection(overlap) if self.snapshot is not None else None
        changelog = tuple(
            narrowed for handle in self.changelog
            if (narrowed := handle.intersection(overlap)) is not None
        )
        return KeyedStateHandle(self.backend_id, overlap, self.materialization_id, snapshot,
                                changelog)

    @property
    def state_size(self) -> int:
        """Bytes of snapshot data plus changelog payload."""
        snapshot = self.snapshot.state_size if self.snapshot is not None else 0
        return snapshot + sum(handle.state_size for handle in self.changelog)

    def topics(self) -> StateTopics:
        """The topics holding this state's data: of the changelog handles that cover
        records (handles of storages without topics have none) and of a snapshot with
        chunks."""
        changelog = frozenset(
            topic for handle in self.changelog
            if (topic := getattr(handle, "topic", None)) is not None
            and not getattr(handle, "is_empty", False))
        snapshot = (frozenset({self.snapshot.topic})
                    if self.snapshot is not None and self.snapshot.chunks else frozenset())
        return StateTopics(changelog, snapshot)


@dataclass(frozen=True)
class StateTopics:
    """The changelog and snapshot topics some state's handles read from."""

    changelog: frozenset[str] = frozenset()
    snapshot: frozenset[str] = frozenset()

    def __or__(self, other: StateTopics) -> StateTopics:
        return StateTopics(self.changelog | other.changelog, self.snapshot | other.snapshot)

    @property
    def all(self) -> frozenset[str]:
        """Every topic, of either kind."""
        return self.changelog | self.snapshot


@dataclass(frozen=True)
class OperatorStateHandle:
    """Operator (non-keyed) state of one subtask: list and union-list states by name."""

    operator_id: str
    subtask_index: int
    list_states: dict[str, tuple[bytes, ...]]
    union_states: dict[str, tuple[bytes, ...]]


@dataclass(frozen=True)
class SubtaskState:
    """The state of one subtask of one operator in a checkpoint."""

    operator_id: str
    subtask_index: int
    parallelism: int
    keyed: KeyedStateHandle | None
    operator: OperatorStateHandle | None

    def to_bytes(self) -> bytes:
        """Serialise (Avro ``schemas/subtask_state.avsc``): what a task reports."""
        return encode(SUBTASK_SCHEMA_NAME, _subtask_record(self))

    @staticmethod
    def from_bytes(data: bytes) -> SubtaskState:
        """Inverse of :meth:`to_bytes`; :class:`CheckpointFormatError` on anything else."""
        try:
            return _subtask_from_record(decode(SUBTASK_SCHEMA_NAME, data))
        except Exception as exc:
            raise CheckpointFormatError(
                f"not a serialised subtask state ({len(data)} bytes): {exc}") from exc

    def __post_init__(self) -> None:
        if not 0 <= self.subtask_index < self.parallelism:
            raise ValueError(
                f"subtask index {self.subtask_index} of operator {self.operator_id!r} is "
                f"outside [0, {self.parallelism}) (parallelism)"
            )


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint every subtask acknowledged: what a restore starts from."""

    application: str
    checkpoint_id: int
    timestamp_ms: int
    max_parallelism: int
    subtasks: tuple[SubtaskState, ...]
    #: Where the application may still write changelog records a later checkpoint uses.
    log_floors: tuple[LogFloor, ...] = ()
    #: Free-form metadata (the streaming layer records the Spark query and batch).
    properties: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.application:
            raise ValueError("application must not be empty")
        if self.checkpoint_id < 0:
            raise ValueError(f"checkpoint id must be >= 0, got {self.checkpoint_id}")
        check_parallelism(self.max_parallelism)
        object.__setattr__(self, "log_floors", tuple(sorted(self.log_floors)))
        subtasks = tuple(self.subtasks)
        object.__setattr__(self, "subtasks", subtasks)
        seen: dict[tuple[str, int], SubtaskState] = {}
        parallelism: dict[str, int] = {}
        for subtask in subtasks:
            key = (subtask.operator_id, subtask.subtask_index)
            if key in seen:
                raise ValueError(
                    f"checkpoint {self.checkpoint_id} holds subtask {subtask.subtask_index} "
                    f"of operator {subtask.operator_id!r} twice"
                )
            seen[key] = subtask
            known = parallelism.setdefault(subtask.operator_id, subtask.parallelism)
            if known != subtask.parallelism:
                raise ValueError(
                    f"operator {subtask.operator_id!r} has subtasks with parallelism {known} "
                    f"and {subtask.parallelism} in checkpoint {self.checkpoint_id}"
                )

    def require_max_parallelism(self, max_parallelism: int) -> None:
        """Raise :class:`MaxParallelismMismatchError` unless the checkpoint was written with
        ``max_parallelism`` (the number of key groups): with another, a key's key group
        ``hash mod max_parallelism`` changes, and keyed state restored from it would be
        found under the wrong key groups or not at all."""
        if max_parallelism != self.max_parallelism:
            raise MaxParallelismMismatchError(
                f"application {self.application!r}: checkpoint {self.checkpoint_id} was written "
                f"with max parallelism {self.max_parallelism}, not {max_parallelism}: keys "
                f"would move to other key groups and lose their state. Keep max_parallelism="
                f"{self.max_parallelism} (any parallelism up to it restores the checkpoint), "
                "or start a new application.")

    def operators(self) -> list[str]:
        """Ids of the operators with state in this checkpoint, sorted."""
        return sorted({subtask.operator_id for subtask in self.subtasks})

    def topics(self, operators: Iterable[str] | None = None) -> StateTopics:
        """The topics the keyed state of ``operators`` (None: all) reads from."""
        wanted = None if operators is None else set(operators)
        found = StateTopics()
        for subtask in self.subtasks:
            if subtask.keyed is not None and (wanted is None or subtask.operator_id in wanted):
                found |= subtask.keyed.topics()
        return found

    def subtasks_of(self, operator_id: str) -> list[SubtaskState]:
        """The subtasks of ``operator_id``, by subtask index (empty if unknown)."""
        return sorted((s for s in self.subtasks if s.operator_id == operator_id),
                      key=lambda s: s.subtask_index)

    def to_bytes(self) -> bytes:
        """Serialise (Avro ``schemas/checkpoint.avsc``; handles embedded as their bytes)."""
        return encode(SCHEMA_NAME, {
            "magic": _MAGIC,
            "format_version": FORMAT_VERSION,
            "application": self.application,
            "checkpoint_id": self.checkpoint_id,
            "timestamp_ms": self.timestamp_ms,
            "max_parallelism": self.max_parallelism,
            "subtasks": [_subtask_record(s) for s in self.subtasks],
            "log_floors": [{"topic": f.topic, "partition": f.partition, "offset": f.offset}
                           for f in self.log_floors],
            "properties": dict(self.properties),
        })

    @staticmethod
    def from_bytes(data: bytes) -> CompletedCheckpoint:
        """Inverse of :meth:`to_bytes`; :class:`CheckpointFormatError` on anything else."""
        magic, version = _peek_header(data)
        if magic != _MAGIC:
            raise CheckpointFormatError(
                f"not a serialised checkpoint: magic {magic!r}, expected {_MAGIC!r}")
        if version not in _SCHEMA_OF_VERSION:
            raise CheckpointFormatError(
                f"checkpoint format version {version} is not readable by this library "
                f"(reads 1 to {FORMAT_VERSION})"
            )
        try:
            record = decode(_SCHEMA_OF_VERSION[version], data)
        except Exception as exc:
            raise CheckpointFormatError(
                f"not a serialised checkpoint of format version {version} ({len(data)} "
                f"bytes): {exc}") from exc
        where = f"checkpoint {record['checkpoint_id']} of application {record['application']!r}"
        try:
            return CompletedCheckpoint(
                application=record["application"],
                checkpoint_id=record["checkpoint_id"],
                timestamp_ms=record["timestamp_ms"],
                max_parallelism=record["max_parallelism"],
                subtasks=tuple(_subtask_from_record(s) for s in record["subtasks"]),
                log_floors=tuple(LogFloor(f["topic"], f["partition"], f["offset"])
                                 for f in record.get("log_floors", ())),
                properties=dict(record.get("properties", {})),
            )
        except (HandleFormatError, ValueError) as exc:
            raise CheckpointFormatError(f"invalid {where}: {exc}") from exc


def _peek_header(data: bytes) -> tuple[str, int]:
    """The magic string and format version every format starts with."""
    try:
        magic, position = read_string(data, 0, "checkpoint magic")
        version, _ = read_long(data, position, "checkpoint format version")
    except AvroDecodeError as exc:
        raise CheckpointFormatError(
            f"not a serialised checkpoint ({len(data)} bytes): {exc}") from exc
    return magic, version


def _subtask_record(subtask: SubtaskState) -> dict[str, Any]:
    keyed = subtask.keyed
    operator = subtask.operator
    return {
        "operator_id": subtask.operator_id,
        "subtask_index": subtask.subtask_index,
        "parallelism": subtask.parallelism,
        "keyed": None if keyed is None else {
            "backend_id": keyed.backend_id,
            "key_group_start": keyed.key_group_range.start,
            "key_group_end": keyed.key_group_range.end,
            "materialization_id": keyed.materialization_id,
            "snapshot": keyed.snapshot.to_bytes() if keyed.snapshot is not None else None,
            "changelog": [handle.to_bytes() for handle in keyed.changelog],
            "entry_count": keyed.entry_count,
        },
        "operator": None if operator is None else {
            "operator_id": operator.operator_id,
            "subtask_index": operator.subtask_index,
            "list_states": {k: list(v) for k, v in operator.list_states.items()},
            "union_states": {k: list(v) for k, v in operator.union_states.items()},
        },
    }


def _subtask_from_record(record: dict[str, Any]) -> SubtaskState:
    keyed = record["keyed"]
    operator = record["operator"]
    return SubtaskState(
        operator_id=record["operator_id"],
        subtask_index=record["subtask_index"],
        parallelism=record["parallelism"],
        keyed=None if keyed is None else KeyedStateHandle(
            backend_id=keyed["backend_id"],
            key_group_range=KeyGroupRange(keyed["key_group_start"], keyed["key_group_end"]),
            materialization_id=keyed["materialization_id"],
            snapshot=(SnapshotHandle.from_bytes(keyed["snapshot"])
                      if keyed["snapshot"] is not None else None),
            changelog=tuple(ChangelogHandle.from_bytes(b) for b in keyed["changelog"]),
            entry_count=keyed.get("entry_count"),
        ),
        operator=None if operator is None else OperatorStateHandle(
            operator_id=operator["operator_id"],
            subtask_index=operator["subtask_index"],
            list_states={k: tuple(v) for k, v in operator["list_states"].items()},
            union_states={k: tuple(v) for k, v in operator["union_states"].items()},
        ),
    )
