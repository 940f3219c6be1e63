"""Two stateful operators in one query (one ``foreachBatch`` calling two processors).

Each keeps its own application's checkpoints: both states come out exact. Two
operators under one application name are refused at their first batch, naming both
operators, before the second one runs or commits anything, and the first one's state
stays as committed.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.errors import StreamingQueryException

from examples.events import events
from kafka_changelog import key_group_range_for_operator
from kafka_changelog.state import INT64, value_state
from spark_integration.streaming import (
    KeyState,
    StatefulProcessor,
    StreamingStateConfig,
    stateful_foreach_batch,
)
from spark_integration.streaming.batch_identity import OperatorMismatchError
from spark_integration.streaming.worker_resources import WorkerResources

from .file_batches import write_batches

pytestmark = [pytest.mark.broker, pytest.mark.spark]

SEEN = value_state("seen", INT64)


def count_rows(key: str, rows: pd.DataFrame, state: KeyState) -> list[dict[str, Any]]:
    seen = state(SEEN)
    seen.update((seen.value() or 0) + len(rows))
    return []


def processor(kafka_cluster: Any, prefix: str, application: str, operator: str,
              key: str) -> StatefulProcessor:
    config = StreamingStateConfig(
        application=application, operator_id=operator,
        bootstrap_servers=kafka_cluster.bootstrap_servers, parallelism=2,
        changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
        checkpoint_topic=f"{prefix}-checkpoints", partitions=4,
        materialization_interval_s=None)
    return stateful_foreach_batch(config, count_rows, key, "k string")


def run(spark: Any, processors: list[StatefulProcessor], chunks: list[list[dict[str, Any]]],
        checkpoint: Path) -> Any:
    def both(df: Any, batch_id: int) -> None:
        for p in processors:
            p(df, batch_id)

    data = checkpoint.parent / f"{checkpoint.name}-in"
    write_batches(data, chunks)
    query = (spark.readStream.schema("seq long, user string, kind string, page string, "
                                     "amount double")
             .option("maxFilesPerTrigger", 1).json(str(data))
             .writeStream.foreachBatch(both).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        with contextlib.suppress(StreamingQueryException):  # returned below
            query.awaitTermination(300)
        return query.exception()
    finally:
        query.stop()
        for p in processors:
            p.close()


def state_of(config: StreamingStateConfig, keys: list[str]) -> dict[str, int | None]:
    coordinator = WorkerResources.coordinator(config)
    backend = coordinator.restore_keyed(config.operator_id,
                                        key_group_range_for_operator(128, 1, 0),
                                        coordinator.checkpoint(), config.changelog())
    try:
        found = {}
        for key in keys:
            backend.set_current_key(key.encode())
            found[key] = backend.state(SEEN).value()
        return found
    finally:
        backend.close()
        WorkerResources.release(config)


def test_two_operators_with_applications_of_their_own(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"two-{uuid.uuid4().hex[:8]}"
    all_events = list(events(300, 9))
    per_user = processor(kafka_cluster, prefix, f"{prefix}-users", "per-user", "user")
    per_page = processor(kafka_cluster, prefix, f"{prefix}-pages", "per-page", "page")
    assert run(spark, [per_user, per_page], [all_events[:150], all_events[150:]],
               tmp_path / "chk") is None
    users = Counter(e["user"] for e in all_events)
    pages = Counter(e["page"] for e in all_events)
    assert state_of(per_user.config, sorted(users)) == dict(users)
    assert state_of(per_page.config, sorted(pages)) == dict(pages)
    assert [(r.checkpoint_id, r.committed) for r in per_page.reports] == [(1, True), (2, True)]


def test_two_operators_under_one_application_are_refused_before_the_second_runs(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"one-{uuid.uuid4().hex[:8]}"
    all_events = list(events(300, 9))
    per_user = processor(kafka_cluster, prefix, prefix, "per-user", "user")
    per_page = processor(kafka_cluster, prefix, prefix, "per-page", "page")
    error = run(spark, [per_user, per_page], [all_events[:150], all_events[150:]],
                tmp_path / "chk")
    assert error is not None
    assert OperatorMismatchError.__name__ in str(error)
    assert (f"application '{prefix}': checkpoint 1 holds the state of operator(s) "
            "['per-user'], not of operator 'per-page'") in str(error)
    assert not per_page.reports
    # The first operator's first batch stays committed, and nothing else.
    assert [(r.checkpoint_id, r.committed) for r in per_user.reports] == [(1, True)]
    users = Counter(e["user"] for e in all_events[:150])
    assert state_of(per_user.config, sorted(users)) == dict(users)
