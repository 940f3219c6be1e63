"""Snapshot handles: where each chunk of a materialized key-group range is stored.

A materialization writes the serialized state of each key group as immutable
chunks (records whose keys are never reused); the handle records the topic,
partition, offset, size and CRC-32 of every chunk. Reading the handle later
seeks straight to those offsets, so a newer materialization (or compaction)
never changes what an older handle reads. See ``docs/snapshots-and-checkpoints.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import HandleFormatError
from ...keygroups import KeyGroupRange
from ...serialization import decode, encode

SCHEMA_NAME = "snapshot_handle"
#: Version 2: a key group may have delta layers (:meth:`SnapshotHandle.layers_of`); a handle
#: without any is still written as version 1.
FORMAT_VERSION = 2
_MAGIC = "kafka-changelog-snapshot"
_MAX_CRC32 = 1 << 32


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One stored chunk of one key group's serialized state.

    ``materialization_id`` is the materialization that *wrote* the chunk, which
    is older than the referring handle's when an unchanged key group was reused.
    """

    key_group: int
    materialization_id: int
    chunk_no: int
    chunk_count: int
    partition: int
    offset: int
    size: int
    crc32: int

    def __post_init__(self) -> None:
        for name in ("key_group", "materialization_id", "chunk_no", "partition", "offset",
                     "size"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"chunk {name} must be >= 0, got {value}")
        if not 0 <= self.chunk_no < self.chunk_count:
            raise ValueError(
                f"chunk number {self.chunk_no} of key group {self.key_group} is outside "
                f"[0, {self.chunk_count}) (chunk_count)"
            )
        if not 0 <= self.crc32 < _MAX_CRC32:
            raise ValueError(f"crc32 must be an unsigned 32-bit value, got {self.crc32}")

    def record_key(self, backend_id: str) -> str:
        """The chunk's record key: ``{backend_id}/{key_group}/{materialization_id}/{chunk_no}``."""
        return chunk_key(backend_id, self.key_group, self.materialization_id, self.chunk_no)


def chunk_key(backend_id: str, key_group: int, materialization_id: int, chunk_no: int) -> str:
    """The record key of a chunk (unique: the last three parts are always numbers)."""
    return f"{backend_id}/{key_group}/{materialization_id}/{chunk_no}"


def _sort_key(chunk: ChunkRef) -> tuple[int, int, int]:
    return chunk.key_group, chunk.materialization_id, chunk.chunk_no


def _index(chunks: tuple[ChunkRef, ...], key_group_range: KeyGroupRange) -> dict[
    int, tuple[ChunkRef, ...]
]:
    """Chunks per key group (by layer, then chunk number), after checking that every
    layer of every key group is complete."""
    grouped: dict[tuple[int, int], list[ChunkRef]] = {}
    for chunk in chunks:
        if not key_group_range.contains(chunk.key_group):
            raise ValueError(
                f"chunk {chunk.chunk_no} of key group {chunk.key_group} is outside the "
                f"handle's key-group range {key_group_range}"
            )
        grouped.setdefault((chunk.key_group, chunk.materialization_id), []).append(chunk)
    by_key_group: dict[int, list[ChunkRef]] = {}
    for (key_group, writer), group in sorted(grouped.items()):
        count = group[0].chunk_count
        numbers = [c.chunk_no for c in group]
        counts = {c.chunk_count for c in group}
        if counts != {count} or numbers != list(range(count)):
            raise ValueError(
                f"chunks of key group {key_group} written by materialization {writer} are not "
                f"one complete set: expected chunk numbers 0..{count - 1}, found numbers "
                f"{numbers}, chunk counts {sorted(counts)}"
            )
        by_key_group.setdefault(key_group, []).extend(group)
    return {kg: tuple(group) for kg, group in by_key_group.items()}


@dataclass(frozen=True)
class SnapshotHandle:
    """A materialized snapshot of ``key_group_range`` (immutable, serialisable).

    ``chunks`` are kept sorted by key group, then materialization, then chunk number; a
    key group with no chunks is empty, and one with chunks of several materializations has
    layers (:meth:`layers_of`). ``materialized_sequence_number`` is the writer sequence number
    up to which (exclusive) the snapshot includes changes; it is carried, not used.
    """

    backend_id: str
    materialization_id: int
    key_group_range: KeyGroupRange
    topic: str
    chunks: tuple[ChunkRef, ...]
    materialized_sequence_number: int
    _by_key_group: dict[int, tuple[ChunkRef, ...]] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.materialization_id < 0:
            raise ValueError(f"materialization id must be >= 0, got {self.materialization_id}")
        if self.materialized_sequence_number < 0:
            raise ValueError(
                "materialized sequence number must be >= 0, got "
                f"{self.materialized_sequence_number}"
            )
        ordered = tuple(sorted(self.chunks, key=_sort_key))
        object.__setattr__(self, "chunks", ordered)
        object.__setattr__(self, "_by_key_group", _index(ordered, self.key_group_range))

    @property
    def key_groups(self) -> tuple[int, ...]:
        """Key groups that have chunks, ascending."""
        return tuple(sorted(self._by_key_group))

    def chunks_of(self, key_group: int) -> tuple[ChunkRef, ...]:
        """The chunks of ``key_group``, layer by layer (see :meth:`layers_of`), each by
        chunk number (empty for an empty key group)."""
        return self._by_key_group.get(key_group, ())

    def layers_of(self, key_group: int) -> tuple[tuple[ChunkRef, ...], ...]:
        """The layers of ``key_group``, oldest first: the first is its whole state, each
        later one a *delta* (written by a later, incremental materialization) holding the
        entries of the keys changed since, a key without data meaning deleted."""
        layers: list[tuple[ChunkRef, ...]] = []
        for chunk in self.chunks_of(key_group):
            if chunk.chunk_no == 0:
                layers.append(())
            layers[-1] += (chunk,)
        return tuple(layers)

    @property
    def layered(self) -> bool:
        """Whether some key group has delta layers."""
        return any(len({c.materialization_id for c in chunks}) > 1
                   for chunks in self._by_key_group.values())

    @property
    def state_size(self) -> int:
        """Bytes of chunk data the snapshot refers to (reused chunks included)."""
        return sum(chunk.size for chunk in self.chunks)

    def intersection(self, key_group_range: KeyGroupRange) -> SnapshotHandle | None:
        """The snapshot narrowed to ``key_group_range``; None when the ranges do not overlap."""
        overlap = self.key_group_range.intersection(key_group_range)
        if overlap.is_empty:
            return None
        if overlap == self.key_group_range:
            return self
        return replace(
            self,
            key_group_range=overlap,
            chunks=tuple(c for c in self.chunks if overlap.contains(c.key_group)),
        )

    def to_bytes(self) -> bytes:
        """Serialise (Avro ``schemas/snapshot_handle.avsc`` with a magic and format version)."""
        return encode(SCHEMA_NAME, {
            "magic": _MAGIC,
            # Version 2 only when it matters: readers of version 1 would take a delta
            # layer for a key group's whole state.
            "format_version": FORMAT_VERSION if self.layered else 1,
            "backend_id": self.backend_id,
            "materialization_id": self.materialization_id,
            "key_group_start": self.key_group_range.start,
            "key_group_end": self.key_group_range.end,
            "topic": self.topic,
            "materialized_sequence_number": self.materialized_sequence_number,
            "chunks": [_chunk_record(c) for c in self.chunks],
        })

    @staticmethod
    def from_bytes(data: bytes) -> SnapshotHandle:
        """Inverse of :meth:`to_bytes`; :class:`HandleFormatError` on anything else."""
        try:
            record = decode(SCHEMA_NAME, data)
        except Exception as exc:
            raise HandleFormatError(
                f"not a serialised snapshot handle ({len(data)} bytes): {exc}") from exc
        if record["magic"] != _MAGIC:
            raise HandleFormatError(
                f"not a serialised snapshot handle: magic {record['magic']!r}, "
                f"expected {_MAGIC!r}"
            )
        version = record["format_version"]
        if version > FORMAT_VERSION or version < 1:
            raise HandleFormatError(
                f"snapshot handle format version {version} is not readable by this library "
                f"(reads 1 to {FORMAT_VERSION})"
            )
        try:
            return SnapshotHandle(
                backend_id=record["backend_id"],
                materialization_id=record["materialization_id"],
                key_group_range=KeyGroupRange(record["key_group_start"], record["key_group_end"]),
                topic=record["topic"],
                chunks=_chunks_from_records(record["chunks"]),
                materialized_sequence_number=record["materialized_sequence_number"],
            )
        except ValueError as exc:
            raise HandleFormatError(f"invalid snapshot handle: {exc}") from exc


def _chunk_record(chunk: ChunkRef) -> dict[str, Any]:
    return {
        "key_group": chunk.key_group,
        "materialization_id": chunk.materialization_id,
        "chunk_no": chunk.chunk_no,
        "chunk_count": chunk.chunk_count,
        "partition": chunk.partition,
        "offset": chunk.offset,
        "size": chunk.size,
        "crc32": chunk.crc32,
    }


def _chunks_from_records(records: Iterable[dict[str, Any]]) -> tuple[ChunkRef, ...]:
    return tuple(
        ChunkRef(
            key_group=r["key_group"],
            materialization_id=r["materialization_id"],
            chunk_no=r["chunk_no"],
            chunk_count=r["chunk_count"],
            partition=r["partition"],
            offset=r["offset"],
            size=r["size"],
            crc32=r["crc32"],
        )
        for r in records
    )
