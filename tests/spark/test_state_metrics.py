"""State metrics per micro-batch: numbers equal to what was written, and a listener that
receives them with Spark's own progress."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kafka_changelog.kafka import KafkaChangelogReader
from kafka_changelog.state import INT64, UTF8, list_state, value_state
from spark_integration.streaming import (
    BatchReport,
    StreamingStateConfig,
    stateful_foreach_batch,
)
from spark_integration.streaming.metrics import StateMetricsListener
from spark_integration.streaming.worker_resources import WorkerResources

from .file_batches import write_batches

pytestmark = [pytest.mark.broker, pytest.mark.spark]

COUNT = value_state("count", INT64)
PAGES = list_state("pages", UTF8)


def per_user(key: str, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    count = state(COUNT)
    count.update((count.value() or 0) + len(rows))  # one SET per key
    pages = state(PAGES)
    for page in rows["page"]:
        pages.add(page)  # logged as one LIST_ADD per key (the key's net change)
    return [{"user": key, "n": count.value()}]


def config_for(cluster: Any, prefix: str) -> StreamingStateConfig:
    return StreamingStateConfig(
        application=prefix, operator_id="op", bootstrap_servers=cluster.bootstrap_servers,
        parallelism=2, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, materialization_interval_s=None)


def test_batch_metrics_equal_what_was_written(spark: Any, kafka_cluster: Any) -> None:
    prefix = f"metrics-{uuid.uuid4().hex[:8]}"
    config = config_for(kafka_cluster, prefix)
    batches = [[(f"u{i % 9}", f"p{i}") for i in range(40)],
               [(f"u{i % 4}", f"q{i}") for i in range(10)]]
    with stateful_foreach_batch(config, per_user, "user", "user string, n long") as processor:
        for batch_id, rows in enumerate(batches):
            processor(spark.createDataFrame(rows, "user string, page string"), batch_id)
    coordinator = WorkerResources.coordinator(config)
    seen_users: set[str] = set()
    previous: dict[int, tuple[int, int]] = {}
    for report, rows in zip(processor.reports, batches, strict=True):
        metrics = report.subtask_metrics
        assert sorted(metrics) == [0, 1]
        assert sum(m.rows_in for m in metrics.values()) == len(rows)
        assert sum(m.keys for m in metrics.values()) == len({u for u, _ in rows})
        seen_users |= {u for u, _ in rows}
        # Two states per user seen so far.
        assert sum(m.state_rows for m in metrics.values()) == 2 * len(seen_users)
        checkpoint = coordinator.checkpoints.get(config.application, report.checkpoint_id)
        with KafkaChangelogReader(config.changelog()) as reader:
            for subtask in checkpoint.subtasks:
                m = metrics[subtask.subtask_index]
                assert subtask.keyed is not None
                assert m.checkpoint_bytes == subtask.keyed.state_size
                # No materialization: the checkpoint's changelog is every batch so far,
                # so this batch's changes are what it added to the previous checkpoint's.
                logged = [c for h in subtask.keyed.changelog for c in reader.read(h)]
                total = (len(logged), sum(len(c.payload) for c in logged))
                before = previous.get(subtask.subtask_index, (0, 0))
                assert (m.changes, m.change_bytes) == (total[0] - before[0],
                                                       total[1] - before[1])
                previous[subtask.subtask_index] = total
                assert (m.materializations_started, m.materializations_completed,
                        m.materialized_bytes) == (0, 0, 0)
        # Each key logs its net changes: one SET and one LIST_ADD of all its pages; then
        # the registrations (2 states per subtask, logged at most twice per batch: by a
        # backend that reattached a store, and at their first use in it).
        users = len({u for u, _ in rows})
        assert 2 * users <= sum(m.changes for m in metrics.values()) <= 2 * users + 2 * 2 * 2
        if report.batch_id == 0:
            assert {m.state_source for m in metrics.values()} == {"fresh"}
        else:
            # The default backend (rocksdb) keeps each subtask's store on the host: any
            # Python worker takes it over, nothing is read back from Kafka.
            assert {m.state_source for m in metrics.values()} <= {"reattached",
                                                                   "reattached-local"}
        assert set(report.restore_s) == {
            s for s, m in metrics.items() if m.state_source == "restored"}
        assert json.loads(json.dumps(report.to_dict()))["subtask_metrics"]["0"]["subtask"] == 0
    WorkerResources.release(config)


def test_a_listener_gets_each_batch_report_with_sparks_progress(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"listen-{uuid.uuid4().hex[:8]}"
    config = config_for(kafka_cluster, prefix)
    source = tmp_path / "in"
    write_batches(source, [[{"user": f"u{i % 5}", "page": f"p{number}-{i}"} for i in range(8)]
                           for number in range(3)])
    received: list[tuple[BatchReport, Any]] = []
    processor = stateful_foreach_batch(config, per_user, "user", "user string, n long")
    listener = StateMetricsListener(processor, lambda r, p: received.append((r, p)))
    spark.streams.addListener(listener)
    try:
        query = (spark.readStream.schema("user string, page string")
                 .option("maxFilesPerTrigger", 1).json(str(source))
                 .writeStream.foreachBatch(processor)
                 .option("checkpointLocation", str(tmp_path / "chk"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None
        deadline = time.monotonic() + 30  # listener events arrive asynchronously
        while len(received) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
        processor.close()
    assert [r.batch_id for r, _ in received] == [0, 1, 2]
    assert all(p.batchId == r.batch_id and str(p.id) == r.query_id for r, p in received)
    assert [sum(m.rows_in for m in r.subtask_metrics.values()) for r, _ in received] == [8] * 3
    assert [p.numInputRows for _, p in received] == [8] * 3


def test_reports_are_kept_for_the_last_batches_only(spark: Any, kafka_cluster: Any) -> None:
    """A query that runs for months keeps a bounded window of reports."""
    config = config_for(kafka_cluster, f"window-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ValueError, match="reports_kept must be at least 1, got 0"):
        stateful_foreach_batch(config, per_user, "user", "user string, n long", reports_kept=0)
    with stateful_foreach_batch(config, per_user, "user", "user string, n long",
                                reports_kept=2) as processor:
        for batch_id in range(3):
            processor(spark.createDataFrame([("u", f"p{batch_id}")], "user string, page string"),
                      batch_id)
        assert [r.batch_id for r in processor.reports] == [1, 2]
        assert [r.checkpoint_id for r in processor.reports] == [2, 3]
        assert processor.batches_run == 3
