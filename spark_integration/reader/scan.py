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

from confluent_kafka import KafkaError

from kafka_changelog.change import META_KEY_GROUP, new_unchecked
from kafka_changelog.kafka.consume import consume_ranges
from kafka_changelog.kafka.handle import PartitionRange
from kafka_changelog.kafka.reader import KafkaChangelogReader, decode_log_record
from kafka_changelog.kafka.record_format import RawChange
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotView
from kafka_changelog.keygroups import KeyGroupRange
from kafka_changelog.serialization import schemas_dir
from kafka_changelog.state.schema.ops import StateOp


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
        for offset, value in self.records(piece):
            changes = decode_log_record(piece.topic, piece.partition, offset, value,
                                        piece.log_id)
            yield from kept_changes(piece, offset, changes)

    def records(self, piece: OffsetSlice) -> Iterator[tuple[int, bytes]]:
        """(offset, value) of the slice's records of its log, in offset order, values not
        decoded (their schema header checked): what :meth:`scan` decodes."""
        if piece.end_offset <= piece.start_offset:
            return
        # The base class reads ranges; a slice is one.
        as_range = PartitionRange(piece.partition, piece.start_offset, piece.end_offset,
                                  _range_of(piece), 0)
        yield from self.log_values(piece.topic, as_range, piece.log_id)

    def records_of(self, pieces: Sequence[OffsetSlice]) -> list[list[tuple[int, bytes]]]:
        """What :meth:`records` gives for each slice of ``pieces``, the slices read
        together: the slices' offsets of each partition merged into runs, the ``k``-th
        runs of all partitions of a topic read at once (one fetch round trip for all of
        them, not one per slice). Slices may overlap (logs sharing a partition): a record
        goes to every slice of its log whose offsets hold it. Holds every record of
        ``pieces`` (callers bound their bytes); errors as :meth:`records`."""
        found: list[list[tuple[int, bytes]]] = [[] for _ in pieces]
        for topic, rounds in _read_rounds(pieces).items():
            for runs in rounds:
                self._read_run_round(topic, runs, pieces, found)
        return found

    def _read_run_round(self, topic: str, runs: Sequence[_Run], pieces: Sequence[OffsetSlice],
                        found: list[list[tuple[int, bytes]]]) -> None:
        by_partition = {run.partition: run for run in runs}

        def on_error(partition: int, error: KafkaError, position: int) -> int:
            run = by_partition[partition]
            first = pieces[run.slices[0]]
            return self._after_error(topic, PartitionRange(
                partition, run.start, run.end, _range_of(first), 0), first.log_id,
                position, error)

        log_keys = {i: pieces[i].log_id.encode() for run in runs for i in run.slices}
        keys = set(log_keys.values())
        for message in consume_ranges(self._consumer, topic,
                                      [(r.partition, r.start, r.end) for r in runs],
                                      self._timeout, on_error, batch=self._batch):
            key = message.key()
            if key not in keys:
                continue
            partition = message.partition() or 0
            offset = message.offset() or 0
            value: bytes | None = None
            for index in by_partition[partition].slices:
                piece = pieces[index]
                if piece.start_offset <= offset < piece.end_offset and log_keys[index] == key:
                    if value is None:
                        value = self._checked_value(topic, partition, offset, message)
                    found[index].append((offset, value))


@dataclass(frozen=True)
class _Run:
    """Offsets ``[start, end)`` of one partition that slices (indexes) cover together."""

    partition: int
    start: int
    end: int
    slices: tuple[int, ...]


def _read_rounds(pieces: Sequence[OffsetSlice]) -> dict[str, list[list[_Run]]]:
    """Topic -> rounds of runs, at most one run per partition in each round (what one
    :func:`consume_ranges` call reads): the slices of a partition whose offsets overlap
    or touch make one run; its ``k``-th run is read in round ``k``."""
    by_partition: dict[tuple[str, int], list[int]] = {}
    for index, piece in enumerate(pieces):
        if piece.end_offset > piece.start_offset:
            by_partition.setdefault((piece.topic, piece.partition), []).append(index)
    rounds: dict[str, list[list[_Run]]] = {}
    for (topic, partition), indexes in by_partition.items():
        indexes.sort(key=lambda i: pieces[i].start_offset)
        runs: list[_Run] = []
        for index in indexes:
            piece = pieces[index]
            if runs and piece.start_offset <= runs[-1].end:
                last = runs[-1]
                runs[-1] = _Run(partition, last.start, max(last.end, piece.end_offset),
                                (*last.slices, index))
            else:
                runs.append(_Run(partition, piece.start_offset, piece.end_offset, (index,)))
        topic_rounds = rounds.setdefault(topic, [])
        for k, run in enumerate(runs):
            if k == len(topic_rounds):
                topic_rounds.append([])
            topic_rounds[k].append(run)
    return rounds


#: Estimated record bytes of the slices read at once (held until decoded).
WINDOW_BYTES = 32 << 20


def read_windows(sizes: Sequence[int], budget: int) -> list[range]:
    """Consecutive index ranges of ``sizes`` (estimated bytes) of at most ``budget``
    bytes each (an item above it alone): what :meth:`SliceReader.records_of` reads at
    once."""
    windows: list[range] = []
    start = 0
    filled = 0
    for index, size in enumerate(sizes):
        if index > start and filled + size > budget:
            windows.append(range(start, index))
            start, filled = index, 0
        filled += size
    if start < len(sizes):
        windows.append(range(start, len(sizes)))
    return windows


def kept_changes(piece: OffsetSlice, offset: int,
                 changes: list[RawChange]) -> Iterator[ScannedChange]:
    """The changes of the record at ``offset`` (decoded) that the slice keeps: sequence
    numbers in its span, key groups in its range, registrations always."""
    first_sqn, last_sqn = piece.from_sequence_number, piece.to_sequence_number
    lowest, highest = piece.key_group_start, piece.key_group_end
    for sqn, index, key_group, payload in changes:
        if first_sqn <= sqn <= last_sqn and (
            key_group == META_KEY_GROUP or lowest <= key_group <= highest
        ):
            yield new_unchecked(ScannedChange, (offset, sqn, index, key_group, payload))


def _range_of(piece: OffsetSlice) -> KeyGroupRange:
    if piece.key_group_end < piece.key_group_start:
        return KeyGroupRange.empty()
    return KeyGroupRange(piece.key_group_start, piece.key_group_end)


# -- snapshot chunks ---------------------------------------------------------------------------


#: The read-only snapshot store the reader uses (kept under its old name).
ChunkReader = KafkaSnapshotView


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


def decode_state_op(payload: bytes) -> DecodedOp:
    """The fields of a ``StateOp`` payload (``StateOp.from_bytes``, the hand-written
    decoder); raises ``ValueError`` (``AvroDecodeError``) naming what is wrong."""
    op = StateOp.from_bytes(payload)
    values = op.values
    return DecodedOp(op.state, op.op.value, op.key, op.map_key, op.value,
                     list(values) if values is not None else None)


__all__ = [
    "OP_SYMBOLS",
    "WINDOW_BYTES",
    "ChunkReader",
    "DecodedOp",
    "OffsetSlice",
    "ScannedChange",
    "SliceReader",
    "decode_state_op",
    "kept_changes",
    "read_windows",
]
