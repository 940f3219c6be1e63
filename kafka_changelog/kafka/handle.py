"""Handles of the Kafka storage: offset ranges of a topic, per partition."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..handle import ChangelogHandle
from ..keygroups import KeyGroupRange

#: Secret librdkafka settings that printed kcat commands read from the environment.
KCAT_SECRET_VARIABLES: dict[str, str] = {
    "sasl.password": "KAFKA_SASL_PASSWORD",
    "ssl.key.password": "KAFKA_SSL_KEY_PASSWORD",
    "ssl.keystore.password": "KAFKA_SSL_KEYSTORE_PASSWORD",
}

@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Offsets ``[start_offset, end_offset)`` of one partition holding a handle's records."""

    partition: int
    start_offset: int
    end_offset: int
    key_groups: KeyGroupRange
    record_bytes: int

    @property
    def offset_count(self) -> int:
        """Offsets spanned (other writers' records included)."""
        return self.end_offset - self.start_offset


class KafkaChangelogHandle(ChangelogHandle):
    """A persisted piece of one writer's log: offset ranges in ``topic``.

    Reading keeps only records keyed by ``log_id``, changes with sequence numbers
    in ``[from_sequence_number, to_sequence_number]`` and key groups in
    ``key_group_range`` (meta changes always), so other writers sharing the
    partitions and changes outside a narrowed range are skipped.
    """

    kind = "kafka"

    def __init__(
        self,
        log_id: str,
        topic: str,
        key_group_range: KeyGroupRange,
        ranges: Sequence[PartitionRange],
        from_sequence_number: int,
        to_sequence_number: int,
        meta_partition: int | None = None,
        checkpoint_id: int | None = None,
    ) -> None:
        self._log_id = log_id
        self.topic = topic
        self._range = key_group_range
        self.ranges = tuple(sorted(ranges, key=lambda r: r.partition))
        self.from_sequence_number = from_sequence_number
        self.to_sequence_number = to_sequence_number
        self.meta_partition = meta_partition
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
    def state_size(self) -> int:
        return sum(r.record_bytes for r in self.ranges)

    @property
    def is_empty(self) -> bool:
        """True when the handle covers no record."""
        return not self.ranges

    def intersection(self, key_group_range: KeyGroupRange) -> KafkaChangelogHandle | None:
        overlap = self._range.intersection(key_group_range)
        if overlap.is_empty:
            return None
        kept = []
        for r in self.ranges:
            groups = r.key_groups.intersection(overlap)
            if not groups.is_empty or r.partition == self.meta_partition:
                kept.append(PartitionRange(
                    r.partition, r.start_offset, r.end_offset, groups, r.record_bytes))
        return KafkaChangelogHandle(
            self._log_id, self.topic, overlap, kept, self.from_sequence_number,
            self.to_sequence_number, self.meta_partition, self._checkpoint_id,
        )

    def to_spark_offsets(self) -> tuple[str, str]:
        """Spark Kafka source ``startingOffsets`` and ``endingOffsets`` (JSON) of the ranges."""
        starting = {self.topic: {str(r.partition): r.start_offset for r in self.ranges}}
        ending = {self.topic: {str(r.partition): r.end_offset for r in self.ranges}}
        return json.dumps(starting), json.dumps(ending)

    def kcat_commands(self, bootstrap_servers: str,
                      client_settings: Mapping[str, Any] | None = None) -> list[str]:
        """kcat commands that print exactly the records of each range (key, headers, offset).

        ``client_settings`` (librdkafka, security included) go on as ``-X key=value``;
        secrets are not printed: the shell takes them from the environment variables
        :data:`KCAT_SECRET_VARIABLES` names (``$KAFKA_SASL_PASSWORD``, ...)."""
        options = "".join(
            f" -X {shlex.quote(key + '=')}"
            + (f'"${KCAT_SECRET_VARIABLES[key]}"' if key in KCAT_SECRET_VARIABLES
               else shlex.quote(str(value)))
            for key, value in (client_settings or {}).items() if not callable(value))
        return [
            f"kcat -C -b {bootstrap_servers}{options} -t {self.topic} -p {r.partition} "
            f"-o {r.start_offset} -c {r.offset_count} -e -f '%p@%o key=%k headers=%h bytes=%S\\n'"
            for r in self.ranges
            if r.offset_count > 0
        ]

    def _to_record(self) -> dict[str, Any]:
        return {
            "log_id": self._log_id,
            "topic": self.topic,
            "key_group_start": self._range.start,
            "key_group_end": self._range.end,
            "checkpoint_id": self._checkpoint_id,
            "from_sequence_number": self.from_sequence_number,
            "to_sequence_number": self.to_sequence_number,
            "meta_partition": self.meta_partition,
            "ranges": [
                {"partition": r.partition, "start_offset": r.start_offset,
                 "end_offset": r.end_offset, "key_group_start": r.key_groups.start,
                 "key_group_end": r.key_groups.end, "record_bytes": r.record_bytes}
                for r in self.ranges
            ],
        }

    @classmethod
    def _from_record(cls, record: dict[str, Any], format_version: int) -> KafkaChangelogHandle:
        ranges = [
            PartitionRange(
                r["partition"], r["start_offset"], r["end_offset"],
                KeyGroupRange(r["key_group_start"], r["key_group_end"]), r["record_bytes"],
            )
            for r in record["ranges"]
        ]
        return cls(
            record["log_id"], record["topic"],
            KeyGroupRange(record["key_group_start"], record["key_group_end"]),
            ranges, record["from_sequence_number"], record["to_sequence_number"],
            record["meta_partition"], record["checkpoint_id"],
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KafkaChangelogHandle) and self._to_record() == other._to_record()

    def __hash__(self) -> int:
        return hash((self._log_id, self.topic, self.ranges))

    def __repr__(self) -> str:
        spans = ", ".join(f"{r.partition}:[{r.start_offset},{r.end_offset})" for r in self.ranges)
        return (
            f"KafkaChangelogHandle(log={self._log_id}, topic={self.topic}, "
            f"key_groups={self._range}, sqn=[{self.from_sequence_number}, "
            f"{self.to_sequence_number}], ranges={spans or 'none'})"
        )
