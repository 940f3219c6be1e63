"""The input offsets a checkpoint's batch consumed up to, recorded with the checkpoint.

The streaming driver records, per source topic-partition, the offset its batch read
up to (exclusive: the next offset to read) as the checkpoint property
:data:`SOURCE_OFFSETS_PROPERTY`, a JSON object ``{"topic": {"partition": offset}}``.
That is exactly the form of the ``startingOffsets`` option of Spark's Kafka source,
so a query restarted from a rewound checkpoint reads its input from where that
checkpoint's state stopped (see ``docs/rewind.md``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ...errors import ChangelogError

#: The checkpoint property holding the batch's end offsets per source topic-partition.
SOURCE_OFFSETS_PROPERTY = "spark.source_offsets"

#: topic -> partition -> the next offset to read.
SourceOffsets = dict[str, dict[int, int]]


class SourceOffsetsError(ChangelogError):
    """A checkpoint records no input offsets, or records them in a form not understood."""


def source_offsets_property(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, str]:
    """The checkpoint property recording ``offsets`` (empty when there are none)."""
    if not offsets:
        return {}
    return {SOURCE_OFFSETS_PROPERTY: starting_offsets_json(offsets)}


def starting_offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """``offsets`` as the JSON of the Kafka source's ``startingOffsets`` option
    (topics and partitions sorted, so equal offsets give equal strings)."""
    return json.dumps({topic: {str(p): int(o) for p, o in sorted(partitions.items())}
                       for topic, partitions in sorted(offsets.items())},
                      separators=(",", ":"))


def parse_offsets(text: str, where: str) -> SourceOffsets:
    """Parse ``{"topic": {"partition": offset}}``; :class:`SourceOffsetsError` names
    ``where`` if ``text`` is not of that form."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return {str(topic): {int(p): int(o) for p, o in partitions.items()}
                for topic, partitions in data.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise SourceOffsetsError(
            f"{where}: expected {{\"topic\": {{\"partition\": offset}}}}, got {text!r} "
            f"({exc})") from exc


def recorded_source_offsets(properties: Mapping[str, str], where: str) -> SourceOffsets | None:
    """The offsets a checkpoint's properties record (None: it records none, e.g. it was
    not committed by a streaming query over Kafka, or by kafka-changelog 0.2)."""
    text = properties.get(SOURCE_OFFSETS_PROPERTY)
    return None if text is None else parse_offsets(text, where)
