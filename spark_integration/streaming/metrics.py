"""State metrics of each micro-batch, where Spark users look for them.

Every subtask reports :class:`SubtaskMetrics` with its state handle; the driver keeps
them in the batch's :class:`BatchReport`, logs a summary at
INFO, and :class:`StateMetricsListener` hands each report to a function of yours when
Spark reports the batch's progress (a ``StreamingQueryListener``), next to Spark's own
``StreamingQueryProgress``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from pyspark.sql.streaming.listener import StreamingQueryListener

from kafka_changelog.state.host.subtask_backend import StateSource

from .batch_identity import BatchKind

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubtaskMetrics:
    """What one subtask held and did in one micro-batch."""

    subtask: int
    #: Input rows and distinct keys of the batch given to the subtask.
    rows_in: int
    keys: int
    #: Entries in the working copy after the batch (a key of a value or list state is
    #: one; a map counts each of its entries).
    state_rows: int
    #: Bytes the subtask's checkpoint refers to: snapshot chunks plus changelog since.
    checkpoint_bytes: int
    #: State changes the batch's checkpoint persisted, and their payload bytes: what was
    #: logged since the backend's previous checkpoint (registrations included; after a
    #: restore, also the registrations the restore logs again).
    changes: int
    change_bytes: int
    #: Materializations started and completed in this batch, and the bytes they wrote.
    materializations_started: int
    materializations_completed: int
    materialized_bytes: int
    #: How the subtask got its state (reattached, reattached from another worker's
    #: store, rolled back, restored from Kafka, or fresh).
    state_source: StateSource
    #: Seconds restoring (0 unless restored).
    restore_s: float
    #: Seconds getting the backend, whatever the source (opening and reattaching a local
    #: store takes milliseconds; a restore, its restore_s).
    attach_s: float = 0.0
    #: Output rows the subtask produced.
    rows_out: int = 0
    #: Whether the batch reused what an earlier run of it committed for this subtask
    #: (the figures above are that run's; nothing was computed again).
    reused: bool = False
    #: The batch's processing time the subtask ran at (ms since the epoch).
    processing_time_ms: int = 0
    #: Rows whose event time was before the batch's watermark (dropped, or passed on:
    #: see ``EventTime.late_rows``), and the largest event time of the subtask's rows.
    late_rows: int = 0
    max_event_time_ms: int | None = None
    #: Users' timers that fired, and keys whose TTL'd state was looked at by an expiry
    #: timer.
    timers_fired: int = 0
    expiry_checks: int = 0
    #: Where the task ran: the host's name and its host-local state directory ("" when
    #: the batch reused an earlier run's commit).
    host: str = ""
    #: Transactional steps this task's commit did again (a call retried after a retriable
    #: broker error, a transaction aborted or fenced and redone); 0 for a reused commit.
    transaction_retries: int = 0
    #: The registrations of the states the subtask's backend holds (``StateMeta``
    #: records as JSON, the timers state left out): the checkpoint records those the
    #: query does not declare, so that a state write finds them.
    registrations: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        """One JSON object (what a task sends to the driver)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> SubtaskMetrics:
        """Inverse of :meth:`to_json`."""
        fields = json.loads(text)
        fields["state_source"] = StateSource(fields["state_source"])
        return SubtaskMetrics(**fields)


@dataclass
class BatchReport:
    """What one micro-batch did."""

    batch_id: int
    #: The checkpoint the batch committed (for a re-run: committed before).
    checkpoint_id: int
    #: The checkpoint its state started from (None: empty state).
    restored_from: int | None
    committed: bool
    rows_out: int
    seconds: float
    #: Seconds in the subtask tasks (Spark job), the commit, and the sink.
    task_s: float = 0.0
    commit_s: float = 0.0
    sink_s: float = 0.0
    #: The Spark partition that ran each subtask (one each: subtasks run in parallel).
    subtask_partitions: dict[int, int] = field(default_factory=dict)
    #: Seconds each subtask spent restoring its backend from Kafka (subtasks that reattached
    #: a backend or a local store, or started empty, are not listed).
    restore_s: dict[int, float] = field(default_factory=dict)
    #: Materialization id of each subtask's snapshot in this checkpoint (0: none yet).
    materializations: dict[int, int] = field(default_factory=dict)
    kind: BatchKind = BatchKind.NEW
    #: The Spark query that ran the batch ("" outside a streaming query).
    query_id: str = ""
    #: What each subtask held and did (state rows and bytes, changes persisted,
    #: materializations, reattached or restored).
    subtask_metrics: dict[int, SubtaskMetrics] = field(default_factory=dict)
    #: Subtasks whose results an earlier run of the batch committed (with a
    #: ``KafkaOutputSink``), reused instead of computed again.
    reused_subtasks: list[int] = field(default_factory=list)
    #: The batch's processing time (ms since the epoch), the watermark it ran with, and the
    #: watermark after it (None: no event time declared, or no event seen yet).
    processing_time_ms: int = 0
    watermark_ms: int | None = None
    next_watermark_ms: int | None = None
    #: Seconds the driver took to read the batch's input from the query and check it
    #: against the input the state holds (docs/exactly-once.md, "Input offsets").
    input_check_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (JSON-able), e.g. for a metrics system."""
        return dataclasses.asdict(self)


class ReportingProcessor(Protocol):
    """What :class:`StateMetricsListener` reads of a processor: its batch reports."""

    reports: list[BatchReport]


def log_batch(report: BatchReport) -> None:
    """One INFO line per batch with the state metrics summed over subtasks."""
    metrics = report.subtask_metrics.values()
    sources = sorted({m.state_source.value for m in metrics})
    logger.info(
        "batch %d (checkpoint %d, %s%s): %d rows in, %d keys, state rows %d, checkpoint "
        "bytes %d, changes %d (%d bytes), materializations %d started / %d done (%d bytes), "
        "state %s, restore %.3f s, commit %.3f s, tasks %.3f s, batch %.3f s",
        report.batch_id, report.checkpoint_id, report.kind.value,
        "" if report.committed else ", re-run: not committed again",
        sum(m.rows_in for m in metrics), sum(m.keys for m in metrics),
        sum(m.state_rows for m in metrics), sum(m.checkpoint_bytes for m in metrics),
        sum(m.changes for m in metrics), sum(m.change_bytes for m in metrics),
        sum(m.materializations_started for m in metrics),
        sum(m.materializations_completed for m in metrics),
        sum(m.materialized_bytes for m in metrics), "/".join(sources) or "-",
        max((m.restore_s for m in metrics), default=0.0), report.commit_s, report.task_s,
        report.seconds)


class StateMetricsListener(StreamingQueryListener):
    """A ``StreamingQueryListener`` that passes each batch's state report on.

    ``spark.streams.addListener(StateMetricsListener(processor, on_batch))`` calls
    ``on_batch(report, progress)`` when Spark reports a batch's progress: ``report`` is
    the :class:`BatchReport` of the processor for that
    batch and query, ``progress`` Spark's ``StreamingQueryProgress`` (rows per second,
    durations, Spark's own ``stateOperators``). Batches the processor did not run (other
    queries) are passed over.
    """

    def __init__(self, processor: ReportingProcessor,
                 on_batch: Callable[[BatchReport, Any], None]) -> None:
        super().__init__()
        self._processor = processor
        self._on_batch = on_batch

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to report yet."""

    def onQueryProgress(self, event: Any) -> None:
        """Hand the batch's report on, if this processor ran the batch."""
        progress = event.progress
        query_id, batch_id = str(progress.id), progress.batchId
        for report in reversed(self._processor.reports):
            if report.batch_id == batch_id and report.query_id == query_id:
                self._on_batch(report, progress)
                return

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to report."""

    def onQueryTerminated(self, event: Any) -> None:
        """Nothing to report."""
