"""The changelog record: one writer's changes for one partition, self-describing for tools.

Key: the log id (UTF-8). Value: a ``ChangeBatch`` (``schemas/change_batch.avsc``,
schemaless Avro binary). Headers say what the record holds without decoding it,
so ``kcat -f '%k %h'`` shows it: ``kc.log_id``, ``kc.key_groups`` and
``kc.sequence_numbers`` (``first-last``, inclusive) and ``kc.schema``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..avro_binary import (
    SMALL_LIMIT,
    SMALL_VARINTS,
    AvroDecodeError,
    read_bytes,
    read_long,
    read_string,
    varint,
    zigzag_varint,
)
from ..change import META_KEY_GROUP

SCHEMA_NAME = "change_batch"
SCHEMA_VERSION = 1
SCHEMA_HEADER_VALUE = f"{SCHEMA_NAME}/{SCHEMA_VERSION}"

HEADER_LOG_ID = "kc.log_id"
HEADER_KEY_GROUPS = "kc.key_groups"
HEADER_SEQUENCE_NUMBERS = "kc.sequence_numbers"
HEADER_SCHEMA = "kc.schema"

#: Bytes an encoded change may take beyond its payload (varints, conservatively).
CHANGE_OVERHEAD_BYTES = 30


#: (sequence number, index in its change set, key group, payload): a change on the wire.
RawChange = tuple[int, int, int, bytes]


class LoggedChange(NamedTuple):
    """A change as stored: its change set, its position there, key group and payload."""

    sequence_number: int
    position: int
    key_group: int
    payload: bytes

    @property
    def is_meta(self) -> bool:
        return self.key_group == META_KEY_GROUP


@dataclass(frozen=True)
class EncodedRecord:
    """A record ready to produce, with what it covers."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    sequence_numbers: tuple[int, int]
    key_groups: tuple[int, int]
    #: Distinct sequence numbers of the changes in the record, ascending.
    members: tuple[int, ...]


def encode_value(log_id: str, changes: Sequence[RawChange]) -> bytes:
    """The Avro binary of a ``ChangeBatch`` (byte-identical to fastavro's, tested).

    Hand-written because it is the hot path of every persist: per change it only
    joins cached varints and the payload.
    """
    name = log_id.encode()
    parts = [varint(len(name)), name]
    if changes:
        parts.append(varint(len(changes)))
        small, limit = SMALL_VARINTS, SMALL_LIMIT
        last_sqn = None
        sqn_bytes = b""
        for sqn, index, key_group, payload in changes:
            if sqn != last_sqn:
                sqn_bytes, last_sqn = varint(sqn), sqn
            size = len(payload)
            parts += (
                sqn_bytes,
                small[index + 1] if index < limit else zigzag_varint(index),
                small[key_group + 1] if key_group < limit else zigzag_varint(key_group),
                small[size + 1] if size < limit else zigzag_varint(size),
                payload,
            )
    parts.append(b"\x00")
    return b"".join(parts)


def encode_record(log_id: str, changes: Sequence[RawChange]) -> EncodedRecord:
    """One record of ``changes`` (all of one writer and one partition, ascending order)."""
    first_sqn, last_sqn = changes[0][0], changes[-1][0]
    groups = [c[2] for c in changes if c[2] != META_KEY_GROUP]
    key_groups = (min(groups), max(groups)) if groups else (META_KEY_GROUP, META_KEY_GROUP)
    headers = [
        (HEADER_LOG_ID, log_id.encode()),
        (HEADER_KEY_GROUPS, f"{key_groups[0]}-{key_groups[1]}".encode()),
        (HEADER_SEQUENCE_NUMBERS, f"{first_sqn}-{last_sqn}".encode()),
        (HEADER_SCHEMA, SCHEMA_HEADER_VALUE.encode()),
    ]
    members = tuple(sorted({c[0] for c in changes}))
    return EncodedRecord(log_id.encode(), encode_value(log_id, changes), headers,
                         (first_sqn, last_sqn), key_groups, members)


def split_into_records(
    log_id: str, changes: Sequence[RawChange], max_record_bytes: int
) -> Iterator[EncodedRecord]:
    """Records of at most ``max_record_bytes`` each (a larger single change gets its own)."""
    batch: list[RawChange] = []
    size = 0
    for change in changes:
        cost = len(change[3]) + CHANGE_OVERHEAD_BYTES
        if batch and size + cost > max_record_bytes:
            yield encode_record(log_id, batch)
            batch, size = [], 0
        batch.append(change)
        size += cost
    if batch:
        yield encode_record(log_id, batch)


class UnknownSchemaError(ValueError):
    """The record says it was written with a schema this library does not read."""


def check_schema_header(headers: Sequence[tuple[str, str | bytes | None]] | None) -> None:
    """Refuse a record whose ``kc.schema`` header is missing or names another version."""
    for name, value in headers or ():
        if name == HEADER_SCHEMA:
            found = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            if found != SCHEMA_HEADER_VALUE:
                raise UnknownSchemaError(
                    f"record schema {found!r} is not supported (this library reads "
                    f"{SCHEMA_HEADER_VALUE!r})"
                )
            return
    raise UnknownSchemaError(f"record has no {HEADER_SCHEMA} header")


def decode_record(value: bytes) -> tuple[str, list[LoggedChange]]:
    """The log id and changes of a record value; raises ``ValueError`` if malformed."""
    log_id, changes = decode_record_changes(value)
    return log_id, [LoggedChange._make(c) for c in changes]


def decode_record_changes(value: bytes) -> tuple[str, list[RawChange]]:
    """The log id and changes of a record value as plain tuples (the restore hot path).

    Hand-written (the inverse of :func:`encode_value`, tested against fastavro). Any
    valid Avro encoding is read (multi-block arrays, blocks with byte sizes); anything
    else raises :class:`~kafka_changelog.avro_binary.AvroDecodeError` (a
    ``ValueError``) naming the field and the byte.
    """
    try:
        return _decode_common(value)
    except (IndexError, UnicodeDecodeError, _NotCommon):
        pass
    # Truncated, malformed or just unusual: the careful decoder reads it or says why.
    try:
        return _decode_any(value)
    except AvroDecodeError as exc:
        raise AvroDecodeError(f"not a {SCHEMA_NAME} Avro value: {exc}") from None


class _NotCommon(Exception):
    """Raised by the fast path for anything it leaves to the careful decoder."""


def _decode_common(value: bytes) -> tuple[str, list[RawChange]]:
    """The encoding :func:`encode_value` writes, fast: varints inline, one block.

    Out-of-range reads raise IndexError and anything unusual raises _NotCommon: the
    caller then decodes again with :func:`_decode_any`, which names the problem.
    """
    b = value[0]
    if b & 0x81:
        raise _NotCommon
    pos = 1 + (b >> 1)
    log_id = value[1:pos].decode()
    # The one block: its count (a non-negative varint), or 0 for no changes.
    count = 0
    shift = 0
    while True:
        b = value[pos]
        pos += 1
        count |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    if count & 1:  # a negative count (a block with its size) is for _decode_any
        raise _NotCommon
    count >>= 1
    size_of_value = len(value)
    changes: list[RawChange] = []
    keep = changes.append
    for _ in range(count):
        # Sequence number: any long (several bytes once the log has grown).
        n = 0
        shift = 0
        while True:
            b = value[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                raise _NotCommon
        sqn = (n >> 1) ^ -(n & 1)
        b = value[pos]
        if b >= 0x80:
            raise _NotCommon
        index = (b >> 1) ^ -(b & 1)
        b = value[pos + 1]
        if b < 0x80:
            key_group = (b >> 1) ^ -(b & 1)
            pos += 2
        else:
            b2 = value[pos + 2]
            if b2 >= 0x80:
                raise _NotCommon
            n = (b & 0x7F) | (b2 << 7)
            key_group = (n >> 1) ^ -(n & 1)
            pos += 3
        # Payload length: one to three varint bytes, never negative.
        b = value[pos]
        if b < 0x80:
            n = b
            pos += 1
        else:
            b2 = value[pos + 1]
            if b2 < 0x80:
                n = (b & 0x7F) | (b2 << 7)
                pos += 2
            else:
                b3 = value[pos + 2]
                if b3 >= 0x80:
                    raise _NotCommon
                n = (b & 0x7F) | ((b2 & 0x7F) << 7) | (b3 << 14)
                pos += 3
        if n & 1:
            raise _NotCommon
        end = pos + (n >> 1)
        if end > size_of_value:
            raise _NotCommon
        keep((sqn, index, key_group, value[pos:end]))
        pos = end
    if value[pos] != 0 or pos + 1 != size_of_value:
        raise _NotCommon
    return log_id, changes


def _decode_any(value: bytes) -> tuple[str, list[RawChange]]:
    """Any valid encoding of a ChangeBatch, or an AvroDecodeError naming what is wrong."""
    log_id, pos = read_string(value, 0, "ChangeBatch.log_id")
    changes: list[RawChange] = []
    keep = changes.append
    while True:
        count, pos = read_long(value, pos, "ChangeBatch.changes block count")
        if count == 0:
            break
        if count < 0:  # a block followed by its size in bytes
            count = -count
            _, pos = read_long(value, pos, "ChangeBatch.changes block size")
        for _ in range(count):
            sqn, pos = read_long(value, pos, "LoggedChange.sequence_number")
            index, pos = read_long(value, pos, "LoggedChange.index")
            key_group, pos = read_long(value, pos, "LoggedChange.key_group")
            payload, pos = read_bytes(value, pos, "LoggedChange.payload")
            keep((sqn, index, key_group, payload))
    if pos != len(value):
        raise AvroDecodeError(
            f"malformed ChangeBatch: {len(value) - pos} trailing bytes after byte {pos}")
    return log_id, changes
