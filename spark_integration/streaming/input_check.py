"""The state's checkpoint is the truth for input offsets: a batch never applies input
the state already holds, nor skips input it never saw, whatever its checkpointLocation.

Before any task of a batch runs, the driver compares the batch's input
(:mod:`spark_integration.streaming.batch_input`) with the input its base checkpoint
records (:class:`~kafka_changelog.state.checkpoints.input_progress.InputProgress`):

* **Kafka**, every batch: per topic-partition the state recorded, the batch must start
  exactly where the state ended. Before it, the batch would apply input again (a second
  deployment, a fresh or copied checkpointLocation, the old one after a rewind, a topic
  created again): refused, or, with ``skip_applied_input``, the rows the state holds are
  dropped (by their ``topic``, ``partition`` and ``offset`` columns). After it, input
  would be skipped: refused unless ``allow_input_gaps`` (the meaning of Spark's
  ``failOnDataLoss=false``). Topics the state never recorded are new
  input (a migration, a backfill, a second source): the state carries over.
* **Files**, when the query is not the one that committed the base checkpoint (within a
  query, Spark's own file log is exact): a file the state holds (modified before the
  newest file it holds, or at that time and by name) is refused. With
  ``skip_applied_input``, in every batch, its rows are dropped (by ``input_file_name()``):
  files must then arrive in modification-time order, as Spark's file source reads them.
  A directory the state never recorded is new input.
* **Other sources** (rate, table formats, sockets...), when the query is not the base's:
  a source of the same description as one the base's query read would start again from
  its beginning: refused unless ``allow_uncompared_sources``. Another source is new input.

Refused batches raise :class:`InputOffsetsError` before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kafka_changelog.errors import ChangelogError
from kafka_changelog.state.checkpoints.input_progress import InputProgress
from kafka_changelog.state.checkpoints.source_offsets import starting_offsets_json

from .batch_input import BatchInput, BatchSource, SourceKind

#: Kafka source columns the rows need for ``skip_applied_input``.
KAFKA_COLUMNS = ("topic", "partition", "offset")
#: The ticks' source (``with_ticks``): no input rows, never compared.
_TICK_SOURCE_PREFIX = "RatePerMicroBatchStream"


class InputOffsetsError(ChangelogError):
    """A batch would apply input its application's state already holds, or skip input
    the state never saw: refused before anything is written (the message names the
    application, the source, each topic-partition with the batch's start and the
    state's end, and the fix)."""


@dataclass(frozen=True)
class InputPolicy:
    """What a batch may do where its input does not continue the state's exactly (the
    fields of :class:`~spark_integration.streaming.config.StreamingStateConfig`)."""

    #: Drop the rows the state holds (Kafka offsets below the state's, files it holds),
    #: rather than refuse the batch: a fresh checkpointLocation continues the state by
    #: itself.
    skip_applied_input: bool = False
    #: Accept input the state never saw being skipped (Kafka offsets after the state's).
    allow_input_gaps: bool = False
    #: Accept a new query re-reading a source whose progress cannot be compared.
    allow_uncompared_sources: bool = False


@dataclass(frozen=True)
class PartitionMismatch:
    """One topic-partition whose batch start is not where the state ended."""

    source: str
    topic: str
    partition: int
    #: Where the batch starts (None: a partition new to the query, read from earliest).
    start: int | None
    #: Where the state ended.
    state_end: int

    def describe(self) -> str:
        start = "its earliest offset" if self.start is None else str(self.start)
        return (f"topic {self.topic} partition {self.partition}: the batch starts at "
                f"{start}, the state holds up to {self.state_end}")


@dataclass(frozen=True)
class InputCheck:
    """The outcome of a batch's check: what to drop and what the checkpoint records."""

    #: (topic, partition) -> the state's end: rows below it are dropped.
    skip: dict[tuple[str, int], int] = field(default_factory=dict)
    #: Files of the batch the state holds (their paths): their rows are dropped.
    skip_files: frozenset[str] = frozenset()
    #: The progress the batch's checkpoint records.
    progress: InputProgress = field(default_factory=InputProgress)


@dataclass(frozen=True)
class BatchWhere:
    """Which batch is checked, against which checkpoint: for the messages."""

    application: str
    query_id: str
    batch_id: int
    #: The base checkpoint (the state the batch starts from).
    base_id: int
    #: Whether the base checkpoint was committed by this query.
    same_query: bool
    #: Whether the query's stream has ticks (``with_ticks``).
    ticks: bool = False

    def batch(self) -> str:
        return (f"application {self.application!r}: batch {self.batch_id} of Spark query "
                f"{self.query_id or '(unknown)'}")


def check_input(where: BatchWhere, recorded: InputProgress, batch: BatchInput,
                policy: InputPolicy) -> InputCheck:
    """Compare ``batch``'s input with the ``recorded`` progress of its base checkpoint
    (module docstring); raises :class:`InputOffsetsError`, else says what to drop and
    what to record."""
    if not batch.known:
        return InputCheck(progress=recorded)
    overlaps: list[PartitionMismatch] = []
    gaps: list[PartitionMismatch] = []
    for source in batch.sources:
        if source.kind is SourceKind.KAFKA:
            _compare_kafka(source, recorded.offsets, overlaps, gaps)
    # Within a query Spark's own file log is exact; but a query that started by reading
    # again files the state held (skipping them) goes on reading them in its next batches.
    held_files = (_held_files(batch, recorded)
                  if not where.same_query or policy.skip_applied_input else [])
    restarted = [] if where.same_query else _restarted_sources(where, batch, recorded)
    if overlaps and not policy.skip_applied_input:
        raise InputOffsetsError(_overlap_message(where, overlaps, recorded))
    if gaps and not policy.allow_input_gaps:
        raise InputOffsetsError(_gap_message(where, gaps, recorded))
    if held_files and not policy.skip_applied_input:
        raise InputOffsetsError(_files_message(where, held_files, recorded))
    if restarted and not policy.allow_uncompared_sources:
        raise InputOffsetsError(_restarted_message(where, restarted))
    skip = {(m.topic, m.partition): m.state_end for m in overlaps}
    return InputCheck(skip, frozenset(path for _, path, _ in held_files),
                      recorded.after(batch.kafka_end(), batch.files(), batch.descriptions()))


def check_rerun(where: BatchWhere, checkpoint_id: int, committed: InputProgress,
                batch: BatchInput) -> None:
    """Refuse a batch taken for a re-run of the batch that committed ``checkpoint_id``
    (the same query and batch id) whose Kafka input does not end where that batch's did
    (``committed``: what the checkpoint recorded), or that reads files the checkpoint
    does not hold: its checkpointLocation is a copy that planned the batch anew, and
    skipping it as done would lose the difference."""
    if not batch.known:
        return
    unheld = [f"file {path} (modified at {modified} ms), which the committed batch did "
              "not read"
              for directory, files in sorted(batch.files().items())
              if (mark := committed.files.get(directory)) is not None
              for path, modified in sorted(files.items()) if not mark.holds(path, modified)]
    differing = unheld + [
        f"topic {topic} partition {partition}: this run reads up to {end}, the committed "
        f"batch read up to {committed.offsets[topic][partition]}"
        for source in batch.sources if source.kind is SourceKind.KAFKA
        for topic, partitions in sorted(source.end.items())
        for partition, end in sorted(partitions.items())
        if partition in committed.offsets.get(topic, {})
        and committed.offsets[topic][partition] != end]
    if differing:
        raise InputOffsetsError(
            f"{where.batch()} runs again the batch that committed checkpoint "
            f"{checkpoint_id}, but not over the same input: {'; '.join(differing)}. Its "
            "checkpointLocation is a copy of the query's taken before that batch (it "
            "planned the batch anew); taking it for a re-run would skip or repeat input. "
            "Nothing was written. Continue with the checkpointLocation that committed "
            "the state's checkpoints, or a fresh one with "
            ".option(\"startingOffsets\", spark_integration.starting_offsets(config)).")


def _compare_kafka(source: BatchSource, state: Mapping[str, Mapping[int, int]],
                   overlaps: list[PartitionMismatch], gaps: list[PartitionMismatch]) -> None:
    for topic, partitions in sorted(source.end.items()):
        held = state.get(topic)
        if held is None:
            continue  # a topic the state never read: new input
        for partition in sorted(partitions):
            state_end = held.get(partition)
            if state_end is None:
                continue
            start = source.start.get(topic, {}).get(partition)
            mismatch = PartitionMismatch(source.description, topic, partition, start,
                                         state_end)
            if start is None or start < state_end:
                overlaps.append(mismatch)
            elif start > state_end:
                gaps.append(mismatch)


def _held_files(batch: BatchInput, recorded: InputProgress) -> list[tuple[str, str, int]]:
    """(directory, path, modification ms) of the batch's files the state holds."""
    held: list[tuple[str, str, int]] = []
    for directory, files in sorted(batch.files().items()):
        mark = recorded.files.get(directory)
        if mark is not None:
            held.extend((directory, p, m) for p, m in sorted(files.items()) if mark.holds(p, m))
    return held


def _restarted_sources(where: BatchWhere, batch: BatchInput,
                       recorded: InputProgress) -> list[str]:
    return [s.description for s in batch.sources
            if s.kind is SourceKind.OTHER and s.description in recorded.sources
            and not (where.ticks and s.description.startswith(_TICK_SOURCE_PREFIX))]


def _why(where: BatchWhere) -> str:
    if where.same_query:
        return ("The query's own checkpointLocation committed that checkpoint: was a topic "
                "deleted and created again (its offsets start again)?")
    return ("That checkpoint was committed by another query: a second deployment of the "
            "application, a fresh or copied checkpointLocation, or an old one after a "
            "rewind.")


def _overlap_message(where: BatchWhere, overlaps: list[PartitionMismatch],
                     recorded: InputProgress) -> str:
    topics = sorted({m.topic for m in overlaps})
    return (
        f"{where.batch()} would apply input again that the state (checkpoint "
        f"{where.base_id}) already holds: {_listed(overlaps)}. {_why(where)} Nothing was "
        "written. To continue the state exactly, start the query with a fresh "
        "checkpointLocation and .option(\"startingOffsets\", "
        f"spark_integration.starting_offsets(config)) (here: "
        f"{starting_offsets_json(recorded.offsets)}), or set "
        "StreamingStateConfig(skip_applied_input=True) to drop the rows the state holds "
        f"(the rows need the Kafka source's columns {', '.join(KAFKA_COLUMNS)}). If "
        f"{' or '.join(topics)} was deleted and created again: kafka-changelog "
        f"input-offsets {where.application} --forget {topics[0]} --yes.")


def _gap_message(where: BatchWhere, gaps: list[PartitionMismatch],
                 recorded: InputProgress) -> str:
    return (
        f"{where.batch()} would skip input the state (checkpoint {where.base_id}) never "
        f"saw: {_listed(gaps)}; the offsets in between would never be applied (expired "
        "by retention, or a startingOffsets of \"latest\"?). Nothing was written. To read "
        "them, start the query with a fresh checkpointLocation and "
        ".option(\"startingOffsets\", spark_integration.starting_offsets(config)) (here: "
        f"{starting_offsets_json(recorded.offsets)}); to accept the loss (Spark's "
        "failOnDataLoss=false), set StreamingStateConfig(allow_input_gaps=True).")


def _files_message(where: BatchWhere, held: list[tuple[str, str, int]],
                   recorded: InputProgress) -> str:
    shown = "; ".join(f"{path} (modified at {ms} ms)" for _, path, ms in held[:5])
    more = f" and {len(held) - 5} more" if len(held) > 5 else ""
    marks = "; ".join(
        f"{d}: files modified before {recorded.files[d].through_ms} ms, and "
        f"{sorted(recorded.files[d].names_at_mark)} at it"
        for d in sorted({d for d, _, _ in held}))
    return (
        f"{where.batch()} would apply files again that the state (checkpoint "
        f"{where.base_id}) already holds: {shown}{more}. The state holds {marks}. "
        f"{_why(where)} Nothing was written. Continue with the checkpointLocation that "
        "committed the state's checkpoints, set "
        "StreamingStateConfig(skip_applied_input=True) to drop the rows of the files the "
        "state holds, or give this query only the files that came after (move the ones "
        "the state holds out of the directory, or read a new directory).")


def _restarted_message(where: BatchWhere, restarted: list[str]) -> str:
    return (
        f"{where.batch()} reads {', '.join(restarted)}, a source whose progress cannot "
        f"be compared with the state's, and which the query that committed the state's "
        f"checkpoint {where.base_id} read too: a new query starts it again from its "
        f"beginning, which would apply its input again. {_why(where)} Nothing was "
        "written. Continue with the checkpointLocation that committed the state's "
        "checkpoints, or, if this query's input really is new, set "
        "StreamingStateConfig(allow_uncompared_sources=True).")


def _listed(mismatches: list[PartitionMismatch]) -> str:
    by_source: dict[str, list[str]] = {}
    for m in mismatches:
        by_source.setdefault(m.source, []).append(m.describe())
    return "; ".join(f"source {s}: {', '.join(parts)}" for s, parts in by_source.items())


def _file_uri(path: str) -> str:
    """A file URI in the form Hadoop's paths print (``file:/x``, not ``file:///x``)."""
    return "file:/" + path[len("file:///"):] if path.startswith("file:///") else path


def skip_files_condition(paths: frozenset[str]) -> object:
    """The Spark condition keeping the rows not read from ``paths`` (the batch's rows
    still carry their input file: the condition goes before any shuffle)."""
    from pyspark.sql import functions as F

    read_from = F.regexp_replace(F.input_file_name(), "^file:///", "file:/")
    return ~read_from.isin(sorted(_file_uri(p) for p in paths))


def skip_condition(skip: Mapping[tuple[str, int], int], columns: list[str]) -> object:
    """The Spark condition keeping the rows the state does not hold (``skip``: the
    partitions whose rows below the state's end are dropped); raises
    :class:`InputOffsetsError` when the rows lack the Kafka source's columns."""
    from pyspark.sql import functions as F

    missing = [c for c in KAFKA_COLUMNS if c not in columns]
    if missing:
        raise InputOffsetsError(
            f"skip_applied_input drops the Kafka rows the state already holds by their "
            f"{', '.join(KAFKA_COLUMNS)} columns, but the batch's rows have no column(s) "
            f"{missing} (they have {columns}): keep the Kafka source's columns "
            f"{', '.join(KAFKA_COLUMNS)} in the stream given to foreachBatch.")
    held = F.create_map(*[x for (topic, partition), end in sorted(skip.items())
                          for x in (F.lit(f"{topic}\u0000{partition}"), F.lit(end))])
    state_end = F.try_element_at(held, F.concat(F.col("topic"), F.lit("\u0000"),
                                            F.col("partition").cast("string")))
    return state_end.isNull() | (F.col("offset") >= state_end)


__all__ = ["KAFKA_COLUMNS", "BatchWhere", "InputCheck", "InputOffsetsError", "InputPolicy",
           "PartitionMismatch", "check_input", "check_rerun", "skip_condition",
           "skip_files_condition"]
