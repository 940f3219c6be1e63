"""Rewind with Spark's Kafka source: state and input go back together.

Application ``fwd`` runs two batches over input A (checkpoints 1, 2, each recording the
input offsets its batch read up to), is rewound to checkpoint 1 with the CLI, and
restarts with a new checkpointLocation and ``starting_offsets`` of checkpoint 1 over A
and B. Application ``ref`` shares its topics and ran once over A and B without ever
going forward. Both end with exactly the same state, and ``fwd``'s outputs after the
rewind are exactly ``ref``'s after its checkpoint 1 (the abandoned checkpoints' outputs
stay published: Kafka records cannot be taken back). ``ref``'s state is untouched by
the rewind of ``fwd``, and the old checkpointLocation of ``fwd`` is refused.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from examples.clickstream import (
    ensure_topic,
    expected_state,
    read_outputs,
)
from examples.events import events
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.checkpoints.source_offsets import SOURCE_OFFSETS_PROPERTY
from kafka_changelog.state.history.rewind import REWOUND_FROM_PROPERTY, execute_rewind, plan_rewind
from spark_integration import starting_offsets
from spark_integration.checkpoint_properties import BATCH_ID, QUERY_ID
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.batch_identity import (
    BatchKind,
    BatchOrderError,
    BatchPlan,
    plan_batch,
)
from spark_integration.streaming.worker_resources import WorkerResources

from ..cli.cli_helpers import cli
from .kafka_queries import BATCH_ROWS, produce, run_kafka, state_of

pytestmark = [pytest.mark.broker, pytest.mark.spark]

def by_batch(outputs: list[tuple[int, str, int, float]]) -> list[list[tuple[str, int, float]]]:
    """The outputs per checkpoint, in checkpoint order (each sorted)."""
    ids = sorted({c for c, *_ in outputs})
    return [sorted((u, e, s) for c, u, e, s in outputs if c == i) for i in ids]


def test_a_rewound_and_rerun_application_ends_as_one_that_never_went_forward(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    prefix = f"rw-{uuid.uuid4().hex[:8]}"
    settings = kafka_cluster.client_config()
    input_topic, fwd_out, ref_out = f"{prefix}-in", f"{prefix}-fwd-out", f"{prefix}-ref-out"
    ensure_topic(settings, input_topic, partitions=1)
    for topic in (fwd_out, ref_out):
        ensure_topic(settings, topic, partitions=2)

    def config(application: str) -> StreamingStateConfig:
        return StreamingStateConfig(
            application=application, operator_id="user-sessions",
            bootstrap_servers=kafka_cluster.bootstrap_servers, parallelism=2,
            changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
            checkpoint_topic=f"{prefix}-checkpoints", partitions=2,
            materialization_interval_s=None)

    fwd, ref = config(f"{prefix}-fwd"), config(f"{prefix}-ref")
    all_events = list(events(3 * BATCH_ROWS, 6))
    users = sorted({e["user"] for e in all_events})
    input_a, input_b = all_events[:2 * BATCH_ROWS], all_events[2 * BATCH_ROWS:]
    try:
        produce(settings, input_topic, input_a, partitions=1)
        forward, error = run_kafka(spark, fwd, input_topic, fwd_out, tmp_path / "fwd-1")
        assert error is None, error
        assert [(r.batch_id, r.checkpoint_id) for r in forward] == [(0, 1), (1, 2)]
        # Each checkpoint records the offsets its batch read up to.
        assert [starting_offsets(fwd, checkpoint_id=i) for i in (1, 2)] == [
            f'{{"{input_topic}":{{"0":{n * BATCH_ROWS}}}}}' for n in (1, 2)]

        produce(settings, input_topic, input_b, partitions=1)
        reference, error = run_kafka(spark, ref, input_topic, ref_out, tmp_path / "ref")
        assert error is None, error
        assert [r.checkpoint_id for r in reference] == [1, 2, 3]
        ref_state = state_of(ref, users)
        expected = {u: (s["events"], s["spent"])
                    for u, s in expected_state(iter(all_events)).items()}
        assert ref_state == expected

        topics = ["-b", kafka_cluster.bootstrap_servers,
                  "--checkpoint-topic", fwd.checkpoint_topic]
        rewound = cli(*topics, "rewind", fwd.application, "--to", "1", "--yes", "--force")
        assert rewound.returncode == 0, rewound.stderr
        assert rewound.stdout.splitlines() == [
            f"application {fwd.application} (checkpoint topic {fwd.checkpoint_topic}):",
            "  rewound to checkpoint 1: its copy is checkpoint 4, the latest (was 2)",
            "  discarded checkpoints: 2",
            "  deleted snapshot chunks only they use: none",
            f'  startingOffsets: {{"{input_topic}":{{"0":{BATCH_ROWS}}}}}']
        # The other application sharing the topics still restores exactly.
        assert state_of(ref, users) == ref_state

        # The old checkpointLocation would skip the input the rewind took back: refused.
        _, error = run_kafka(spark, fwd, input_topic, fwd_out, tmp_path / "fwd-1")
        assert error is not None
        assert (f"application '{fwd.application}' was rewound to checkpoint 1 (now "
                "checkpoint 4)") in str(error)

        start = starting_offsets(fwd)
        assert start == f'{{"{input_topic}":{{"0":{BATCH_ROWS}}}}}'
        rerun, error = run_kafka(spark, fwd, input_topic, fwd_out, tmp_path / "fwd-2", start)
        assert error is None, error
        assert [(r.batch_id, r.checkpoint_id, r.restored_from, r.kind) for r in rerun] == [
            (0, 5, 4, "new-query"), (1, 6, 5, "new")]
        assert state_of(fwd, users) == ref_state

        fwd_batches = by_batch(read_outputs(settings, fwd_out))
        ref_batches = by_batch(read_outputs(settings, ref_out))
        # Checkpoints 1, 2 (2 abandoned), then 5, 6 after the rewind (its copy: 4).
        assert len(fwd_batches) == 4
        assert [fwd_batches[0], *fwd_batches[2:]] == ref_batches
        latest = WorkerResources.coordinator(fwd).checkpoint()
        assert latest is not None and REWOUND_FROM_PROPERTY not in latest.properties
        assert latest.properties[SOURCE_OFFSETS_PROPERTY] == (
            f'{{"{input_topic}":{{"0":{3 * BATCH_ROWS}}}}}')
    finally:
        WorkerResources.release(fwd)
        WorkerResources.release(ref)


def test_after_a_rewind_only_a_new_query_may_run_and_it_starts_from_the_copy() -> None:
    store = InMemoryCheckpointStore(retain=10)
    for checkpoint_id in (1, 2, 3):
        store.commit(CompletedCheckpoint("shop", checkpoint_id, 0, 128, (), properties={
            QUERY_ID: "q1", BATCH_ID: str(checkpoint_id - 1),
            SOURCE_OFFSETS_PROPERTY: f'{{"in":{{"0":{checkpoint_id * 5}}}}}'}))
    execute_rewind(store, plan_rewind(store, "shop", 1), lambda chunks: None)
    for batch_id in (0, 1, 3):  # q1's batch 0 again, its next, and the one after its last
        with pytest.raises(BatchOrderError) as refused:
            plan_batch(store, "shop", "q1", batch_id)
        assert str(refused.value) == (
            f"application 'shop' was rewound to checkpoint 1 (now checkpoint 5), but Spark "
            f"query q1 runs batch {batch_id} from the checkpointLocation that committed it "
            "(batch 0): that checkpointLocation goes on after input the rewind took back, "
            "which would be skipped. Start the query with a new checkpointLocation and "
            'startingOffsets={"in":{"0":5}} (spark_integration.starting_offsets gives it)')
    assert plan_batch(store, "shop", "q2", 0) == BatchPlan(6, 5, True, BatchKind.NEW_QUERY)
