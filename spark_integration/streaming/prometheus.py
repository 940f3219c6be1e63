"""Prometheus metrics of stateful queries, served by the driver.

:class:`PrometheusStateMetrics` turns each :class:`~.metrics.BatchReport` of a processor
into Prometheus metrics (``prometheus-client``, the ``metrics`` extra), labelled by
application and operator, in a registry of its own or one you pass::

    metrics = PrometheusStateMetrics()
    metrics.serve(9464)                      # http://127.0.0.1:9464/metrics
    processor = stateful_foreach_batch(config, fn, "user", schema,
                                       on_report=metrics.recorder(config))

Invariants: counters only grow, each batch counted once, when the processor reports it
(a batch Spark runs again after its checkpoint committed counts as ``kind="rerun"`` with
nothing else; subtask commits a re-run reuses from a crashed run count that run's
figures, which nothing reported); gauges are the latest batch's figures. Recording
never fails a batch: the processor logs an error of ``on_report`` and goes on. Names
follow Prometheus' conventions (base units in the name, ``_total`` for counters);
docs/operations.md lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .metrics import BatchReport

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.exposition import start_http_server
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("spark_integration.streaming.prometheus needs prometheus-client: "
                      "pip install 'kafka-changelog[metrics]'") from exc

if TYPE_CHECKING:
    from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint

    from .config import StreamingStateConfig

#: The phases of ``kafka_changelog_batch_duration_seconds``: the whole batch, the subtask
#: tasks (one Spark job), the checkpoint commit, the sink, and the input offsets check.
PHASES = ("batch", "tasks", "commit", "sink", "input_check")
#: Seconds: from a quiet micro-batch to a long restore.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LABELS = ("application", "operator")


class PrometheusStateMetrics:
    """The Prometheus metrics of the stateful queries of this driver.

    One instance serves any number of processors (each recorder adds its application and
    operator as labels); ``registry`` defaults to a new :class:`CollectorRegistry` (pass
    ``prometheus_client.REGISTRY`` to expose them with your process's other metrics).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._server: Any = None
        r = self.registry
        self.batches = Counter("kafka_changelog_batches_total",
                               "Micro-batches run, by kind (first, new, rerun, new-query).",
                               (*LABELS, "kind"), registry=r)
        self.duration = Histogram("kafka_changelog_batch_duration_seconds",
                                  "Seconds of a micro-batch, by phase.", (*LABELS, "phase"),
                                  buckets=DURATION_BUCKETS, registry=r)
        self.rows_in = Counter("kafka_changelog_input_rows_total",
                               "Input rows given to the stateful function.", LABELS,
                               registry=r)
        self.rows_out = Counter("kafka_changelog_output_rows_total",
                                "Output rows of the stateful function.", LABELS, registry=r)
        self.changes = Counter("kafka_changelog_state_changes_total",
                               "State changes persisted to the changelog.", LABELS,
                               registry=r)
        self.change_bytes = Counter("kafka_changelog_changelog_bytes_total",
                                    "Payload bytes of the persisted state changes.", LABELS,
                                    registry=r)
        self.attaches = Counter("kafka_changelog_subtask_attaches_total",
                                "How subtasks got their state, by source (fresh, "
                                "reattached, reattached-local, rolled-back, caught-up, "
                                "restored).", (*LABELS, "source"), registry=r)
        self.restore = Counter("kafka_changelog_restore_seconds_total",
                               "Seconds subtasks spent restoring state from Kafka.", LABELS,
                               registry=r)
        self.materializations = Counter("kafka_changelog_materializations_total",
                                        "Materializations completed.", LABELS, registry=r)
        self.snapshot_bytes = Counter("kafka_changelog_snapshot_bytes_total",
                                      "Bytes the completed materializations wrote.", LABELS,
                                      registry=r)
        self.late_rows = Counter("kafka_changelog_late_rows_total",
                                 "Rows whose event time was before the watermark.", LABELS,
                                 registry=r)
        self.timers = Counter("kafka_changelog_timers_fired_total",
                              "Users' timers that fired.", LABELS, registry=r)
        self.reused = Counter("kafka_changelog_reused_subtask_commits_total",
                              "Subtask commits of an earlier run of a batch that a re-run "
                              "reused instead of computing them again.", LABELS, registry=r)
        self.transaction_retries = Counter(
            "kafka_changelog_task_transaction_retries_total",
            "Transactional steps subtask commits did again (a call retried after a "
            "retriable broker error, a transaction aborted or fenced and redone).", LABELS,
            registry=r)
        self.entries = Gauge("kafka_changelog_state_entries",
                             "State entries after the latest batch (all subtasks).", LABELS,
                             registry=r)
        self.checkpoint_bytes = Gauge("kafka_changelog_checkpoint_bytes",
                                      "Bytes the latest checkpoint refers to (snapshot "
                                      "chunks plus changelog since).", LABELS, registry=r)
        self.checkpoint_id = Gauge("kafka_changelog_checkpoint_id",
                                   "The latest batch's checkpoint id.", LABELS, registry=r)
        self.batch_id = Gauge("kafka_changelog_batch_id",
                              "The latest batch's Spark batch id.", LABELS, registry=r)
        self.parallelism = Gauge("kafka_changelog_subtasks",
                                 "Subtasks of the latest batch.", LABELS, registry=r)
        self.watermark = Gauge("kafka_changelog_watermark_seconds",
                               "The event-time watermark after the latest batch (seconds "
                               "since the epoch; absent without event time).", LABELS,
                               registry=r)

    def record(self, report: BatchReport, application: str, operator: str) -> None:
        """Count ``report`` under ``application`` and ``operator``."""
        labels = (application, operator)
        self.batches.labels(*labels, report.kind.value).inc()
        for phase, seconds in zip(PHASES, (report.seconds, report.task_s, report.commit_s,
                                           report.sink_s, report.input_check_s), strict=True):
            self.duration.labels(*labels, phase).observe(seconds)
        metrics = report.subtask_metrics.values()
        self.rows_out.labels(*labels).inc(report.rows_out)
        # A subtask commit reused from a crashed run of the batch carries that run's
        # figures, which no report counted (its driver died before reporting).
        self.rows_in.labels(*labels).inc(sum(m.rows_in for m in metrics))
        self.changes.labels(*labels).inc(sum(m.changes for m in metrics))
        self.change_bytes.labels(*labels).inc(sum(m.change_bytes for m in metrics))
        self.materializations.labels(*labels).inc(
            sum(m.materializations_completed for m in metrics))
        self.snapshot_bytes.labels(*labels).inc(sum(m.materialized_bytes for m in metrics))
        self.late_rows.labels(*labels).inc(sum(m.late_rows for m in metrics))
        self.timers.labels(*labels).inc(sum(m.timers_fired for m in metrics))
        self.restore.labels(*labels).inc(sum(m.restore_s for m in metrics))
        for m in metrics:
            if not m.reused:
                self.attaches.labels(*labels, m.state_source.value).inc()
        self.reused.labels(*labels).inc(len(report.reused_subtasks))
        self.transaction_retries.labels(*labels).inc(
            sum(m.transaction_retries for m in metrics))
        if metrics:
            self.entries.labels(*labels).set(sum(m.state_rows for m in metrics))
            self.checkpoint_bytes.labels(*labels).set(sum(m.checkpoint_bytes for m in metrics))
            self.parallelism.labels(*labels).set(len(report.subtask_metrics))
        self.checkpoint_id.labels(*labels).set(report.checkpoint_id)
        self.batch_id.labels(*labels).set(report.batch_id)
        if report.next_watermark_ms is not None:
            self.watermark.labels(*labels).set(report.next_watermark_ms / 1000)

    def recorder(self, config: StreamingStateConfig) -> Callable[[BatchReport], None]:
        """An ``on_report`` for the processor of ``config`` (labelled with its application
        and operator id)."""
        application, operator = config.application, config.operator_id

        def on_report(report: BatchReport) -> None:
            self.record(report, application, operator)

        return on_report

    def track_input_lag(self, config: StreamingStateConfig,
                        input_kafka: Mapping[str, Any] | None = None,
                        timeout_s: float = 10.0) -> None:
        """Show ``kafka_changelog_input_lag_records`` of ``config``'s application: per
        Kafka input topic-partition, the records after the offsets its state's latest
        checkpoint holds, measured at every scrape (:mod:`.input_lag`). ``input_kafka``:
        librdkafka settings of the input's cluster (default: the state's brokers and
        security); each scrape lists the partitions' latest offsets there, waiting up to
        ``timeout_s``."""
        from kafka_changelog.kafka.checkpoint_store import KafkaCheckpointStore

        from .input_lag import InputLagCollector
        from .worker_resources import WorkerResources

        def latest_checkpoint() -> CompletedCheckpoint | None:
            # The driver's coordinator of the application (opened again once a stopped
            # query's processor released it).
            coordinator = WorkerResources.coordinator(config)
            store = coordinator.checkpoints
            if isinstance(store, KafkaCheckpointStore):  # another process may have rewound it
                store.catch_up(timeout_s, only_for=config.application)
            return coordinator.checkpoint()

        settings = dict(input_kafka) if input_kafka is not None else config.connection().admin()
        self.registry.register(InputLagCollector(config.application, config.operator_id,
                                                 latest_checkpoint, settings, timeout_s))

    def serve(self, port: int = 0, address: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` over HTTP on ``address``:``port`` from a daemon thread (0: a
        free port); the port. Call :meth:`close` to stop it."""
        server, _thread = start_http_server(port, address, self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        """Stop the HTTP endpoint, if :meth:`serve` started one."""
        server = self._server
        if server is not None:
            server.shutdown()
            server.server_close()
            self._server = None


__all__ = ["DURATION_BUCKETS", "PHASES", "PrometheusStateMetrics"]
