"""Initial state (``stateful_foreach_batch(..., initial_state=df, on_initial_state=fn)``) in a
real ``local[2]`` session over a real broker.

A visits counter bootstrapped from a table of users' earlier visits: each user's count is
its initial visits plus its events. Per key and vectorised, at parallelism 2 and 3: the
first batch's task of one subtask fails once (after the other subtask's task ran), and the
batch is run again: the initial state is applied exactly once; a restarted processor with
the same ``initial_state`` never applies it again; an application whose state did not
start from it, a DataFrame keyed otherwise and an ``on_initial_state`` that returns rows
are refused, naming why.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kafka_changelog.state import INT64, value_state
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.events import TaskEvent
from spark_integration.streaming.initial_state import INITIAL_STATE_PROPERTY, InitialStateError
from spark_integration.streaming.worker_resources import WorkerResources

from .jobs import restored_backend

pytestmark = [pytest.mark.spark, pytest.mark.broker]

VISITS = value_state("visits", INT64)
OUTPUT_SCHEMA = "user string, visits long"
EVENT_SCHEMA = "user string, page string"
#: Users 0..29 have earlier visits (user 3 in two rows); the events are of users 20..39.
INITIAL = [{"user": f"u{i:02d}", "visits": 10 + i, "page": "home"} for i in range(30)] + [
    {"user": "u03", "visits": 100, "page": "cart"}]
BATCHES = [[{"user": f"u{20 + (i * 7 + b) % 20:02d}", "page": f"p{i}"} for i in range(25)]
           for b in range(3)]


def expected_visits(batches: list[list[dict[str, Any]]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in INITIAL:
        counts[row["user"]] = counts.get(row["user"], 0) + row["visits"]
    for batch in batches:
        for event in batch:
            counts[event["user"]] = counts.get(event["user"], 0) + 1
    return counts


def bootstrap(key: str, rows: pd.DataFrame, state: Any) -> None:
    assert list(rows.columns) == ["user", "visits", "page"]
    assert set(rows["user"]) == {key}
    state(VISITS).update(int(rows["visits"].sum()))


def count(key: str, rows: pd.DataFrame, state: Any) -> dict[str, Any]:
    assert list(rows.columns) == ["user", "page"]  # none of the initial state's columns
    visits = state(VISITS)
    visits.update((visits.value() or 0) + len(rows))
    return {"user": key, "visits": visits.value()}


def bootstrap_all(rows: pd.DataFrame, state: Any) -> None:
    total = rows.groupby(state.key_index)["visits"].sum()
    state.value(VISITS).set(state.keys, [int(v) for v in total.tolist()])


def count_all(rows: pd.DataFrame, state: Any) -> pd.DataFrame:
    visits = state.value(VISITS)
    now = [(v or 0) + n for v, n in zip(visits.get(state.keys), rows.groupby(
        state.key_index).size().tolist(), strict=True)]
    visits.set(state.keys, now)
    return pd.DataFrame({"user": state.keys, "visits": now})


def app_config(cluster: Any, prefix: str, parallelism: int) -> StreamingStateConfig:
    return StreamingStateConfig(
        application=prefix, operator_id="visits", bootstrap_servers=cluster.bootstrap_servers,
        parallelism=parallelism, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=4, materialization_interval_s=None)


def restored_visits(config: StreamingStateConfig) -> dict[str, int]:
    """Every user's visits in the latest checkpoint, restored from Kafka alone."""
    with restored_backend(config) as backend:
        table = backend.table
        found = {}
        for key in sorted({k for kg in table.key_groups() for _, k, _ in table.entries(kg)}):
            backend.set_current_key(key)
            found[key.decode()] = backend.state(VISITS).value()
        return found


def fail_once(marker: Path, batch: int, subtask: int) -> Any:
    """A task listener that fails the task of ``subtask`` in ``batch`` the first time."""
    def listener(event: TaskEvent, batch_id: int, which: int) -> None:
        if (event is TaskEvent.SUBTASK_START and (batch_id, which) == (batch, subtask)
                and not marker.exists()):
            marker.write_text("failed")
            raise RuntimeError(f"injected failure of subtask {which} in batch {batch_id}")
    return listener


def run(spark: Any, config: StreamingStateConfig, vectorized: bool, batches: list[int],
        initial: Any, outputs: dict[int, pd.DataFrame], listener: Any = None) -> Any:
    with stateful_foreach_batch(
            config, count_all if vectorized else count, "user", OUTPUT_SCHEMA,
            vectorized=vectorized, task_listener=listener,
            sink=lambda frame, batch_id: outputs.__setitem__(batch_id, frame.toPandas()),
            initial_state=initial,
            on_initial_state=bootstrap_all if vectorized else bootstrap) as processor:
        for batch_id in batches:
            frame = spark.createDataFrame(pd.DataFrame(BATCHES[batch_id]), EVENT_SCHEMA)
            try:
                processor(frame, batch_id)
            except Exception as exc:
                if listener is None or "injected failure" not in str(exc):
                    raise
                processor(frame, batch_id)  # the batch run again, as Spark restarts it
        return list(processor.reports)


@pytest.mark.parametrize(("vectorized", "parallelism"), [(False, 2), (True, 3)])
def test_the_initial_state_is_applied_once_before_the_first_batch(
        spark: Any, kafka_cluster: Any, tmp_path: Path, vectorized: bool,
        parallelism: int) -> None:
    config = app_config(kafka_cluster, f"init-{uuid.uuid4().hex[:8]}", parallelism)
    initial = spark.createDataFrame(pd.DataFrame(INITIAL), "user string, visits long, "
                                                            "page string")
    outputs: dict[int, pd.DataFrame] = {}
    try:
        reports = run(spark, config, vectorized, [0, 1], initial, outputs,
                      fail_once(tmp_path / "failed", 0, parallelism - 1))
        assert (tmp_path / "failed").exists()
        assert [r.checkpoint_id for r in reports] == [1, 2]
        store = WorkerResources.coordinator(config).checkpoints
        assert store.get(config.application, 1).properties[INITIAL_STATE_PROPERTY] == "1"
        assert restored_visits(config) == expected_visits(BATCHES[:2])
        # A new driver with the same code: the application has state, bootstrapped from the
        # initial state: continued, the initial state not applied again.
        run(spark, config, vectorized, [2], initial, outputs)
        assert restored_visits(config) == expected_visits(BATCHES)
        store = WorkerResources.coordinator(config).checkpoints
        assert store.get(config.application, 3).properties[INITIAL_STATE_PROPERTY] == "1"
        for batch_id in range(3):
            want = expected_visits(BATCHES[:batch_id + 1])
            found = outputs[batch_id].sort_values("user").reset_index(drop=True)
            users = sorted({e["user"] for e in BATCHES[batch_id]})
            assert found.to_dict("list") == {"user": users,
                                              "visits": [want[u] for u in users]}
    finally:
        WorkerResources.release(config)


def test_an_application_with_other_state_and_wrong_initial_states_are_refused(
        spark: Any, kafka_cluster: Any) -> None:
    config = app_config(kafka_cluster, f"init-ref-{uuid.uuid4().hex[:8]}", 2)
    outputs: dict[int, pd.DataFrame] = {}
    try:
        # A DataFrame keyed otherwise, and a bootstrap function that returns rows.
        wrong_key = spark.createDataFrame(pd.DataFrame({"user": [1], "visits": [2]}),
                                          "user long, visits long")
        with pytest.raises(InitialStateError, match=r"not keyed like the query: key "
                                                    r"column\(s\) user \(bigint in "
                                                    r"initial_state, string in the query\)"):
            run(spark, config, False, [0], wrong_key, outputs)
        no_key = spark.createDataFrame(pd.DataFrame({"name": ["a"]}), "name string")
        with pytest.raises(InitialStateError, match=r"has no key column\(s\) \['user'\]"):
            run(spark, config, False, [0], no_key, outputs)
        initial = spark.createDataFrame(pd.DataFrame(INITIAL), "user string, visits long, "
                                                                "page string")
        with pytest.raises(Exception, match="on_initial_state returned dict for key 'u"), \
                stateful_foreach_batch(
                    config, count, "user", OUTPUT_SCHEMA, initial_state=initial,
                    on_initial_state=lambda key, rows, state: {"user": key}) as processor:
            processor(spark.createDataFrame(pd.DataFrame(BATCHES[0]), EVENT_SCHEMA), 0)
        assert WorkerResources.coordinator(config).checkpoint() is None  # nothing committed
        # State from a processor without initial state: bootstrapping it now is refused.
        with stateful_foreach_batch(config, count, "user", OUTPUT_SCHEMA) as processor:
            processor(spark.createDataFrame(pd.DataFrame(BATCHES[0]), EVENT_SCHEMA), 0)
        with pytest.raises(InitialStateError, match=f"application '{config.application}' "
                                                    r"already has state \(checkpoint 1\) "
                                                    "that no initial state bootstrapped"):
            run(spark, config, False, [1], initial, outputs)
        assert restored_visits(config) == {e["user"]: n for e, n in [
            (e, sum(1 for x in BATCHES[0] if x["user"] == e["user"])) for e in BATCHES[0]]}
        with pytest.raises(ValueError, match="initial_state and on_initial_state go together"):
            stateful_foreach_batch(config, count, "user", OUTPUT_SCHEMA, initial_state=initial)
    finally:
        WorkerResources.release(config)


EVENT_COUNT = 900
USERS = 24
PER_BATCH = 300


def test_a_driver_killed_in_the_first_batch_bootstraps_the_state_once(
        kafka_cluster: Any, tmp_path: Path) -> None:
    """The clickstream job (``KafkaOutputSink``, exactly-once outputs) bootstrapped from
    users' earlier totals (a JSON file read by a function of the session); in its first
    batch a task's worker is killed -9 in its transaction, then the driver after the tasks
    committed their outputs and state, before the checkpoint. Run again, every user's state
    is its totals plus its events, and every batch's outputs are in the output topic once."""
    import json
    import signal

    from examples.clickstream import output_problems, produce_events, read_outputs
    from examples.events import events

    from .jobs import Job, state_of

    job = Job(f"init-kill-{uuid.uuid4().hex[:8]}", kafka_cluster.bootstrap_servers,
              tmp_path / "spark-checkpoint", EVENT_COUNT, per_batch=PER_BATCH)
    produce_events(kafka_cluster.client_config(), job.input_topic, EVENT_COUNT, USERS)
    # Users 0..19 have earlier totals; user-0099 has no events at all.
    totals = {f"user-{i:04d}": (i + 1, round(i * 1.25, 2)) for i in range(20)}
    totals["user-0099"] = (5, 9.99)
    initial = tmp_path / "totals.json"
    initial.write_text("".join(json.dumps({"user": u, "events": n, "spent": s}) + "\n"
                               for u, (n, s) in totals.items()))
    # The first batch: one task's Python worker killed in its transaction (Spark runs the
    # task again), then the driver killed before the checkpoint commit.
    faults = tmp_path / "faults"
    faults.mkdir()
    done = job.run(2, "before_commit:0", task_kills=("subtask_in_transaction:0:1",),
                   fault_dir=faults, master="local[2,4]", initial_state=initial)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert (faults / "killed-subtask_in_transaction-0-1").exists()
    done = job.run(2, initial_state=initial)
    assert done.returncode == 0, done.stderr[-3000:]

    expected: dict[str, dict[str, Any]] = {
        user: {"events": n, "spent": spent, "kinds": {}, "last_pages": []}
        for user, (n, spent) in totals.items()}
    for event in events(EVENT_COUNT, USERS):
        state = expected.setdefault(event["user"], {"events": 0, "spent": None, "kinds": {},
                                                    "last_pages": []})
        state["events"] += 1
        state["spent"] = (event["amount"] if state["spent"] is None
                          else round(state["spent"] + event["amount"], 2))
        state["kinds"][event["kind"]] = state["kinds"].get(event["kind"], 0) + 1
        state["last_pages"] = [*state["last_pages"], event["page"]][-5:]
    config = job.config()
    try:
        assert state_of(config, sorted(expected)) == expected
        with_events = {u: s for u, s in expected.items() if u != "user-0099"}
        rows = read_outputs(kafka_cluster.client_config(), job.output_topic)
        assert output_problems(rows, with_events) == []
        checkpoint = WorkerResources.coordinator(config).checkpoint()
        assert checkpoint is not None
        assert checkpoint.properties[INITIAL_STATE_PROPERTY] == "1"
    finally:
        WorkerResources.release(config)
