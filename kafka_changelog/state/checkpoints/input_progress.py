"""How far a checkpoint's state has read its input: recorded with every checkpoint.

The state's checkpoint, not a query's ``checkpointLocation``, is the truth for what input
the state holds (as in Kafka Streams and Flink, where input offsets are part of the
checkpoint). Each checkpoint a streaming query commits records, cumulatively (what the
batch read, on top of what its base checkpoint recorded):

* **Kafka**: per topic-partition, the offset the state has read up to, exclusive
  (:data:`~kafka_changelog.state.checkpoints.source_offsets.SOURCE_OFFSETS_PROPERTY`, the form of
  the Kafka source's ``startingOffsets``);
* **files**: per directory of a file source, the newest modification time of a file the
  state holds and the names of the files of exactly that time
  (:data:`SOURCE_FILES_PROPERTY`): Spark's file source takes files oldest first, so a
  file modified before that time, or at it and named there, is held;
* **sources**: the description of every source of the batch's query
  (:data:`SOURCES_PROPERTY`), for sources whose progress cannot be compared (a rate
  source, a table format's): a new query over one of them starts it again.

Nothing here knows Spark: the streaming driver reads a batch's input and compares it
(``spark_integration/streaming/input_check.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .source_offsets import (
    SOURCE_OFFSETS_PROPERTY,
    SourceOffsets,
    SourceOffsetsError,
    parse_offsets,
    starting_offsets_json,
)

#: Checkpoint property: ``{"<directory>": {"through_ms": T, "files": [names at T]}}``.
SOURCE_FILES_PROPERTY = "spark.source_files"
#: Checkpoint property: the descriptions of the sources of the query that read the input
#: (a JSON list), e.g. ``["KafkaV2[Subscribe[clicks]]"]``.
SOURCES_PROPERTY = "spark.sources"


@dataclass(frozen=True)
class FilesMark:
    """What a state holds of one directory of a file source.

    Invariant: every file of the directory modified before :attr:`through_ms`, and every
    file in :attr:`names_at_mark` (all modified at :attr:`through_ms`), has been applied.
    """

    #: The newest modification time (ms since the epoch) of a file the state holds.
    through_ms: int
    #: The paths of the held files modified exactly at :attr:`through_ms`.
    names_at_mark: frozenset[str]

    def holds(self, path: str, modified_ms: int) -> bool:
        """Whether a file of this directory is among the input the state holds."""
        return modified_ms < self.through_ms or (
            modified_ms == self.through_ms and path in self.names_at_mark)

    def after(self, files: Mapping[str, int]) -> FilesMark:
        """The mark once ``files`` (path -> modification ms) are applied as well."""
        if not files:
            return self
        newest = max(files.values())
        if newest < self.through_ms:
            return self
        names = {p for p, m in files.items() if m == newest}
        if newest == self.through_ms:
            names |= self.names_at_mark
        return FilesMark(newest, frozenset(names))


@dataclass(frozen=True)
class InputProgress:
    """The input a checkpoint's state holds (see the module docstring)."""

    #: Kafka: topic -> partition -> the next offset to read.
    offsets: SourceOffsets = field(default_factory=dict)
    #: File sources: directory -> what the state holds of it.
    files: dict[str, FilesMark] = field(default_factory=dict)
    #: The descriptions of the sources of the query that read it (empty: not recorded).
    sources: tuple[str, ...] = ()

    @staticmethod
    def of(properties: Mapping[str, str], where: str) -> InputProgress:
        """The progress a checkpoint's ``properties`` record (empty where nothing is
        recorded: a checkpoint of another engine, or of an older version).

        Raises :class:`SourceOffsetsError` naming ``where`` for a property not understood.
        """
        text = properties.get(SOURCE_OFFSETS_PROPERTY)
        offsets = parse_offsets(text, where) if text is not None else {}
        return InputProgress(offsets, _parse_files(properties.get(SOURCE_FILES_PROPERTY),
                                                   where),
                             _parse_sources(properties.get(SOURCES_PROPERTY), where))

    def properties(self) -> dict[str, str]:
        """The checkpoint properties recording this progress (none for what is empty)."""
        recorded: dict[str, str] = {}
        if self.offsets:
            recorded[SOURCE_OFFSETS_PROPERTY] = starting_offsets_json(self.offsets)
        if self.files:
            recorded[SOURCE_FILES_PROPERTY] = json.dumps(
                {d: {"through_ms": m.through_ms, "files": sorted(m.names_at_mark)}
                 for d, m in sorted(self.files.items())}, separators=(",", ":"))
        if self.sources:
            recorded[SOURCES_PROPERTY] = json.dumps(list(self.sources))
        return recorded

    def after(self, offsets: Mapping[str, Mapping[int, int]],
              files: Mapping[str, Mapping[str, int]], sources: Iterable[str]) -> InputProgress:
        """The progress once a batch that read up to ``offsets`` and read ``files``
        (directory -> path -> modification ms) of a query of ``sources`` is applied.

        Cumulative: topics and directories the batch did not read keep their record (a
        query that moved to another topic still refuses the old one's re-read); an
        offset never goes back (a batch whose rows were all below the state's offsets,
        skipped, leaves them where they were).
        """
        merged = {t: dict(ps) for t, ps in self.offsets.items()}
        for topic, partitions in offsets.items():
            mine = merged.setdefault(topic, {})
            for partition, offset in partitions.items():
                mine[partition] = max(offset, mine.get(partition, offset))
        marks = dict(self.files)
        for directory, found in files.items():
            mark = marks.get(directory)
            marks[directory] = (mark.after(found) if mark is not None
                                else FilesMark(-1, frozenset()).after(found))
        return InputProgress(merged, {d: m for d, m in marks.items() if m.through_ms >= 0},
                             tuple(sources) or self.sources)

    def without_topics(self, topics: Iterable[str]) -> InputProgress:
        """This progress without the offsets of ``topics`` (a topic deleted and created
        again starts its offsets at 0: its old ones mean nothing any more)."""
        gone = set(topics)
        return InputProgress({t: p for t, p in self.offsets.items() if t not in gone},
                             self.files, self.sources)


def _parse_files(text: str | None, where: str) -> dict[str, FilesMark]:
    if text is None:
        return {}
    try:
        data = json.loads(text)
        return {str(d): FilesMark(int(m["through_ms"]), frozenset(map(str, m["files"])))
                for d, m in data.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise SourceOffsetsError(
            f"{where}: property {SOURCE_FILES_PROPERTY} should be "
            f"{{\"directory\": {{\"through_ms\": ms, \"files\": [...]}}}}, got {text!r} "
            f"({exc})") from exc


def _parse_sources(text: str | None, where: str) -> tuple[str, ...]:
    if text is None:
        return ()
    try:
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError("not a JSON list")
        return tuple(str(s) for s in data)
    except ValueError as exc:
        raise SourceOffsetsError(f"{where}: property {SOURCES_PROPERTY} should be a JSON "
                                 f"list of source descriptions, got {text!r} ({exc})") from exc


__all__ = ["SOURCES_PROPERTY", "SOURCE_FILES_PROPERTY", "FilesMark", "InputProgress"]
