"""Prometheus metrics from the driver: scraped over HTTP while a real streaming query runs,
equal to the processor's batch reports; labels per application; a failing recorder
never fails a batch."""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from examples.clickstream import ensure_topic
from examples.events import events
from kafka_changelog.state.host.subtask_backend import StateSource
from spark_integration.streaming import (
    BatchReport,
    StreamingStateConfig,
    stateful_foreach_batch,
)
from spark_integration.streaming.batch_identity import BatchKind
from spark_integration.streaming.input_lag import InputLagCollector
from spark_integration.streaming.metrics import SubtaskMetrics
from spark_integration.streaming.prometheus import PHASES, PrometheusStateMetrics
from spark_integration.streaming.worker_resources import WorkerResources

from .file_batches import write_batches
from .kafka_queries import BATCH_ROWS, produce, run_kafka
from .test_state_metrics import config_for, per_user

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``/metrics`` on ``port``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: Samples, name: str, application: str, **labels: str) -> float:
    key = (name, tuple(sorted({"application": application, "operator": "op",
                               **labels}.items())))
    assert key in samples, (key, sorted(k for k in samples if k[0] == name))
    return samples[key]


@pytest.mark.broker
@pytest.mark.spark
def test_scraped_metrics_equal_the_batch_reports_of_a_running_query(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"prom-{uuid.uuid4().hex[:8]}"
    config = config_for(kafka_cluster, prefix)
    source = tmp_path / "in"
    write_batches(source, [[{"user": f"u{i % 5}", "page": f"p{number}-{i}"} for i in range(8)]
                           for number in range(3)])
    metrics = PrometheusStateMetrics()
    port = metrics.serve(0)
    processor = stateful_foreach_batch(config, per_user, "user", "user string, n long",
                                       on_report=metrics.recorder(config))
    query = None
    try:
        query = (spark.readStream.schema("user string, page string")
                 .option("maxFilesPerTrigger", 1).json(str(source))
                 .writeStream.foreachBatch(processor)
                 .option("checkpointLocation", str(tmp_path / "chk"))
                 .trigger(processingTime="200 milliseconds").start())
        query.processAllAvailable()
        assert query.isActive
        samples = scrape(port)  # the query is still running
    finally:
        if query is not None:
            query.stop()
        processor.close()
        metrics.close()
    reports = list(processor.reports)
    assert [r.batch_id for r in reports] == [0, 1, 2]
    subtasks = [m for r in reports for m in r.subtask_metrics.values()]
    assert sample(samples, "kafka_changelog_batches_total", prefix, kind="first") == 1
    assert sample(samples, "kafka_changelog_batches_total", prefix, kind="new") == 2
    assert sample(samples, "kafka_changelog_input_rows_total", prefix) == 24
    assert sample(samples, "kafka_changelog_output_rows_total", prefix) == sum(
        r.rows_out for r in reports) == 15
    assert sample(samples, "kafka_changelog_state_changes_total", prefix) == sum(
        m.changes for m in subtasks)
    assert sample(samples, "kafka_changelog_changelog_bytes_total", prefix) == sum(
        m.change_bytes for m in subtasks)
    assert sample(samples, "kafka_changelog_task_transaction_retries_total", prefix) == sum(
        m.transaction_retries for m in subtasks)
    attaches = {dict(labels)["source"]: value for (name, labels), value in samples.items()
                if name == "kafka_changelog_subtask_attaches_total"
                and dict(labels)["application"] == prefix}
    # Batches 1 and 2 found each subtask's store on the host (the default backend).
    assert sum(attaches.values()) == 6 and attaches["fresh"] == 2, attaches
    assert set(attaches) <= {"fresh", "reattached", "reattached-local"}, attaches
    last = reports[-1]
    assert sample(samples, "kafka_changelog_checkpoint_id", prefix) == last.checkpoint_id == 3
    assert sample(samples, "kafka_changelog_batch_id", prefix) == 2
    assert sample(samples, "kafka_changelog_state_entries", prefix) == sum(
        m.state_rows for m in last.subtask_metrics.values()) == 10  # 5 users, 2 states
    assert sample(samples, "kafka_changelog_checkpoint_bytes", prefix) == sum(
        m.checkpoint_bytes for m in last.subtask_metrics.values())
    assert sample(samples, "kafka_changelog_subtasks", prefix) == 2
    for phase in PHASES:
        assert sample(samples, "kafka_changelog_batch_duration_seconds_count", prefix,
                      phase=phase) == 3
    assert sample(samples, "kafka_changelog_batch_duration_seconds_sum", prefix,
                  phase="batch") == pytest.approx(sum(r.seconds for r in reports))
    # The endpoint is gone once closed.
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def report(batch_id: int, kind: BatchKind, rows: int, source: StateSource,
           timers: int = 0, watermark_ms: int | None = None) -> BatchReport:
    subtask = SubtaskMetrics(
        subtask=0, rows_in=rows, keys=rows, state_rows=2 * rows, checkpoint_bytes=100 * rows,
        changes=3, change_bytes=90, materializations_started=1,
        materializations_completed=1, materialized_bytes=4096, state_source=source,
        restore_s=0.5 if source is StateSource.RESTORED else 0.0, rows_out=rows,
        late_rows=1, timers_fired=timers, transaction_retries=2)
    return BatchReport(batch_id, batch_id + 1, batch_id or None, True, rows, 1.25,
                       task_s=1.0, commit_s=0.125, kind=kind, subtask_metrics={0: subtask},
                       next_watermark_ms=watermark_ms)


def test_each_application_has_its_own_labels_and_counters_add_up() -> None:
    metrics = PrometheusStateMetrics()
    record_a = metrics.recorder(StreamingStateConfig(application="a", operator_id="op",
                                                     bootstrap_servers="127.0.0.1:9"))
    record_a(report(0, BatchKind.FIRST, 4, StateSource.FRESH))
    record_a(report(1, BatchKind.NEW, 6, StateSource.RESTORED, timers=2,
                    watermark_ms=1_700_000_000_500))
    metrics.record(report(7, BatchKind.NEW_QUERY, 1, StateSource.REATTACHED), "b", "op")
    registry = metrics.registry

    def value(name: str, application: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"application": application,
                                                "operator": "op", **labels})

    assert value("kafka_changelog_input_rows_total", "a") == 10
    assert value("kafka_changelog_input_rows_total", "b") == 1
    assert value("kafka_changelog_batches_total", "b", kind="new-query") == 1
    assert value("kafka_changelog_subtask_attaches_total", "a", source="restored") == 1
    assert value("kafka_changelog_restore_seconds_total", "a") == 0.5
    assert value("kafka_changelog_materializations_total", "a") == 2
    assert value("kafka_changelog_snapshot_bytes_total", "a") == 8192
    assert value("kafka_changelog_late_rows_total", "a") == 2
    assert value("kafka_changelog_task_transaction_retries_total", "a") == 4
    assert value("kafka_changelog_timers_fired_total", "a") == 2
    assert value("kafka_changelog_state_entries", "a") == 12  # the latest batch's
    assert value("kafka_changelog_checkpoint_id", "b") == 8
    assert value("kafka_changelog_watermark_seconds", "a") == 1_700_000_000.5
    assert value("kafka_changelog_watermark_seconds", "b") is None  # no event time
    assert value("kafka_changelog_batch_duration_seconds_bucket", "a", phase="commit",
                 le="0.25") == 2


@pytest.mark.broker
@pytest.mark.spark
def test_a_failing_recorder_is_logged_and_the_batch_commits(
    spark: Any, kafka_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_for(kafka_cluster, f"promfail-{uuid.uuid4().hex[:8]}")

    def broken(report: BatchReport) -> None:
        raise RuntimeError("the metrics system is down")

    with caplog.at_level(logging.ERROR, logger="spark_integration.streaming.driver"), \
            stateful_foreach_batch(config, per_user, "user", "user string, n long",
                                   on_report=broken) as processor:
        processor(spark.createDataFrame([("u", "p")], "user string, page string"), 0)
    assert [(r.batch_id, r.committed) for r in processor.reports] == [(0, True)]
    assert "on_report failed for batch 0 (checkpoint 1); the batch is committed" in caplog.text
    assert "the metrics system is down" in caplog.text


def test_the_dashboard_and_the_docs_name_exactly_the_exported_metrics() -> None:
    root = Path(__file__).resolve().parents[2]
    exported = {family.name for family in PrometheusStateMetrics().registry.collect()}
    counters = {family.name for family in PrometheusStateMetrics().registry.collect()
                if family.type == "counter"}
    # prometheus-client names a counter's family without "_total"; its sample has it.
    names = {f"{name}_total" if name in counters else name for name in exported}
    names.add(InputLagCollector.NAME)  # registered by track_input_lag
    dashboard = (root / "docs" / "grafana-dashboard.json").read_text()
    json.loads(dashboard)
    used = {re.sub(r"_(bucket|count|sum)$", "", name)
            for name in re.findall(r"kafka_changelog_[a-z_]+", dashboard)}
    assert used <= names, used - names
    documented = set(re.findall(r"`(kafka_changelog_[a-z_]+)`",
                                (root / "docs" / "operations.md").read_text()))
    assert documented == names, (documented ^ names)


@pytest.mark.broker
@pytest.mark.spark
def test_the_input_lag_is_the_records_after_the_states_offsets_measured_at_each_scrape(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"lag-{uuid.uuid4().hex[:8]}"
    config = config_for(kafka_cluster, prefix)
    settings = kafka_cluster.client_config()
    input_topic = f"{prefix}-in"
    ensure_topic(settings, input_topic, partitions=2)
    ensure_topic(settings, f"{prefix}-out", partitions=2)
    all_events = list(events(2 * BATCH_ROWS + 14, 6))
    metrics = PrometheusStateMetrics()
    metrics.track_input_lag(config)
    port = metrics.serve(0)
    try:
        # No checkpoint yet: nothing to measure.
        assert lag_samples(scrape(port), prefix) == {}
        produce(settings, input_topic, all_events[:2 * BATCH_ROWS])
        _, error = run_kafka(spark, config, input_topic, f"{prefix}-out", tmp_path / "chk")
        assert error is None, error
        # The state holds all the input: 20 records of each partition.
        assert lag_samples(scrape(port), prefix) == {(input_topic, "0"): 0,
                                                     (input_topic, "1"): 0}
        # Input the stopped query has not applied (seq % 2 picks the partition).
        produce(settings, input_topic, all_events[2 * BATCH_ROWS:])
        assert lag_samples(scrape(port), prefix) == {(input_topic, "0"): 7,
                                                     (input_topic, "1"): 7}
        # An input cluster that cannot be reached: the scrape answers without the lag.
        unreachable = PrometheusStateMetrics()
        unreachable.track_input_lag(config, {"bootstrap.servers": "127.0.0.1:1"},
                                    timeout_s=2.0)
        other_port = unreachable.serve(0)
        try:
            assert lag_samples(scrape(other_port), prefix) == {}
        finally:
            unreachable.close()
    finally:
        metrics.close()
        WorkerResources.release(config)


def lag_samples(samples: Samples, application: str) -> dict[tuple[str, str], float]:
    return {(labels["topic"], labels["partition"]): value
            for (name, label_items), value in samples.items()
            if name == "kafka_changelog_input_lag_records"
            for labels in [dict(label_items)] if labels["application"] == application}
