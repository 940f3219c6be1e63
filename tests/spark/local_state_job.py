"""Micro-batches of a stateful query with ``state_backend="rocksdb"``, in a Spark session of
its own whose Python workers are never reused (``spark.python.worker.reuse=false``): every
task runs in a new Python process, so whatever state a task finds in the process is none,
and a subtask's state can only come from the host's local state directory or Kafka.

``python -m tests.spark.local_state_job <spec.json>``; the spec names the brokers, the
application prefix, the local state directory, the parallelism, the batches (lists of
``[user, page]``) with their first batch id, and ``truncate_after``: a batch id after
whose commit every record of the changelog topic is deleted (so that any later read of
the changelog fails). Prints one JSON line per batch: its report and outputs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_changelog.state import INT64, UTF8, map_state, value_state
from spark_integration.sessions.session import local_session
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch

COUNT = value_state("count", INT64)
PAGES = map_state("pages", UTF8, INT64)


def per_user(key: str, rows: Any, state: Any) -> list[dict[str, Any]]:
    """Counts events per user and per page; outputs the user's totals."""
    count = state(COUNT)
    count.update((count.value() or 0) + len(rows))
    pages = state(PAGES)
    for page in rows["page"]:
        pages.put(page, (pages.get(page) or 0) + 1)
    return [{"user": str(key), "n": count.value(), "pages": len(list(pages.keys()))}]


def config_of(spec: dict[str, Any]) -> StreamingStateConfig:
    """The query's state config (shared with the test, which reads the state back)."""
    prefix = spec["prefix"]
    return StreamingStateConfig(
        application=prefix, operator_id="op", bootstrap_servers=spec["bootstrap_servers"],
        parallelism=spec["parallelism"], changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, materialization_interval_s=None, state_backend="rocksdb",
        local_state_dir=spec["local_state_dir"])


def truncate_changelog(config: StreamingStateConfig) -> None:
    """Delete every record of the changelog topic (DeleteRecords to the high watermark)."""
    admin = AdminClient({"bootstrap.servers": config.bootstrap_servers})
    doomed = [TopicPartition(config.changelog_topic, p, -1) for p in range(config.partitions)]
    for future in admin.delete_records(doomed).values():
        future.result(60)


def main(spec: dict[str, Any]) -> None:
    config = config_of(spec)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = local_session(app_name="local-state-job", parallelism=2, extra_config={
        "spark.python.worker.reuse": "false", "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1"})
    try:
        processor = stateful_foreach_batch(config, per_user, "user",
                                           "user string, n long, pages long")
        for offset, rows in enumerate(spec["batches"]):
            batch_id = spec["first_batch_id"] + offset
            outputs: list[dict[str, Any]] = []

            def keep(frame: Any, _: int, into: list[dict[str, Any]] = outputs) -> None:
                into.extend(r.asDict() for r in frame.collect())

            processor.sink = keep
            processor(spark.createDataFrame(rows, "user string, page string"), batch_id)
            report = processor.reports[-1]
            print(json.dumps({"report": report.to_dict(), "outputs": outputs}), flush=True)
            if batch_id == spec.get("truncate_after"):
                truncate_changelog(config)
        if spec.get("close", False):
            processor.close()
    finally:
        spark.stop()


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
