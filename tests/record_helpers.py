"""Decoding changelog records into named tuples, for tests that look at the wire format."""

from __future__ import annotations

from typing import NamedTuple

from kafka_changelog.change import META_KEY_GROUP
from kafka_changelog.kafka.record_format import decode_record as decode_changes


class LoggedChange(NamedTuple):
    """A change as stored: its change set, its position there, key group and payload."""

    sequence_number: int
    position: int
    key_group: int
    payload: bytes

    @property
    def is_meta(self) -> bool:
        return self.key_group == META_KEY_GROUP


def decode_record(value: bytes) -> tuple[str, list[LoggedChange]]:
    """The log id and changes of a record value; raises ``ValueError`` if malformed."""
    log_id, changes = decode_changes(value)
    return log_id, [LoggedChange(*change) for change in changes]
