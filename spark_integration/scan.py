"""Worker-side reading: one offset slice of a changelog partition, snapshot chunks, payloads.

An input partition of ``format("kafka-changelog")`` reads either an offset slice
``[start, end)`` of one changelog partition (mode ``changes``) or the state of a
key-group slice of one subtask (mode ``state``). Slices follow the error rules of
:class:`~kafka_changelog.kafka.KafkaChangelogReader`, whose consumer handling this
module reuses:

- a slice starting below the partition's log start raises
  :class:`~kafka_changelog.errors.ChangelogTruncatedError` (topic, partition, offsets);
- an undecodable record (or state-op payload) raises
  :class:`~kafka_changelog.errors.RecordDecodeError` naming its offset;
- offsets may have gaps; a slice is done when the position reaches its end.

Nothing here imports pyspark.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kafka_changelog.change import META_KEY_GROUP
from kafka_changelog.errors import ChangelogError
from kafka_changelog.kafka.handle import PartitionRange
from kafka_changelog.kafka.reader import KafkaChangelogReader
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.serialization import schemas_dir
from kafka_changelog.state.kafka_io import OutRecord
from kafka_changelog.state.snapshot_store import (
    SnapshotStore,
    SnapshotStoreConfig,
    _KafkaSource,
    _RecordSource,
)


@dataclass(frozen=True)
class OffsetSlice:
    """Offsets ``[start_offset, end_offset)`` of one partition, filtered like a handle.

    Only records keyed by ``log_id`` count; of their changes, those with sequence
    numbers in ``[from_sequence_number, to_sequence_number]`` and key groups in
    ``[key_group_start, key_group_end]`` are kept (meta changes always).
    """

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    log_id: str
    key_group_start: int
    key_group_end: int
    from_sequence_number: int
    to_sequence_number: int

    def __post_init__(self) -> None:
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(
                f"offset slice of {self.topic}[{self.partition}] must satisfy 0 <= start <= "
                f"end, got [{self.start_offset}, {self.end_offset})"
            )

    @property
    def offset_count(self) -> int:
        """Offsets the slice spans (records of other writers included)."""
        return self.end_offset - self.start_offset


class ScannedChange(NamedTuple):
    """A change as found in a slice: where its record is, its place in its change set."""

    offset: int
    sequence_number: int
    position: int
    key_group: int
    payload: bytes


#: ``tuple.__new__``: builds a ScannedChange from decoded, already valid parts.
_new_scanned = tuple.__new__


class SliceReader(KafkaChangelogReader):
    """A :class:`KafkaChangelogReader` that also reads single offset slices, in offset order.

    ``read(handle)`` still works (the state mode replays handles with it); ``scan``
    reads one slice without sorting or de-duplicating, so every change keeps its
    offset and the slice's output never depends on other slices.
    """

    def __enter__(self) -> SliceReader:
        return self

    def scan(self, piece: OffsetSlice) -> Iterator[ScannedChange]:
        """The kept changes of the slice's records, in offset order (append order within)."""
        if piece.end_offset <= piece.start_offset:
            return
        # The base class reads ranges; a slice is one.
        as_range = PartitionRange(piece.partition, piece.start_offset, piece.end_offset,
                                  _range_of(piece), 0)
        first_sqn, last_sqn = piece.from_sequence_number, piece.to_sequence_number
        lowest, highest = piece.key_group_start, piece.key_group_end
        for offset, changes in self.log_records(piece.topic, as_range, piece.log_id):
            for c in changes:
                sqn, key_group = c["sequence_number"], c["key_group"]
                if first_sqn <= sqn <= last_sqn and (
                    key_group == META_KEY_GROUP or lowest <= key_group <= highest
                ):
                    yield _new_scanned(ScannedChange, (
                        offset, sqn, c["index"], key_group, c["payload"]))

def _range_of(piece: OffsetSlice) -> KeyGroupRange:
    if piece.key_group_end < piece.key_group_start:
        return KeyGroupRange.empty()
    return KeyGroupRange(piece.key_group_start, piece.key_group_end)


# -- snapshot chunks ---------------------------------------------------------------------------


class ChunkReader(SnapshotStore):
    """A read-only :class:`SnapshotStore` over Kafka: no topic check, no producer.

    :class:`~kafka_changelog.state.snapshot_store.KafkaSnapshotStore` creates or
    validates its topic and starts an idempotent producer, which a reader neither
    needs nor may be allowed to (READ ACLs only). Reading, verification and errors
    are the store's own.
    """

    def __init__(self, config: SnapshotStoreConfig) -> None:
        super().__init__(config.topic, config.partitions, config.max_parallelism,
                         config.max_chunk_bytes)
        self.config = config

    def _append(self, records: Sequence[OutRecord], what: str) -> list[int]:
        raise ChangelogError(
            f"cannot write {what}: the Spark reader opens snapshot topic {self.topic} read-only")

    def _open_source(self, topic: str) -> _RecordSource:
        return _KafkaSource(self.config, topic)


# -- state-op payloads ---------------------------------------------------------------------------


def _op_symbols() -> tuple[str, ...]:
    """The enum symbols of ``StateOp.op``, from the schema file (the contract)."""
    schema = json.loads((schemas_dir() / "state_op.avsc").read_text(encoding="utf-8"))
    for state_field in schema["fields"]:
        if state_field["name"] == "op":
            return tuple(state_field["type"]["symbols"])
    raise RuntimeError("schemas/state_op.avsc has no field 'op'")


OP_SYMBOLS = _op_symbols()


class DecodedOp(NamedTuple):
    """The fields of a ``StateOp`` payload (``schemas/state_op.avsc``)."""

    state: str
    op: str
    key: bytes
    map_key: bytes | None
    value: bytes | None
    values: list[bytes] | None


def _long(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro long (zig-zag varint) at ``pos``: (value, next position)."""
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    n = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        byte = data[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes at byte {pos}")


def _bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    size, pos = _long(data, pos)
    end = pos + size
    if size < 0 or end > len(data):
        raise ValueError(f"bytes of length {size} at byte {pos} overrun the {len(data)}-byte value")
    return data[pos:end], end


def _optional_bytes(data: bytes, pos: int, name: str) -> tuple[bytes | None, int]:
    branch, pos = _long(data, pos)
    if branch == 0:
        return None, pos
    if branch != 1:
        raise ValueError(f"union branch {branch} of field {name} is neither 0 (null) nor 1")
    return _bytes(data, pos)


def decode_state_op(payload: bytes) -> DecodedOp:
    """Decode a ``StateOp`` payload (Avro binary, hand-decoded: the hot path of a scan).

    Equal to ``StateOp.from_bytes`` field by field (tested); raises ``ValueError``
    naming what is wrong for anything that is not exactly one ``StateOp``.
    """
    return _decode_short(payload) or _decode_any(payload)


#: ``tuple.__new__``: builds a DecodedOp from checked parts.
_new_op = tuple.__new__
_SYMBOL_COUNT = len(OP_SYMBOLS)


def _decode_short(p: bytes) -> DecodedOp | None:
    """The common case fast: every length and count below 64 (one-byte varints), at most
    one block of values. None for anything else (then :func:`_decode_any` decides).

    A byte ``b`` with ``b & 0x81 == 0`` is a one-byte varint of the non-negative value
    ``b >> 1``. Slices never raise; an overrun leaves ``pos`` past the end, which the
    next index (IndexError) or the final length check catches.
    """
    try:
        b = p[0]
        if b & 0x81:
            return None
        pos = 1 + (b >> 1)
        state = p[1:pos]
        b = p[pos]
        if b & 0x81 or b >> 1 >= _SYMBOL_COUNT:
            return None
        op = OP_SYMBOLS[b >> 1]
        b = p[pos + 1]
        if b & 0x81:
            return None
        start = pos + 2
        pos = start + (b >> 1)
        key = p[start:pos]
        b = p[pos]
        map_key: bytes | None = None
        if b == 2:
            b = p[pos + 1]
            if b & 0x81:
                return None
            start = pos + 2
            pos = start + (b >> 1)
            map_key = p[start:pos]
        elif b:
            return None
        else:
            pos += 1
        b = p[pos]
        value: bytes | None = None
        if b == 2:
            b = p[pos + 1]
            if b & 0x81:
                return None
            start = pos + 2
            pos = start + (b >> 1)
            value = p[start:pos]
        elif b:
            return None
        else:
            pos += 1
        b = p[pos]
        values: list[bytes] | None = None
        if b == 2:
            b = p[pos + 1]
            if b & 0x81:
                return None
            pos += 2
            values = []
            for _ in range(b >> 1):
                b = p[pos]
                if b & 0x81:
                    return None
                start = pos + 1
                pos = start + (b >> 1)
                values.append(p[start:pos])
            if p[pos]:  # another block follows
                return None
            pos += 1
        elif b:
            return None
        else:
            pos += 1
        if pos != len(p):
            return None
        return _new_op(DecodedOp, (state.decode(), op, key, map_key, value, values))
    except (IndexError, UnicodeDecodeError):
        return None


def _decode_any(payload: bytes) -> DecodedOp:
    """Any valid ``StateOp`` payload; ``ValueError`` naming what is wrong otherwise."""
    try:
        size, pos = _long(payload, 0)
        end = pos + size
        if size < 0 or end > len(payload):
            raise ValueError(f"state name of length {size} overruns the value")
        state = payload[pos:end].decode()
        symbol, pos = _long(payload, end)
        if not 0 <= symbol < len(OP_SYMBOLS):
            raise ValueError(f"op symbol {symbol} is not one of {len(OP_SYMBOLS)} symbols")
        key, pos = _bytes(payload, pos)
        map_key, pos = _optional_bytes(payload, pos, "map_key")
        value, pos = _optional_bytes(payload, pos, "value")
        branch, pos = _long(payload, pos)
        values: list[bytes] | None = None
        if branch == 1:
            values = []
            while True:
                count, pos = _long(payload, pos)
                if count == 0:
                    break
                if count < 0:  # a block with its byte size
                    count = -count
                    _, pos = _long(payload, pos)
                for _ in range(count):
                    item, pos = _bytes(payload, pos)
                    values.append(item)
        elif branch != 0:
            raise ValueError(f"union branch {branch} of field values is neither 0 (null) nor 1")
    except IndexError:
        raise ValueError(f"state op truncated ({len(payload)} bytes)") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"state name is not UTF-8: {exc}") from None
    if pos != len(payload):
        raise ValueError(f"{len(payload) - pos} trailing bytes after the state op")
    return DecodedOp(state, OP_SYMBOLS[symbol], key, map_key, value, values)


__all__ = [
    "OP_SYMBOLS",
    "ChunkReader",
    "DecodedOp",
    "OffsetSlice",
    "ScannedChange",
    "SliceReader",
    "decode_state_op",
]
