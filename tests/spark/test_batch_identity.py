"""Which checkpoint a micro-batch commits and starts from (spark_integration.batch_identity)."""

from __future__ import annotations

import pytest

from kafka_changelog.state.checkpoint import CompletedCheckpoint
from kafka_changelog.state.checkpoint_store import InMemoryCheckpointStore
from spark_integration.batch_identity import (
    BATCH_ID,
    QUERY_ID,
    BatchOrderError,
    BatchPlan,
    plan_batch,
)

APP = "shop"


def commit(store: InMemoryCheckpointStore, plan: BatchPlan, query: str, batch: int) -> None:
    assert plan.commit
    store.commit(CompletedCheckpoint(APP, plan.checkpoint_id, 0, 128, (),
                                     properties=plan.properties(query, batch)))


def test_a_query_numbers_checkpoints_on_and_recomputes_a_rerun_from_the_one_before() -> None:
    store = InMemoryCheckpointStore()
    assert plan_batch(store, APP, "q1", 0) == BatchPlan(1, None, True, "first")
    commit(store, plan_batch(store, APP, "q1", 0), "q1", 0)
    # Spark runs batch 0 again (crash after our commit, before Spark's).
    assert plan_batch(store, APP, "q1", 0) == BatchPlan(1, None, False, "rerun")
    commit(store, plan_batch(store, APP, "q1", 1), "q1", 1)
    assert plan_batch(store, APP, "q1", 1) == BatchPlan(2, 1, False, "rerun")
    assert plan_batch(store, APP, "q1", 2) == BatchPlan(3, 2, True, "new")


def test_a_fresh_checkpoint_location_continues_from_the_latest_checkpoint() -> None:
    store = InMemoryCheckpointStore()
    for batch in range(3):
        commit(store, plan_batch(store, APP, "q1", batch), "q1", batch)
    # A new query id, batch ids from 0 again: state carries over, nothing is dropped.
    fresh = plan_batch(store, APP, "q2", 0)
    assert fresh == BatchPlan(4, 3, True, "new-query")
    commit(store, fresh, "q2", 0)
    assert store.latest(APP).properties == {QUERY_ID: "q2", BATCH_ID: "0"}  # type: ignore[union-attr]
    # Its own re-run is recognised, with the other query's checkpoint as base.
    assert plan_batch(store, APP, "q2", 0) == BatchPlan(4, 3, False, "rerun")
    assert plan_batch(store, APP, "q2", 1) == BatchPlan(5, 4, True, "new")


def test_a_rolled_back_checkpoint_location_is_refused() -> None:
    store = InMemoryCheckpointStore()
    for batch in range(4):
        commit(store, plan_batch(store, APP, "q1", batch), "q1", batch)
    with pytest.raises(BatchOrderError, match=r"runs batch 1, but .*latest checkpoint 4 was "
                                              r"committed by batch 3 of the same query"):
        plan_batch(store, APP, "q1", 1)


def test_checkpoints_of_version_0_1_match_batch_id_plus_one() -> None:
    store = InMemoryCheckpointStore()
    for checkpoint_id in (1, 2, 3):  # written by 0.1: no properties, id = batch + 1
        store.commit(CompletedCheckpoint(APP, checkpoint_id, 0, 128, ()))
    assert plan_batch(store, APP, "q1", 2) == BatchPlan(3, 2, False, "rerun")
    assert plan_batch(store, APP, "q1", 3) == BatchPlan(4, 3, True, "new")
    assert plan_batch(store, APP, "q9", 0) == BatchPlan(4, 3, True, "new-query")
