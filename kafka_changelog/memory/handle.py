"""Handles of the in-memory storage: they carry the changes themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..change import StateChange
from ..change_set import ChangeSet
from ..handle import ChangelogHandle
from ..keygroups import KeyGroupRange
from ..sequence import SequenceNumber


class InMemoryChangelogHandle(ChangelogHandle):
    """The persisted change sets of one writer, restricted to a key-group range."""

    kind = "memory"

    def __init__(
        self,
        log_id: str,
        key_group_range: KeyGroupRange,
        change_sets: Sequence[ChangeSet],
        checkpoint_id: int | None = None,
    ) -> None:
        self._log_id = log_id
        self._range = key_group_range
        self._change_sets = tuple(change_sets)
        self._checkpoint_id = checkpoint_id

    @property
    def log_id(self) -> str:
        return self._log_id

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self._range

    @property
    def checkpoint_id(self) -> int | None:
        return self._checkpoint_id

    @property
    def change_sets(self) -> tuple[ChangeSet, ...]:
        """The change sets, ascending by sequence number."""
        return self._change_sets

    @property
    def state_size(self) -> int:
        return sum(change_set.size_bytes for change_set in self._change_sets)

    def intersection(self, key_group_range: KeyGroupRange) -> InMemoryChangelogHandle | None:
        overlap = self._range.intersection(key_group_range)
        if overlap.is_empty:
            return None
        narrowed = [cs.restricted_to(overlap) for cs in self._change_sets]
        return InMemoryChangelogHandle(
            self._log_id, overlap, [cs for cs in narrowed if len(cs)], self._checkpoint_id
        )

    def _to_record(self) -> dict[str, Any]:
        return {
            "log_id": self._log_id,
            "key_group_start": self._range.start,
            "key_group_end": self._range.end,
            "checkpoint_id": self._checkpoint_id,
            "change_sets": [
                {
                    "sequence_number": cs.sequence_number.value,
                    "changes": [
                        {"key_group": kg, "payload": payload}
                        for kg, payload in zip(cs.key_groups, cs.payloads, strict=True)
                    ],
                }
                for cs in self._change_sets
            ],
        }

    @classmethod
    def _from_record(cls, record: dict[str, Any], format_version: int) -> InMemoryChangelogHandle:
        change_sets = [
            ChangeSet.of(
                SequenceNumber(cs["sequence_number"]),
                (StateChange(c["key_group"], c["payload"]) for c in cs["changes"]),
            )
            for cs in record["change_sets"]
        ]
        return cls(
            record["log_id"],
            KeyGroupRange(record["key_group_start"], record["key_group_end"]),
            change_sets,
            record["checkpoint_id"],
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, InMemoryChangelogHandle)
            and self._log_id == other._log_id
            and self._range == other._range
            and self._change_sets == other._change_sets
            and self._checkpoint_id == other._checkpoint_id
        )

    def __hash__(self) -> int:
        return hash((self._log_id, self._range, self._change_sets))

    def __repr__(self) -> str:
        return (
            f"InMemoryChangelogHandle(log={self._log_id}, key_groups={self._range}, "
            f"change_sets={len(self._change_sets)}, bytes={self.state_size})"
        )
