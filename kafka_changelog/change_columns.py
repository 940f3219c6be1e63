"""A handle's changes as columns over one byte buffer: what a restore replays in bulk."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .avro_columns import Bytes, Int64s
from .change import StateChange, new_unchecked


@dataclass(frozen=True)
class DecodedChanges:
    """The changes of a handle in sequence order, each once, as
    :meth:`StateChangelogReader.read <kafka_changelog.reader.StateChangelogReader.read>`
    gives them, column-wise: change ``i`` is in key group ``key_groups[i]``
    (:data:`~kafka_changelog.change.META_KEY_GROUP` for a meta change) with the payload
    ``data[payload_starts[i]:payload_starts[i] + payload_lengths[i]]``.

    ``buffer`` is ``data`` as bytes for the column-wise decoders, padded
    (:func:`~kafka_changelog.avro_columns.padded_join`); ``limit`` is the length of the
    changes' bytes (``data`` may hold the padding after them).
    """

    data: bytes
    buffer: Bytes
    limit: int
    key_groups: Int64s
    payload_starts: Int64s
    payload_lengths: Int64s

    def __len__(self) -> int:
        return int(self.key_groups.size)

    def changes(self, rows: Int64s | None = None) -> Iterator[StateChange]:
        """The changes (of ``rows`` only, in that order, when given) one by one: the
        per-change path for what the column-wise decoders leave to it."""
        data = self.data
        if rows is None:
            key_groups = self.key_groups.tolist()
            starts = self.payload_starts.tolist()
            ends = (self.payload_starts + self.payload_lengths).tolist()
        else:
            key_groups = self.key_groups[rows].tolist()
            starts = self.payload_starts[rows].tolist()
            ends = (self.payload_starts[rows] + self.payload_lengths[rows]).tolist()
        for key_group, start, end in zip(key_groups, starts, ends, strict=True):
            yield new_unchecked(StateChange, (key_group, data[start:end]))


__all__ = ["DecodedChanges"]
