"""What input a micro-batch reads, per source: read from the running query.

Spark's micro-batch engine fixes, before it runs batch ``b``, where every source's input
starts (the end of batch ``b - 1``, or the source's initial offsets for a query's first
batch: its ``startingOffsets`` resolved) and ends; the batch reads exactly that range,
and a restart re-runs it with exactly the same. The driver reads both from the query's
execution context through py4j (classic Spark; under Spark Connect the function runs
where the query is not reachable, and nothing is read):

* the **Kafka** source (``KafkaV2[...]``): start and end offsets per topic-partition, the
  JSON of ``startingOffsets`` (``{"topic": {"partition": next offset}}``);
* the **file** source (``FileStreamSource[<directory>]``): the files of the batch with
  their modification times, from the source's own file log for the batch's range;
* any other source: its description only (its progress is not compared).

The rows' own ``offset`` columns would not do: a query may project them away, partitions
without rows have none, and a transaction's end is past the last row.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from kafka_changelog.enums import StrEnum
from kafka_changelog.state.checkpoints.source_offsets import SourceOffsets

from .kafka_source_restart import prime_latest_offsets

logger = logging.getLogger(__name__)

#: How the file source describes itself: ``FileStreamSource[<qualified directory>]``.
_FILE_SOURCE_PREFIX = "FileStreamSource["
#: How Spark's Kafka source describes itself (``KafkaV2[Subscribe[topic]]``; the first
#: version of the source: ``KafkaSourceV1[...]``).
_KAFKA_SOURCE_PREFIXES = ("KafkaV2[", "KafkaSourceV1[")


class SourceKind(StrEnum):
    """How a source's progress is compared with the state's."""

    #: Offsets per topic-partition: compared exactly.
    KAFKA = "kafka"
    #: Files of a directory, by modification time and name.
    FILES = "files"
    #: Not comparable (a rate source, a table format's, a socket...).
    OTHER = "other"


@dataclass(frozen=True)
class BatchSource:
    """One source of a micro-batch and the input the batch reads from it."""

    #: Spark's description of the source (its identity across queries).
    description: str
    kind: SourceKind
    #: Kafka: where the batch starts (topic -> partition -> offset; a partition missing
    #: here that ``end`` has is new and read from its earliest offset).
    start: SourceOffsets = field(default_factory=dict)
    #: Kafka: where the batch ends (exclusive).
    end: SourceOffsets = field(default_factory=dict)
    #: Files: the directory, and the batch's files (path -> modification ms).
    directory: str = ""
    files: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchInput:
    """The input of one micro-batch, per source (see the module docstring)."""

    sources: tuple[BatchSource, ...] = ()
    #: False where the query could not be read (Spark Connect, another engine): nothing
    #: is known of the batch's input, and nothing is compared.
    known: bool = False

    def kafka_end(self) -> SourceOffsets:
        """Every Kafka source's end offsets, merged (topic -> partition -> offset)."""
        merged: SourceOffsets = {}
        for source in self.sources:
            for topic, partitions in source.end.items():
                merged.setdefault(topic, {}).update(partitions)
        return merged

    def files(self) -> dict[str, dict[str, int]]:
        """Every file source's files of this batch, per directory."""
        found: dict[str, dict[str, int]] = {}
        for source in self.sources:
            if source.kind is SourceKind.FILES:
                found.setdefault(source.directory, {}).update(source.files)
        return found

    def descriptions(self) -> tuple[str, ...]:
        return tuple(s.description for s in self.sources)


def parse_kafka_offsets(text: str | None) -> SourceOffsets:
    """A Kafka source offset's JSON as offsets ({} for anything else)."""
    if text is None:
        return {}
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            return {}
        return {str(t): {int(p): int(o) for p, o in parts.items()}
                for t, parts in data.items()}
    except (TypeError, ValueError, AttributeError):
        return {}


def source_kind(description: str) -> SourceKind:
    """What kind of source Spark's description names."""
    if description.startswith(_KAFKA_SOURCE_PREFIXES):
        return SourceKind.KAFKA
    if description.startswith(_FILE_SOURCE_PREFIX) and description.endswith("]"):
        return SourceKind.FILES
    return SourceKind.OTHER


def batch_input(batch_df: Any, query_id: str, batch_id: int) -> BatchInput:
    """The input of batch ``batch_id`` of query ``query_id`` (``known=False`` when the
    query cannot be read: logged, never raised)."""
    if not query_id:
        return BatchInput()
    try:
        session = batch_df.sparkSession
        jvm = session.sparkContext._jvm
        # The query's session is a clone of the user's; active queries are kept in the
        # state every clone shares.
        execution = session._jsparkSession.sharedState().activeStreamingQueries().get(
            jvm.java.util.UUID.fromString(query_id))
        if execution is None:
            return BatchInput()
        context = execution.getLatestExecutionContext()
        if int(context.batchId()) != batch_id:
            logger.debug("query %s runs batch %d, its context is of batch %d", query_id,
                         batch_id, context.batchId())
            return BatchInput()
        streams = execution.sources()
        sources = tuple(_source(jvm, streams.apply(i), context)
                        for i in range(streams.size()))
    except Exception as exc:  # Spark Connect, another engine: nothing to compare
        logger.debug("batch %d of query %s: input not readable: %s", batch_id, query_id, exc)
        return BatchInput()
    return BatchInput(sources, known=True)


def _source(jvm: Any, stream: Any, context: Any) -> BatchSource:
    description = str(stream.toString())
    kind = source_kind(description)
    start = context.startOffsets().get(stream)
    end = context.endOffsets().get(stream)
    if kind is SourceKind.KAFKA:
        prime_latest_offsets(jvm, stream, end)
        if start.isDefined():
            first = parse_kafka_offsets(str(start.get().json()))
        else:  # the query's first batch: its startingOffsets, resolved
            first = parse_kafka_offsets(str(stream.initialOffset().json()))
        last = parse_kafka_offsets(str(end.get().json())) if end.isDefined() else first
        return BatchSource(description, kind, first, last)
    if kind is SourceKind.FILES:
        files = _batch_files(jvm, stream, start, end) if end.isDefined() else {}
        return BatchSource(description, kind, directory=description[len(_FILE_SOURCE_PREFIX):-1],
                           files=files)
    return BatchSource(description, kind)


def _batch_files(jvm: Any, stream: Any, start: Any, end: Any) -> dict[str, int]:
    """The files of the file source's batch ``(start, end]``, with their modification
    times: the source's ``getBatch`` reads them from its own file log."""
    if start.isDefined() and str(start.get().json()) == str(end.get().json()):
        return {}  # no new file
    batch = stream.getBatch(start if start.isDefined() else jvm.scala.Option.empty(), end.get())
    relation = batch.queryExecution().analyzed()
    if relation.getClass().getSimpleName() != "LogicalRelation":
        return {}  # an empty batch: a local relation of no rows
    index = relation.relation().location()
    statuses = index.allFiles()
    found: dict[str, int] = {}
    for i in range(statuses.size()):
        status = statuses.apply(i)
        found[str(status.getPath().toString())] = int(status.getModificationTime())
    return found


__all__ = ["BatchInput", "BatchSource", "SourceKind", "batch_input", "parse_kafka_offsets",
           "source_kind"]
