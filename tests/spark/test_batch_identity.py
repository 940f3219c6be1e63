"""Which checkpoint a micro-batch commits and starts from (streaming.batch_identity)."""

from __future__ import annotations

import pytest

from kafka_changelog.keys import KEY_TYPES_PROPERTY, KeyTypeError
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint, SubtaskState
from kafka_changelog.state.checkpoints.checkpoint_store import InMemoryCheckpointStore
from kafka_changelog.state.history.state_write import STATE_WRITE_MODE_PROPERTY
from spark_integration.checkpoint_properties import BATCH_ID, QUERY_ID
from spark_integration.streaming.batch_identity import (
    BatchOrderError,
    BatchPlan,
    OperatorMismatchError,
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


def test_a_state_writes_first_checkpoint_is_continued_by_any_query_as_a_new_one() -> None:
    store = InMemoryCheckpointStore()
    store.commit(CompletedCheckpoint(APP, 1, 0, 128, (),
                                     properties={STATE_WRITE_MODE_PROPERTY: "apply"}))
    # Batch 0 of a query is not a re-run of checkpoint 1 (no query committed it).
    assert plan_batch(store, APP, "q1", 0) == BatchPlan(2, 1, True, "new-query")
    assert plan_batch(store, APP, "q1", 5) == BatchPlan(2, 1, True, "new-query")


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


def committed_by(operators: list[str]) -> InMemoryCheckpointStore:
    """A store whose application committed checkpoint 1 with subtasks of ``operators``."""
    store = InMemoryCheckpointStore()
    subtasks = tuple(SubtaskState(o, i, 2, None, None) for o in operators for i in range(2))
    store.commit(CompletedCheckpoint(APP, 1, 0, 128, subtasks,
                                     properties={QUERY_ID: "q1", BATCH_ID: "0"}))
    return store


def test_the_operator_of_an_application_plans_as_before() -> None:
    store = committed_by(["per-user"])
    assert plan_batch(store, APP, "q1", 1, "per-user") == BatchPlan(2, 1, True, "new")
    assert plan_batch(store, APP, "q1", 0, "per-user") == BatchPlan(1, None, False, "rerun")
    assert plan_batch(InMemoryCheckpointStore(), APP, "q1", 0, "per-item") == BatchPlan(
        1, None, True, "first")


def test_a_second_operator_in_one_application_is_refused_naming_both() -> None:
    # Its batch 0 of the same query would look like a re-run of the first operator's
    # commit: never run, never committed.
    store = committed_by(["per-user"])
    for batch in (0, 1):
        with pytest.raises(OperatorMismatchError) as caught:
            plan_batch(store, APP, "q1", batch, "per-item")
        assert str(caught.value) == (
            "application 'shop': checkpoint 1 holds the state of operator(s) ['per-user'], "
            "not of operator 'per-item'; an application keeps one stateful operator's state. "
            "Give operator 'per-item' an application of its own (e.g. "
            "application='shop-per-item'), or set operator_id='per-user' to continue that "
            "operator's state.")
    with pytest.raises(OperatorMismatchError, match="not of operator 'per-item'"):
        plan_batch(store, APP, "q2", 0, "per-item")  # another query: "new-query" otherwise


def test_a_checkpoint_of_several_operators_is_not_continued_by_one_of_them() -> None:
    store = committed_by(["per-item", "per-user"])
    with pytest.raises(OperatorMismatchError, match=(
            r"holds the state of operators \['per-item', 'per-user'\]; .* would drop that of "
            r"\['per-item'\]")):
        plan_batch(store, APP, "q1", 1, "per-user")


def test_key_types_are_recorded_and_must_stay() -> None:
    store = InMemoryCheckpointStore()
    plan = plan_batch(store, APP, "q1", 0, "per-user", ["string", "decimal(10,2)"])
    assert plan == BatchPlan(1, None, True, "first", ("string", "decimal(10,2)"))
    assert plan.properties("q1", 0) == {QUERY_ID: "q1", BATCH_ID: "0",
                                        KEY_TYPES_PROPERTY: '["string", "decimal(10,2)"]'}
    commit(store, plan, "q1", 0)
    assert plan_batch(store, APP, "q1", 1, "per-user", ["string", "decimal(10,2)"]).kind == "new"
    with pytest.raises(KeyTypeError) as caught:
        plan_batch(store, APP, "q2", 0, "per-user", ["bigint"])
    assert str(caught.value) == (
        "application 'shop': the key column(s) are of type(s) ['bigint'], but checkpoint 1 "
        "was written with ['string', 'decimal(10,2)']: keys of another type have other bytes "
        "and would not find their state. Cast the key column(s) to the recorded type(s), or "
        "start a new application.")


def test_checkpoints_without_recorded_key_types_take_any() -> None:
    store = InMemoryCheckpointStore()
    commit(store, plan_batch(store, APP, "q1", 0), "q1", 0)
    assert plan_batch(store, APP, "q1", 1, "per-user", ["int"]) == BatchPlan(
        2, 1, True, "new", ("int",))


@pytest.mark.parametrize(("recorded", "now"), [
    (["int"], ["bigint"]),
    (["tinyint", "string"], ["bigint", "varchar(10)"]),
    (["float"], ["double"]),
    (["decimal(10,2)"], ["decimal(12,2)"]),
    (["binary"], ["string"]),  # a Kafka key, then CAST(key AS STRING): the same bytes
])
def test_key_types_that_encode_keys_alike_may_change(recorded: list[str], now: list[str]
                                                      ) -> None:
    store = InMemoryCheckpointStore()
    commit(store, plan_batch(store, APP, "q1", 0, "per-user", recorded), "q1", 0)
    assert plan_batch(store, APP, "q1", 1, "per-user", now).kind == "new"


@pytest.mark.parametrize(("recorded", "now"), [
    (["decimal(10,2)"], ["decimal(10,3)"]),
    (["date"], ["timestamp"]),
    (["timestamp"], ["timestamp_ntz"]),
    (["string"], ["bigint"]),
    (["string", "int"], ["string"]),
])
def test_key_types_that_encode_keys_otherwise_are_refused(recorded: list[str], now: list[str]
                                                         ) -> None:
    store = InMemoryCheckpointStore()
    commit(store, plan_batch(store, APP, "q1", 0, "per-user", recorded), "q1", 0)
    with pytest.raises(KeyTypeError, match="would not find their state"):
        plan_batch(store, APP, "q1", 1, "per-user", now)
