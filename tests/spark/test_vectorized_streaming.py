"""The vectorised entry point (``stateful_foreach_batch(..., vectorized=True)``) against the
per-key one, in a real ``local[2]`` session over a real broker.

The clickstream job runs twice on the same three micro-batches: per key
(``clickstream.update_user``) and vectorised (``clickstream.update_users``: once per
subtask per batch, pandas aggregates and bulk state). Both must give exactly the same
outputs per batch and leave exactly the same state in their last checkpoint (every
key group's snapshot bytes, restored from Kafka), which is also what the events give
(``clickstream.expected_state``); with a single key column and with a composite key
(a string and an int column, the latter's keys given as ``(str, int)``).
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from examples.clickstream import (
    EVENTS,
    KINDS,
    LAST_PAGES,
    OUTPUT_SCHEMA,
    SPENT,
    ensure_topic,
    expected_state,
    output_problems,
    read_outputs,
    update_user,
    update_users,
)
from examples.events import events
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.kafka_sink import KafkaOutputSink
from spark_integration.streaming.vectorized import BatchState, call_vectorized
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import restored_backend

pytestmark = [pytest.mark.spark]

EVENT_SCHEMA = "user string, device int, seq long, kind string, page string, amount double"
EVENT_COLUMNS = [c.split()[0] for c in EVENT_SCHEMA.split(", ")]
BATCHES = 3
PER_BATCH = 300
USERS = 120


def event_batches() -> list[list[dict[str, Any]]]:
    """Three batches of clickstream events, each with a device (0..2) per event."""
    rng = random.Random(3)
    stream = [{**e, "device": rng.randrange(3)} for e in events(BATCHES * PER_BATCH, USERS)]
    return [stream[i:i + PER_BATCH] for i in range(0, len(stream), PER_BATCH)]


def composite_per_key(key: Any, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    """``update_user`` keyed by (user, device); the output names both."""
    user, device = key
    return [{**row, "user": f"{user}/{device}"} for row in update_user(key, rows, state)]


def composite_vectorized(rows: pd.DataFrame, state: BatchState) -> pd.DataFrame:
    """``update_users`` keyed by (user, device): the keys are what the per-key API gets."""
    assert all(type(user) is str and type(device) is int for user, device in state.keys)
    outputs = update_users(rows, state)
    outputs["user"] = [f"{user}/{device}" for user, device in state.keys]
    return outputs


def app_config(cluster: Any, prefix: str, **fields: Any) -> StreamingStateConfig:
    return StreamingStateConfig(
        application=prefix, operator_id="clicks", bootstrap_servers=cluster.bootstrap_servers,
        parallelism=2, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, materialization_interval_s=None, **fields)


def run_job(spark: Any, config: StreamingStateConfig, fn: Any, key_column: Any,
            vectorized: bool, batches: list[list[dict[str, Any]]]) -> list[pd.DataFrame]:
    """The batches through a processor; each batch's outputs, sorted by user."""
    from spark_integration.streaming import stateful_foreach_batch

    outputs: dict[int, pd.DataFrame] = {}
    with stateful_foreach_batch(
        config, fn, key_column, OUTPUT_SCHEMA, order_by=["seq"], vectorized=vectorized,
        sink=lambda frame, batch_id: outputs.__setitem__(batch_id, frame.toPandas()),
    ) as processor:
        for batch_id, batch in enumerate(batches):
            frame = pd.DataFrame(batch, columns=EVENT_COLUMNS)
            processor(spark.createDataFrame(frame, EVENT_SCHEMA), batch_id)
        assert [r.committed for r in processor.reports] == [True] * len(batches)
    return [outputs[b].sort_values("user").reset_index(drop=True) for b in range(len(batches))]


def restored_state(config: StreamingStateConfig) -> tuple[dict[int, bytes], dict[bytes, Any]]:
    """The last checkpoint's state restored from Kafka into one backend: every key group's
    snapshot bytes, and each key's clickstream state read through the per-key API."""
    try:
        with restored_backend(config) as backend:
            table = backend.table
            groups = {kg: table.serialize_group(kg) for kg in table.key_groups()}
            keys = sorted({key for kg in table.key_groups() for _, key, _ in table.entries(kg)})
            by_key = {}
            for key in keys:
                backend.set_current_key(key)
                by_key[key] = {"events": backend.state(EVENTS).value(),
                               "spent": backend.state(SPENT).get(),
                               "kinds": dict(backend.state(KINDS).items()),
                               "last_pages": backend.state(LAST_PAGES).get()}
            return groups, by_key
    finally:
        WorkerResources.release(config)


@pytest.mark.broker
@pytest.mark.parametrize("case", ["user", "user_device_rocksdb"])
def test_vectorised_clickstream_equals_the_per_key_one(spark: Any, kafka_cluster: Any,
                                                       tmp_path: Path, case: str) -> None:
    batches = event_batches()
    prefix = f"vec-{case[:4]}-{uuid.uuid4().hex[:8]}"
    if case == "user":
        key_column: Any = "user"
        per_key_fn, vectorized_fn = update_user, update_users
        vectorized_fields: dict[str, Any] = {}
    else:
        key_column = ["user", "device"]
        per_key_fn, vectorized_fn = composite_per_key, composite_vectorized
        vectorized_fields = {"state_backend": "rocksdb", "local_state_dir": str(tmp_path)}
    per_key_config = app_config(kafka_cluster, f"{prefix}-k")
    vectorized_config = app_config(kafka_cluster, f"{prefix}-v", **vectorized_fields)

    per_key_out = run_job(spark, per_key_config, per_key_fn, key_column, False, batches)
    vectorized_out = run_job(spark, vectorized_config, vectorized_fn, key_column, True,
                             batches)
    for batch_id in range(BATCHES):
        pd.testing.assert_frame_equal(vectorized_out[batch_id], per_key_out[batch_id])
        assert len(per_key_out[batch_id]) == len(
            {tuple(e[c] for c in ([key_column] if case == "user" else key_column))
             for e in batches[batch_id]})

    per_key_groups, per_key_state = restored_state(per_key_config)
    vectorized_groups, vectorized_state = restored_state(vectorized_config)
    assert vectorized_groups == per_key_groups
    assert vectorized_state == per_key_state
    if case == "user":
        expected = expected_state(e for batch in batches for e in batch)
        assert vectorized_state == {user.encode(): state for user, state in expected.items()}


@pytest.mark.broker
def test_vectorised_outputs_are_committed_by_the_tasks(spark: Any, kafka_cluster: Any) -> None:
    """With a ``KafkaOutputSink`` each subtask commits the vectorised function's outputs
    in its own transaction: every batch's outputs once, the last totals right."""
    from spark_integration.streaming import stateful_foreach_batch

    batches = event_batches()
    prefix = f"vec-sink-{uuid.uuid4().hex[:8]}"
    config = app_config(kafka_cluster, prefix)
    settings = {"bootstrap.servers": kafka_cluster.bootstrap_servers}
    topic = f"{prefix}-out"
    ensure_topic(settings, topic)
    with stateful_foreach_batch(config, update_users, "user", OUTPUT_SCHEMA, order_by=["seq"],
                                sink=KafkaOutputSink(topic, key_column="user"),
                                vectorized=True) as processor:
        for batch_id, batch in enumerate(batches):
            frame = pd.DataFrame(batch, columns=EVENT_COLUMNS)
            processor(spark.createDataFrame(frame, EVENT_SCHEMA), batch_id)
    rows = read_outputs(settings, topic)
    assert output_problems(rows, expected_state(e for b in batches for e in b)) == []
    assert len(rows) == sum(len({e["user"] for e in batch}) for batch in batches)
    WorkerResources.release(config)


def test_call_vectorized_gives_each_row_its_key(tmp_path: Path) -> None:
    """``BatchState``: keys in row order (first row of each key), ``key_index`` per row,
    natural values as the per-key API gives them (no Spark needed)."""
    from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange, key_group_for_key
    from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
    from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
    from spark_integration.streaming.key_runs import natural_key_value

    rows = pd.DataFrame({"region": ["eu", "eu", "us", "us", "us"],
                         "user": [1, 1, 1, 2, 2], "x": [10, 11, 12, 13, 14]})
    key_bytes = pd.Series([b"eu1", b"eu1", b"us1", b"us2", b"us2"])
    key_groups = pd.Series([key_group_for_key(k, 128) for k in key_bytes])
    seen: dict[str, Any] = {}

    def fn(frame: pd.DataFrame, state: BatchState) -> list[dict[str, Any]]:
        seen.update(keys=state.keys, index=state.key_index.tolist(), frame=frame)
        state.value(EVENTS).set(state.keys, frame.groupby(state.key_index).size())
        return [{"n": 1}]

    with InMemoryChangelogStorage() as storage:
        backend = ChangelogKeyedStateBackend(storage, InMemorySnapshotStore(), "op",
                                             KeyGroupRange.of(0, 127), 128)
        produced, keys = call_vectorized(fn, backend, rows.set_index(pd.Index([5] * 5)),
                                         key_bytes, key_groups, ["region", "user"],
                                         natural_key_value)
        backend.set_current_key(b"us2")
        assert backend.state(EVENTS).value() == 2
        backend.close()
    assert (produced, keys) == ([{"n": 1}], 3)
    assert seen["keys"] == [("eu", 1), ("us", 1), ("us", 2)]
    assert [type(k[0]) for k in seen["keys"]] == [str] * 3
    assert seen["index"] == [0, 0, 1, 2, 2]
    assert list(seen["frame"].index) == [0, 1, 2, 3, 4]
