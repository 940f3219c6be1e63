"""A streaming application whose Avro state evolves across restarts and a rescale; states
added and dropped; an incompatible change refused on the driver before any task runs."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from kafka_changelog.state.errors import StateSchemaError
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64, AvroSerializer
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch

from .file_batches import write_batches

pytestmark = [pytest.mark.broker, pytest.mark.spark]

V1 = {"type": "record", "name": "Profile", "namespace": "shop", "fields": [
    {"name": "last_page", "type": "string"},
    {"name": "visits", "type": "int"},
    {"name": "spent", "type": "float"},
]}
# Reordered, widened (int -> long, float -> double), a field added with a default.
V2 = {"type": "record", "name": "Profile", "namespace": "shop", "fields": [
    {"name": "visits", "type": "long"},
    {"name": "spent", "type": "double"},
    {"name": "last_page", "type": "string"},
    {"name": "channel", "type": "string", "default": "web"},
]}
# A field removed (last_page).
V3 = {"type": "record", "name": "Profile", "namespace": "shop", "fields": [
    {"name": "visits", "type": "long"},
    {"name": "spent", "type": "double"},
    {"name": "channel", "type": "string", "default": "web"},
]}
OUTPUT = "user string, visits long, spent double, channel string, seen long"
USERS = [f"u{i}" for i in range(12)]


def profile(schema: dict[str, Any]) -> Any:
    return value_state("profile", AvroSerializer(schema))


SEEN = value_state("seen", INT64)        # added in the second run
LEGACY = value_state("legacy", INT64)    # dropped in the second run


def update_v1(user: str, rows: Any, state: Any) -> list[dict[str, Any]]:
    found = state(profile(V1)).value() or {"last_page": "", "visits": 0, "spent": 0.0}
    for row in rows.itertuples():
        found = {"last_page": row.page, "visits": found["visits"] + 1,
                 "spent": found["spent"] + row.price}
    state(profile(V1)).update(found)
    legacy = state(LEGACY)
    legacy.update((legacy.value() or 0) + len(rows))
    return [{"user": user, "visits": found["visits"], "spent": found["spent"],
             "channel": None, "seen": None}]


def updater(schema: dict[str, Any]) -> Any:
    def update(user: str, rows: Any, state: Any) -> list[dict[str, Any]]:
        found = state(profile(schema)).value()
        assert found is not None, f"user {user}: no profile"
        for row in rows.itertuples():
            found = {**found, "visits": found["visits"] + 1,
                     "spent": found["spent"] + row.price, "channel": row.channel}
            if "last_page" in found:
                found["last_page"] = row.page
        state(profile(schema)).update(found)
        seen = state(SEEN)
        seen.update((seen.value() or 0) + len(rows))
        return [{"user": user, "visits": found["visits"], "spent": found["spent"],
                 "channel": found["channel"], "seen": seen.value()}]
    return update


def run(spark: Any, config: StreamingStateConfig, fn: Any, input_dir: Path,
        location: Path, states: list[Any], dropped: tuple[str, ...] = ()
        ) -> tuple[dict[str, tuple[Any, ...]], Any]:
    """Run ``fn`` over every file of ``input_dir``; the last output per user, the processor."""
    outputs: dict[str, tuple[Any, ...]] = {}

    def sink(frame: Any, _batch_id: int) -> None:
        for row in frame.collect():
            outputs[row.user] = (row.visits, row.spent, row.channel, row.seen)

    processor = stateful_foreach_batch(config, fn, "user", OUTPUT, sink=sink,
                                       states=states, dropped_states=dropped)
    query = (spark.readStream.schema("user string, page string, price double, channel string")
             .option("maxFilesPerTrigger", 1).json(str(input_dir))
             .writeStream.foreachBatch(processor)
             .option("checkpointLocation", str(location))
             .trigger(availableNow=True).start())
    error: Any = None
    try:
        query.awaitTermination(300)
        error = query.exception()
    except Exception as e:  # the query failed: its error, raised by awaitTermination
        error = e
    finally:
        query.stop()
        processor.close()
    if error is not None:
        raise AssertionError(str(error))
    return outputs, processor


def test_avro_state_evolves_across_restarts_and_a_rescale(
        spark: Any, kafka_cluster: Any, tmp_path: Path) -> None:
    prefix = f"evolve-{uuid.uuid4().hex[:8]}"

    def config(parallelism: int) -> StreamingStateConfig:
        return StreamingStateConfig(
            application=prefix, operator_id="profiles",
            bootstrap_servers=kafka_cluster.bootstrap_servers, parallelism=parallelism,
            changelog_topic=f"{prefix}-changelog", snapshot_topic=f"{prefix}-snapshots",
            checkpoint_topic=f"{prefix}-checkpoints", partitions=4,
            materialization_interval_s=None)

    location = tmp_path / "checkpoint"
    rows = [{"user": u, "page": f"p{i}", "price": 1.5, "channel": "app"}
            for i in range(2) for u in USERS]
    # Run 1 (2 subtasks): V1 for every user, and a state dropped later.
    write_batches(tmp_path / "in1", [rows[:12], rows[12:]])
    first, _ = run(spark, config(2), update_v1, tmp_path / "in1", location, [profile(V1)])
    assert first == {u: (2, 3.0, None, None) for u in USERS}

    # Run 2 (restart, rescaled to 3): V2 declared, "seen" added, "legacy" dropped; its
    # one batch holds a third of the users, yet every subtask records V2.
    write_batches(tmp_path / "in1", [rows[:12], rows[12:], rows[:4]])
    second, processor = run(spark, config(3), updater(V2), tmp_path / "in1", location,
                            [profile(V2), SEEN], dropped=("legacy",))
    assert second == {u: (3, 4.5, "app", 1) for u in USERS[:4]}
    assert [r.restored_from is not None for r in processor.reports] == [True]
    recorded = json.loads(_latest(kafka_cluster, prefix).properties["state.profile"])
    assert [f["name"] for s in json.loads(recorded["value_serializer"][5:])
            for f in s["fields"]][:3] == ["last_page", "visits", "spent"]

    # Run 3 (restart, back to 2): V3 reads V1 values (users 4..11) and V2 values.
    write_batches(tmp_path / "in1", [rows[:12], rows[12:], rows[:4], rows[:12]])
    third, _ = run(spark, config(2), updater(V3), tmp_path / "in1", location,
                   [profile(V3), SEEN])
    assert third == {**{u: (4, 6.0, "app", 2) for u in USERS[:4]},
                     **{u: (3, 4.5, "app", 1) for u in USERS[4:]}}

    # The state as the reader sees it: "legacy" is gone, "seen" is there, profiles decode
    # with the latest schema.
    state = (spark.read.format("kafka-changelog")
             .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
             .option("application", prefix).option("mode", "state")
             .option("checkpoint.topic", f"{prefix}-checkpoints").load())
    found = {(r.state, r.key_decoded): r.value_decoded for r in state.collect()}
    assert {name for name, _ in found} == {"profile", "seen"}
    assert json.loads(found[("profile", "u0")]) == {"visits": 4, "spent": 6.0,
                                                      "channel": "app"}
    assert json.loads(found[("profile", "u9")]) == {"visits": 3, "spent": 4.5,
                                                      "channel": "app"}

    # An incompatible declaration is refused on the driver: no task runs, nothing commits.
    before = _latest(kafka_cluster, prefix).checkpoint_id
    narrowed = {"type": "record", "name": "Profile", "namespace": "shop", "fields": [
        {"name": "visits", "type": "int"}, {"name": "spent", "type": "double"}]}
    write_batches(tmp_path / "in1", [rows[:12], rows[12:], rows[:4], rows[:12], rows[:1]])
    with pytest.raises(AssertionError) as caught:
        run(spark, config(2), updater(narrowed), tmp_path / "in1", location,
            [profile(narrowed)])
    assert (f"StateSchemaError: application {prefix!r}, operator 'profiles': state "
            "'profile': the declared Avro schema cannot read values its earlier schemas "
            "wrote (from schema 2 of 3: visits: long cannot be read as int; from schema 3 "
            "of 3: visits: long cannot be read as int)") in str(caught.value)
    assert _latest(kafka_cluster, prefix).checkpoint_id == before
    assert issubclass(StateSchemaError, ValueError)


def _latest(kafka_cluster: Any, prefix: str) -> Any:
    from kafka_changelog.kafka import CheckpointStoreConfig, KafkaCheckpointView

    with KafkaCheckpointView(CheckpointStoreConfig(
            bootstrap_servers=kafka_cluster.bootstrap_servers,
            topic=f"{prefix}-checkpoints")) as view:
        latest = view.latest(prefix)
    assert latest is not None
    return latest


def test_declarations_are_checked_when_the_processor_is_built() -> None:
    config = StreamingStateConfig(application="a", operator_id="o",
                                  bootstrap_servers="127.0.0.1:1")
    with pytest.raises(ValueError, match="state 'seen' is both declared and dropped"):
        stateful_foreach_batch(config, updater(V2), "user", OUTPUT, states=[SEEN],
                               dropped_states=["seen"])
    with pytest.raises(ValueError, match="state 'seen' is declared more than once"):
        stateful_foreach_batch(config, updater(V2), "user", OUTPUT, states=[SEEN, SEEN])


def test_states_the_tasks_hold_are_recorded_unless_declared_or_dropped() -> None:
    from kafka_changelog.state.schema.descriptors import list_state
    from kafka_changelog.state.schema.evolution import requested_meta
    from kafka_changelog.state.schema.serializers import UTF8
    from spark_integration.checkpoint_properties import recorded_metas, state_properties
    from spark_integration.streaming.state_declarations import (
        StateDeclarations,
        registered_properties,
    )

    count, pages, old = (value_state("count", INT64), list_state("pages", UTF8),
                         value_state("old", INT64))
    reported = [[json.dumps(requested_meta(d).to_record(), sort_keys=True) for d in subtask]
                for subtask in ([count, old], [pages, count], [])]
    # Nothing declared: every state a subtask holds (the dropped one left out).
    found = registered_properties(reported, {}, StateDeclarations.of([], ["old"]))
    assert recorded_metas(found) == {"count": requested_meta(count),
                                     "pages": requested_meta(pages)}
    # A declared (or recorded) state keeps its declaration: only the others are added.
    declared = state_properties({"count": requested_meta(value_state("count", UTF8))})
    assert registered_properties(reported, declared, None) == state_properties(
        {"old": requested_meta(old), "pages": requested_meta(pages)})
