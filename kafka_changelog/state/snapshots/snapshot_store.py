"""Snapshot stores: write a materialization as immutable chunks, read a handle back exactly.

Every chunk is a record keyed ``{backend_id}/{key_group}/{materialization_id}/{chunk_no}``
(never overwritten), and the handle remembers its partition and offset. Reading
seeks straight to those offsets and checks key, fields and CRC-32, so an old
handle reads exactly what it was written with, whatever newer materializations
or the log cleaner did since; a discarded chunk (tombstoned, then cleaned)
raises :class:`SnapshotMissingError`. See ``docs/snapshots-and-checkpoints.md``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from ...keygroups import KeyGroupRange, partition_for_key_group
from ...serialization import HEADER_SCHEMA, decode, encode
from ..errors import SnapshotCorruptError, SnapshotMissingError
from ..records import OutRecord, RecordAppender, RecordSource, StoredRecord
from .snapshot import ChunkRef, SnapshotHandle, chunk_key

logger = logging.getLogger(__name__)

CHUNK_SCHEMA = "snapshot_chunk"
CHUNK_SCHEMA_VERSION = 1
HEADER_CRC32 = "kc.crc32"
SCHEMA_HEADER_VALUE = f"{CHUNK_SCHEMA}/{CHUNK_SCHEMA_VERSION}"

KIB = 1024
DEFAULT_MAX_CHUNK_BYTES = 512 * KIB
#: Bytes a chunk record may need beyond its data (key, Avro fields, headers, batch framing).
RECORD_OVERHEAD_BYTES = 16 * KIB
#: The broker's default ``max.message.bytes`` of a topic.
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


_Store = TypeVar("_Store", bound="SnapshotStore")


@dataclass(frozen=True, order=True)
class LiveKey:
    """A key of the snapshot topic whose latest record is not a tombstone."""

    partition: int
    key: str
    #: When its latest record was written (the record's timestamp, ms since the epoch).
    timestamp_ms: int


class SnapshotStore(ABC):
    """Where materializations put their chunks (see the module docstring).

    Implementations provide appending records and fetching a record by offset;
    chunking, handles, verification and errors are the same for all.
    """

    def __init__(self, topic: str, partitions: int, max_parallelism: int,
                 max_chunk_bytes: int) -> None:
        if max_chunk_bytes < 1:
            raise ValueError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        if not 1 <= max_parallelism <= 1 << 15:
            raise ValueError(f"max_parallelism must be in [1, 32768], got {max_parallelism}")
        self.topic = topic
        self.partitions = partitions
        self.max_parallelism = max_parallelism
        self.max_chunk_bytes = max_chunk_bytes

    # -- the operations ------------------------------------------------------------------

    def write(
        self,
        backend_id: str,
        materialization_id: int,
        key_group_range: KeyGroupRange,
        states: Mapping[int, bytes],
        reused: Mapping[int, Sequence[ChunkRef]],
        materialized_sequence_number: int,
    ) -> SnapshotHandle:
        """Write ``states`` as chunks and return the handle once every chunk is acknowledged.

        ``states`` maps a key group to its serialized state (split into chunks of
        at most ``max_chunk_bytes``; ``b""`` is stored as one empty chunk);
        ``reused`` maps a key group to the chunks of an earlier materialization to
        refer to instead (unchanged key groups). Key groups in neither are empty.
        (:meth:`begin_write` does the same one key group at a time.)
        """
        _check_write(backend_id, materialization_id, key_group_range, states, reused,
                     self.max_parallelism)
        writer = self.begin_write(backend_id, materialization_id, key_group_range,
                                  materialized_sequence_number)
        for key_group in sorted(states):
            writer.add(key_group, states[key_group])
        return writer.finish(reused)

    def begin_write(self, backend_id: str, materialization_id: int,
                    key_group_range: KeyGroupRange, materialized_sequence_number: int
                    ) -> SnapshotWriter:
        """A materialization written as its key groups come (:meth:`SnapshotWriter.add`),
        so that only one key group's state is in memory at a time: each one's chunks are
        produced at once (a Kafka store holds at most a bounded amount unacknowledged);
        :meth:`SnapshotWriter.finish` waits for all of them and returns the handle."""
        if not backend_id:
            raise ValueError("backend_id must not be empty")
        if materialization_id < 0:
            raise ValueError(f"materialization id must be >= 0, got {materialization_id}")
        return SnapshotWriter(self, backend_id, materialization_id, key_group_range,
                              materialized_sequence_number)

    def read(
        self, handle: SnapshotHandle, key_group_range: KeyGroupRange | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """(key group, serialized state) for each non-empty key group, ascending (a key
        group with delta layers: each layer in order, see :meth:`read_layers`).

        Restricted to ``key_group_range`` when given. Raises
        :class:`SnapshotMissingError` for a chunk that is gone and
        :class:`SnapshotCorruptError` for one whose content does not match.
        """
        for key_group, data, _ in self.read_layers(handle, key_group_range):
            yield key_group, data

    def read_layers(
        self, handle: SnapshotHandle, key_group_range: KeyGroupRange | None = None,
        held_layers: Mapping[int, int] | None = None,
    ) -> Iterator[tuple[int, bytes, bool]]:
        """(key group, serialized layer, whether it is a delta) for each layer of each
        non-empty key group (see :meth:`SnapshotHandle.layers_of`): every key group's
        whole state first, then their first deltas, and so on, so that a key group's
        layers come in order; within each pass the layers are read in the order they are
        stored (by partition and offset: a materialization's chunks are neighbours in the
        topic, a key group's layers are not). ``held_layers``: key group -> how many of
        its first layers the reader holds already (not read). Errors as :meth:`read`."""
        target = handle if key_group_range is None else handle.intersection(key_group_range)
        if target is None or not target.chunks:
            return
        held = held_layers or {}
        layers = {kg: target.layers_of(kg) for kg in target.key_groups}
        depth = max((len(found) for found in layers.values()), default=0)
        plan = [(chunk, level > 0) for level in range(depth)
                for layer in sorted((found[level] for kg, found in layers.items()
                                     if held.get(kg, 0) <= level < len(found)),
                                    key=lambda chunks: (chunks[0].partition, chunks[0].offset))
                for chunk in layer]
        if not plan:
            return
        source = self._open_source(handle.topic)
        fetched = source.fetch_all([(c.partition, c.offset) for c, _ in plan])
        try:
            parts: list[bytes] = []
            for (chunk, delta), found in zip(plan, fetched, strict=True):
                parts.append(verify_chunk(handle.topic, handle.backend_id, chunk, found))
                if chunk.chunk_no == chunk.chunk_count - 1:  # the layer's last chunk
                    yield (chunk.key_group, parts[0] if len(parts) == 1 else b"".join(parts),
                           delta)
                    parts = []
        finally:
            # The fetch first (its consumers let their partitions go), as when it ends: a
            # Kafka consumer closed while a fetch of its is suspended mid-read can hang.
            fetched.close()
            source.close()

    def delete(self, chunks: Iterable[ChunkRef], backend_id: str) -> None:
        """Tombstone the chunks' keys (blocks until acknowledged) so the log cleaner frees them.

        Deleting a chunk that is already gone is harmless.
        """
        unique = {(c.partition, c.record_key(backend_id)) for c in chunks}
        records = [OutRecord(partition, key.encode(), None, [])
                   for partition, key in sorted(unique)]
        if records:
            self._append(records, f"{len(records)} chunk tombstones of backend {backend_id}")

    def delete_keys(self, keys: Iterable[LiveKey], what: str) -> None:
        """Tombstone ``keys`` (blocks until acknowledged); ``what`` names them in errors."""
        records = [OutRecord(k.partition, k.key.encode(), None, []) for k in sorted(set(keys))]
        if records:
            self._append(records, what)

    def live_keys(self) -> list[LiveKey]:
        """Every key of the topic whose latest record is not a tombstone: the whole topic is
        read (its cost is the topic's size on the brokers)."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its keys")

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

    # -- what implementations provide ------------------------------------------------------

    @abstractmethod
    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        """Append ``records`` durably, in order; their offsets."""

    @abstractmethod
    def _open_source(self, topic: str) -> RecordSource:
        """A reader of single records of ``topic``."""

    def _begin_append(self, what: str) -> RecordAppender:
        """Records appended as they are given (default: collected, then :meth:`_append`)."""
        return _CollectingAppender(self, what)

    # -- chunking ----------------------------------------------------------------------------

    def _chunk_records(
        self, backend_id: str, materialization_id: int, key_group: int, state: bytes
    ) -> Iterator[tuple[ChunkRef, OutRecord]]:
        """The key group's chunk records, made one at a time (a caller that produces each
        before taking the next holds one chunk's copies, not the key group's)."""
        partition = partition_for_key_group(key_group, self.partitions, self.max_parallelism)
        size = self.max_chunk_bytes
        count = max(1, -(-len(state) // size))
        view = memoryview(state)
        for chunk_no in range(count):
            data = bytes(view[chunk_no * size:(chunk_no + 1) * size])
            crc = zlib.crc32(data)
            ref = ChunkRef(key_group, materialization_id, chunk_no, count, partition,
                           0, len(data), crc)
            value = encode(CHUNK_SCHEMA, {
                "backend_id": backend_id,
                "key_group": key_group,
                "materialization_id": materialization_id,
                "chunk_no": chunk_no,
                "chunk_count": count,
                "data": data,
            })
            del data
            headers = [(HEADER_SCHEMA, SCHEMA_HEADER_VALUE.encode()),
                       (HEADER_CRC32, str(crc).encode())]
            key = chunk_key(backend_id, key_group, materialization_id, chunk_no).encode()
            yield ref, OutRecord(partition, key, value, headers)


class _CollectingAppender(RecordAppender):
    def __init__(self, store: SnapshotStore, what: str) -> None:
        self._store = store
        self._what = what
        self._records: list[OutRecord] = []

    def produce(self, record: OutRecord) -> None:
        self._records.append(record)

    def finish(self) -> list[int]:
        records, self._records = self._records, []
        return self._store._append(records, self._what) if records else []


class SnapshotWriter:
    """One materialization being written key group by key group (see
    :meth:`SnapshotStore.begin_write`). Not thread-safe; ``finish`` may run on another
    thread than ``add`` did, after it."""

    def __init__(self, store: SnapshotStore, backend_id: str, materialization_id: int,
                 key_group_range: KeyGroupRange, materialized_sequence_number: int) -> None:
        self._store = store
        self.backend_id = backend_id
        self.materialization_id = materialization_id
        self.key_group_range = key_group_range
        self._upto = materialized_sequence_number
        self._refs: list[ChunkRef] = []
        self._written: set[int] = set()
        self._deltas: set[int] = set()
        self._appender: RecordAppender | None = None
        #: Bytes of state data added.
        self.bytes_added = 0

    def add(self, key_group: int, state: bytes, delta: bool = False) -> None:
        """Write ``key_group``'s serialized state (chunks produced now); with ``delta``,
        a layer on top of the key group's earlier ones, which :meth:`finish` must be given
        as reused (see :meth:`SnapshotHandle.layers_of`)."""
        if (not self.key_group_range.contains(key_group)
                or key_group >= self._store.max_parallelism):
            raise ValueError(
                f"key group {key_group} of backend {self.backend_id} is outside the written "
                f"key-group range {self.key_group_range} (max parallelism "
                f"{self._store.max_parallelism})")
        if key_group in self._written:
            raise ValueError(f"key group {key_group} of backend {self.backend_id} was "
                             f"written twice in materialization {self.materialization_id}")
        self._written.add(key_group)
        if delta:
            self._deltas.add(key_group)
        if self._appender is None:
            self._appender = self._store._begin_append(
                f"snapshot chunks of backend {self.backend_id} materialization "
                f"{self.materialization_id}")
        for ref, record in self._store._chunk_records(
                self.backend_id, self.materialization_id, key_group, state):
            self._appender.produce(record)
            self._refs.append(ref)
        self.bytes_added += len(state)

    def abandon(self) -> int:
        """Tombstone every chunk this writer produced (its materialization failed), after
        waiting for the ones in flight so that no chunk lands after its tombstone.

        Safe: the chunks' keys carry this backend's id and this materialization's id, for
        which no handle was (or will be) returned, so no checkpoint of any application
        refers to them; a retry gets a newer materialization id. Best effort: an error is
        logged, and the chunks then stay until the topic is reset (space, never
        correctness). Returns how many chunk keys were tombstoned.
        """
        if self._appender is not None:
            # Some never landed: tombstoning their keys anyway is harmless.
            with contextlib.suppress(Exception):
                self._appender.finish()
            self._appender = None
        refs, self._refs = self._refs, []
        if not refs:
            return 0
        try:
            self._store.delete(refs, self.backend_id)
        except Exception as exc:
            logger.warning("backend %s: could not tombstone %d chunks of failed "
                           "materialization %d: %s", self.backend_id, len(refs),
                           self.materialization_id, exc)
            return 0
        logger.info("backend %s: tombstoned %d chunks of failed materialization %d",
                    self.backend_id, len(refs), self.materialization_id)
        return len(refs)

    def finish(self, reused: Mapping[int, Sequence[ChunkRef]]) -> SnapshotHandle:
        """Wait for every chunk written; the handle, with ``reused`` (earlier chunks of
        key groups not written, see :meth:`SnapshotStore.write`)."""
        missing = sorted(kg for kg in self._deltas if not reused.get(kg))
        if missing:
            raise ValueError(f"delta layers of key groups {missing} of backend "
                             f"{self.backend_id} have no earlier layers to go on")
        _check_write(self.backend_id, self.materialization_id, self.key_group_range,
                     dict.fromkeys(self._written - self._deltas, b""), reused,
                     self._store.max_parallelism)
        appender, self._appender = self._appender, None  # waited for once (see abandon)
        offsets = appender.finish() if appender is not None else []
        written = [
            ChunkRef(ref.key_group, ref.materialization_id, ref.chunk_no, ref.chunk_count,
                     ref.partition, offset, ref.size, ref.crc32)
            for ref, offset in zip(self._refs, offsets, strict=True)
        ]
        kept = [chunk for key_group in sorted(reused) for chunk in reused[key_group]]
        return SnapshotHandle(
            backend_id=self.backend_id,
            materialization_id=self.materialization_id,
            key_group_range=self.key_group_range,
            topic=self._store.topic,
            chunks=tuple(written + kept),
            materialized_sequence_number=self._upto,
        )


def split_chunks(state: bytes, max_chunk_bytes: int) -> list[bytes]:
    """``state`` in pieces of at most ``max_chunk_bytes`` (one empty piece for ``b""``)."""
    if not state:
        return [b""]
    view = memoryview(state)
    return [bytes(view[i:i + max_chunk_bytes]) for i in range(0, len(state), max_chunk_bytes)]


def _check_write(
    backend_id: str,
    materialization_id: int,
    key_group_range: KeyGroupRange,
    states: Mapping[int, bytes],
    reused: Mapping[int, Sequence[ChunkRef]],
    max_parallelism: int,
) -> None:
    if not backend_id:
        raise ValueError("backend_id must not be empty")
    if materialization_id < 0:
        raise ValueError(f"materialization id must be >= 0, got {materialization_id}")
    for key_group in itertools.chain(states, reused):
        if not key_group_range.contains(key_group) or key_group >= max_parallelism:
            raise ValueError(
                f"key group {key_group} of backend {backend_id} is outside the written "
                f"key-group range {key_group_range} (max parallelism {max_parallelism})"
            )
    both = sorted(set(states) & set(reused))
    if both:
        raise ValueError(
            f"key groups {both} of backend {backend_id} are both written and reused; "
            "expected each key group in at most one of states and reused"
        )
    for key_group, chunks in reused.items():
        wrong = [c for c in chunks if c.key_group != key_group]
        if wrong:
            raise ValueError(
                f"chunks reused for key group {key_group} belong to key group "
                f"{wrong[0].key_group}"
            )
        newer = [c for c in chunks if c.materialization_id >= materialization_id]
        if newer:
            raise ValueError(
                f"chunks reused for key group {key_group} of materialization {materialization_id}"
                f" were written by materialization {newer[0].materialization_id}; expected an "
                "earlier one"
            )


def verify_chunk(
    topic: str, backend_id: str, chunk: ChunkRef, found: StoredRecord | str
) -> bytes:
    """The chunk's data after checking key, fields, size and CRC-32 against ``chunk``."""
    where: dict[str, Any] = {
        "topic": topic, "partition": chunk.partition, "offset": chunk.offset,
        "backend_id": backend_id, "key_group": chunk.key_group,
        "materialization_id": chunk.materialization_id, "chunk_no": chunk.chunk_no,
    }
    if isinstance(found, str):
        raise SnapshotMissingError(**where, found=found)
    expected_key = chunk.record_key(backend_id)
    if found.key != expected_key.encode():
        shown = found.key.decode(errors="replace") if found.key is not None else None
        raise SnapshotMissingError(
            **where, found=f"a record with key {shown!r} instead of {expected_key!r}")
    if found.value is None:
        raise SnapshotMissingError(**where, found=f"a tombstone of key {expected_key!r}")
    schema = dict(found.headers).get(HEADER_SCHEMA)
    if schema is not None and schema != SCHEMA_HEADER_VALUE.encode():
        raise SnapshotCorruptError(**where, what=f"{HEADER_SCHEMA} header",
                                   expected=SCHEMA_HEADER_VALUE,
                                   found=schema.decode(errors="replace"))
    try:
        record = decode(CHUNK_SCHEMA, found.value)
    except Exception as exc:
        raise SnapshotCorruptError(**where, what="record value",
                                   expected=f"a {CHUNK_SCHEMA} record",
                                   found=f"undecodable bytes ({exc})") from exc
    expected_fields = {
        "backend_id": backend_id, "key_group": chunk.key_group,
        "materialization_id": chunk.materialization_id, "chunk_no": chunk.chunk_no,
        "chunk_count": chunk.chunk_count,
    }
    for name, value in expected_fields.items():
        if record[name] != value:
            raise SnapshotCorruptError(**where, what=f"field {name}", expected=value,
                                       found=record[name])
    data: bytes = record["data"]
    if len(data) != chunk.size:
        raise SnapshotCorruptError(**where, what="data size", expected=chunk.size,
                                   found=len(data))
    crc = zlib.crc32(data)
    if crc != chunk.crc32:
        raise SnapshotCorruptError(**where, what="CRC-32 of the data",
                                   expected=f"{chunk.crc32:#010x}", found=f"{crc:#010x}")
    return data


# -- in memory -------------------------------------------------------------------------------


class InMemorySnapshotStore(SnapshotStore):
    """A dict-backed store with the semantics of the Kafka one, for fast tests.

    Offsets come from one counter; deleting a chunk removes it at once (as if the
    log cleaner ran immediately), so reading it raises :class:`SnapshotMissingError`.
    """

    def __init__(
        self,
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
        partitions: int = 16,
        max_parallelism: int = 128,
        topic: str = "in-memory-snapshots",
    ) -> None:
        super().__init__(topic, partitions, max_parallelism, max_chunk_bytes)
        self._lock = threading.Lock()
        self._offsets = itertools.count()
        self._log: dict[tuple[int, int], StoredRecord] = {}
        self._by_key: dict[tuple[int, bytes], set[int]] = {}
        #: When each live key's latest record was written (ms since the epoch).
        self._written_ms: dict[tuple[int, bytes], int] = {}

    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        offsets = []
        with self._lock:
            for record in records:
                offset = next(self._offsets)
                if record.value is None:  # a tombstone: compacted away at once
                    for old in self._by_key.pop((record.partition, record.key), set()):
                        self._log.pop((record.partition, old), None)
                    self._written_ms.pop((record.partition, record.key), None)
                else:
                    self._by_key.setdefault((record.partition, record.key), set()).add(offset)
                    self._written_ms[(record.partition, record.key)] = int(time.time() * 1000)
                self._log[(record.partition, offset)] = StoredRecord(
                    record.key, record.value, list(record.headers))
                offsets.append(offset)
        return offsets

    def _open_source(self, topic: str) -> RecordSource:
        return _MemorySource(self, topic)

    def live_keys(self) -> list[LiveKey]:
        with self._lock:
            return sorted(LiveKey(partition, key.decode(), written)
                          for (partition, key), written in self._written_ms.items())

    def put_record(self, partition: int, offset: int, record: StoredRecord | None) -> None:
        """Replace (or with None remove) the record at an offset: fault injection for tests."""
        with self._lock:
            if record is None:
                self._log.pop((partition, offset), None)
            else:
                self._log[(partition, offset)] = record

    def record_at(self, partition: int, offset: int) -> StoredRecord | None:
        """The record stored at an offset, if any (for tests)."""
        with self._lock:
            return self._log.get((partition, offset))

    @property
    def record_count(self) -> int:
        """Records held (tombstones included)."""
        with self._lock:
            return len(self._log)


class _MemorySource(RecordSource):
    def __init__(self, store: InMemorySnapshotStore, topic: str) -> None:
        self._store = store
        self._topic = topic

    def fetch(self, partition: int, offset: int) -> StoredRecord | str:
        if self._topic != self._store.topic:
            return f"nothing: this in-memory store holds topic {self._store.topic!r} only"
        record = self._store.record_at(partition, offset)
        if record is None:
            return f"no record at offset {offset} (deleted)"
        return record

    def close(self) -> None:
        pass


def finish_or_abandon(writer: SnapshotWriter,
                      reused: Mapping[int, Sequence[ChunkRef]]) -> SnapshotHandle:
    """``writer.finish(reused)``; if it fails, its chunks are tombstoned before the error
    is raised (see :meth:`SnapshotWriter.abandon`)."""
    try:
        return writer.finish(reused)
    except BaseException:
        writer.abandon()
        raise
