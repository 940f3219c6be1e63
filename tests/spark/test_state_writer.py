"""The state writer (``df.write.format("kafka-changelog").mode("append")``) in a real
``local[2]`` session over a real broker.

A visits counter runs a few batches and stops; rows then repair its state (set some users'
visits, delete others, add new users); the state read back and restored from Kafka alone
is exactly the repaired one, and the counter resumes on it: every later output counts from
the repaired values, each row applied once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import functions as F

from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.history.state_write import (
    STATE_WRITE_FROM_PROPERTY,
    STATE_WRITE_MODE_PROPERTY,
    STATE_WRITE_ROWS_PROPERTY,
)
from kafka_changelog.state.snapshots.chunk_sweep import ChunkKey
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.worker_resources import WorkerResources
from spark_integration.writer.options import declared_states
from tests.kafka.test_state_kafka import USERS, Job
from tests.state.state_helpers import (
    COUNT,
    EVENTS,
    MAX_P,
    PAGES,
    STATS,
    TOTAL,
    expected_for,
    ranges,
    read_user,
    users_in,
)

from .jobs import REPO
from .test_initial_state import (
    EVENT_SCHEMA,
    OUTPUT_SCHEMA,
    VISITS,
    app_config,
    count,
    restored_visits,
)
from .test_reader import History

pytestmark = [pytest.mark.spark, pytest.mark.broker]

#: Four batches of events of users u00..u09.
BATCHES = [[{"user": f"u{(i * 3 + b) % 10:02d}", "page": f"p{i}"} for i in range(20)]
           for b in range(4)]


def visits_of(batches: list[list[dict[str, Any]]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for batch in batches:
        for event in batch:
            counts[event["user"]] = counts.get(event["user"], 0) + 1
    return counts


def run(spark: Any, config: StreamingStateConfig, batches: list[int],
        outputs: dict[int, pd.DataFrame]) -> None:
    with stateful_foreach_batch(
            config, count, "user", OUTPUT_SCHEMA, states=[VISITS],
            sink=lambda frame, batch_id: outputs.__setitem__(batch_id, frame.toPandas())
    ) as processor:
        for batch_id in batches:
            processor(spark.createDataFrame(pd.DataFrame(BATCHES[batch_id]), EVENT_SCHEMA),
                      batch_id)


def resumes_on(spark: Any, config: StreamingStateConfig, state: dict[str, int], batch: int,
               outputs: dict[int, pd.DataFrame]) -> None:
    """The counter runs ``batch`` on ``state``: its state and outputs count from it."""
    run(spark, config, [batch], outputs)
    want = dict(state)
    for event in BATCHES[batch]:
        want[event["user"]] = want.get(event["user"], 0) + 1
    assert restored_visits(config) == want
    users = sorted({e["user"] for e in BATCHES[batch]})
    found = outputs[batch].sort_values("user").reset_index(drop=True)
    assert found.to_dict("list") == {"user": users, "visits": [want[u] for u in users]}


def writer_options(config: StreamingStateConfig) -> dict[str, str]:
    return config.writer_options()


def unnamed_chunks(config: StreamingStateConfig) -> int:
    """Live snapshot chunks of the application's topic whose backend no checkpoint names."""
    coordinator = WorkerResources.coordinator(config)
    named = {s.keyed.backend_id for c in coordinator.checkpoints.all_checkpoints()
             for s in c.subtasks if s.keyed is not None}
    return sum(1 for key in coordinator.snapshots.live_keys()
               if (parts := ChunkKey.parse(key.key)) is not None
               and parts.backend_id not in named)


def int64(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


def test_rows_repair_the_state_and_the_query_resumes_on_it(
        spark: Any, kafka_cluster: Any, tmp_path: Path) -> None:
    config = app_config(kafka_cluster, f"write-{uuid.uuid4().hex[:8]}", 2)
    outputs: dict[int, pd.DataFrame] = {}
    try:
        run(spark, config, [0, 1], outputs)
        before = visits_of(BATCHES[:2])
        assert restored_visits(config) == before
        # Set u01 (bytes) and u02 (decoded text), delete u03, add u42; over three tasks.
        rows = spark.createDataFrame(pd.DataFrame({
            "state": ["visits"] * 4, "key": [b"u01", b"u02", b"u03", b"u42"],
            "value": [int64(1000), None, None, int64(7)],
            "value_decoded": [None, "2000", None, None]}),
            "state string, key binary, value binary, value_decoded string").repartition(3)
        rows.write.format("kafka-changelog").options(**writer_options(config)).mode(
            "append").save()
        repaired = {**before, "u01": 1000, "u02": 2000, "u42": 7}
        del repaired["u03"]
        assert restored_visits(config) == repaired
        store = WorkerResources.coordinator(config).checkpoints
        latest = store.latest(config.application)
        assert latest is not None and latest.checkpoint_id == 4  # 2 + 2
        assert latest.properties[STATE_WRITE_FROM_PROPERTY] == "2"
        assert latest.properties[STATE_WRITE_ROWS_PROPERTY] == "4"
        read = (spark.read.format("kafka-changelog").options(**config.reader_options())
                .option("mode", "state").load().toPandas())
        assert {r.key.decode(): int(r.value_decoded) for r in read.itertuples()} == repaired
        # The counter resumes on the repaired state (its Python workers kept stores of
        # checkpoint 2: they must not stand for checkpoint 4).
        resumes_on(spark, config, repaired, 2, outputs)
        # The whole state replaced by 1,000 members' visits spread over four tasks (a key
        # group's rows in several: each task writes its own layer of it), at parallelism 3;
        # the counter (at 2) resumes on them alone.
        members = {f"m{i:04d}": i * 3 for i in range(1000)}
        spark.createDataFrame([("visits", k.encode(), int64(v)) for k, v in members.items()],
                              "state string, key binary, value binary").repartition(4).write.format(
            "kafka-changelog").options(**writer_options(config)).option(
            "parallelism", "3").mode("overwrite").save()
        latest = WorkerResources.coordinator(config).checkpoints.latest(config.application)
        assert latest is not None and len(latest.subtasks) == 3
        snapshots = [s.keyed.snapshot for s in latest.subtasks
                     if s.keyed is not None and s.keyed.snapshot is not None]
        assert len(snapshots) == 3 and all(s.keyed.changelog == () for s in latest.subtasks
                                           if s.keyed is not None)
        assert max(len(snapshot.layers_of(kg)) for snapshot in snapshots
                   for kg in snapshot.key_groups) == 4
        assert restored_visits(config) == members
        resumes_on(spark, config, members, 3, outputs)
    finally:
        WorkerResources.release(config)


def assert_restored(job: Job, coordinator: CheckpointCoordinator, checkpoint: Any,
                    parallelism: int, model: dict[bytes, Any]) -> None:
    """Every subtask of ``checkpoint`` restored at ``parallelism`` holds ``model``'s users."""
    for key_groups in ranges(parallelism):
        backend = coordinator.restore_keyed("op", key_groups, checkpoint, job.changelog)
        try:
            mine = users_in(USERS, key_groups)
            assert {u: read_user(backend, u) for u in mine} == expected_for(model, mine)
        finally:
            backend.close()


def test_state_read_and_written_back_restores_the_same_at_any_parallelism(
        spark: Any, kafka_cluster: Any, tmp_path: Path) -> None:
    # Every kind of state (value, list, map, reducing, aggregating), a snapshot and a
    # changelog tail; read in mode 'state' and written back unchanged, replacing the whole
    # state (nothing of the old one carried: a write that lost rows would show).
    job = Job(kafka_cluster)
    model: dict[bytes, Any] = {}
    try:
        job.run(2, 1, model, 60, True, seed=1)
        job.run(2, 2, model, 60, False, seed=2)
        options = History(job, {}).options()
        state = spark.read.format("kafka-changelog").options(**options).option(
            "mode", "state").load()
        kinds = {r.kind for r in state.select("kind").distinct().collect()}
        assert kinds == {"VALUE", "LIST", "MAP", "REDUCING", "AGGREGATING"}
        state.write.format("kafka-changelog").options(**options).option(
            "states", declared_states([COUNT, EVENTS, PAGES, TOTAL, STATS])).mode(
            "overwrite").save()
        latest = job.checkpoints.latest("app")
        assert latest is not None and latest.checkpoint_id == 4
        assert latest.properties[STATE_WRITE_MODE_PROPERTY] == "replace"
        # A new materialization: snapshots of new backends, no changelog.
        for subtask in latest.subtasks:
            keyed = subtask.keyed
            assert keyed is not None and keyed.snapshot is not None and keyed.changelog == ()
            assert keyed.snapshot.backend_id == keyed.backend_id
        for backend_config in (StateBackendConfig("memory"),
                               StateBackendConfig("rocksdb", str(tmp_path / "rocksdb"))):
            coordinator = CheckpointCoordinator("app", job.checkpoints, job.snapshots,
                                                job.storage, MAX_P, state_backend=backend_config)
            for parallelism in (2, 3):  # as written, and rescaled
                assert_restored(job, coordinator, latest, parallelism, model)
        # Transformed with DataFrame operations on value_decoded (each kind's values
        # encoded again with its serializer), written, and restored rescaled.
        shifted = F.col("value_decoded").cast("bigint") + F.when(
            F.col("state") == "pages", 1).otherwise(1000)
        transformed = state.withColumn("value_decoded", F.when(
            F.col("state").isin("count", "total", "pages"), shifted.cast("string")).when(
            F.col("state") == "events", F.upper("value_decoded")).otherwise(
            F.col("value_decoded"))).withColumn("value", F.when(
                F.col("state") == "stats", F.col("value")).otherwise(
                F.lit(None).cast("binary")))
        transformed.write.format("kafka-changelog").options(**options).mode("append").save()
        latest = job.checkpoints.latest("app")
        assert latest is not None and latest.checkpoint_id == 6
        want = {user: {"count": None if s["count"] is None else s["count"] + 1000,
                       "events": [e.upper() for e in s["events"]],
                       "pages": {p: n + 1 for p, n in s["pages"].items()},
                       "total": None if s["total"] is None else s["total"] + 1000,
                       "stats": s["stats"]} for user, s in model.items()}
        coordinator = CheckpointCoordinator("app", job.checkpoints, job.snapshots, job.storage,
                                            MAX_P)
        assert_restored(job, coordinator, latest, 3, want)
        # Replaced by a part of it: the counts of users with an even count, nothing else
        # (``state`` reads the latest checkpoint, the transformed one, when the write runs).
        part = state.where("state = 'count' AND cast(value_decoded AS BIGINT) % 2 = 0")
        part.write.format("kafka-changelog").options(**options).mode("overwrite").save()
        latest = job.checkpoints.latest("app")
        assert latest is not None and latest.checkpoint_id == 8
        left = {user: {"count": s["count"], "events": [], "pages": {}, "total": None,
                       "stats": None}
                for user, s in want.items() if s["count"] is not None and s["count"] % 2 == 0}
        assert left and len(left) < len(want)
        assert_restored(job, coordinator, latest, 2, left)
    finally:
        job.close()


def test_bad_writes_are_refused_naming_why_and_leave_the_application_as_it_was(
        spark: Any, kafka_cluster: Any) -> None:
    config = app_config(kafka_cluster, f"write-ref-{uuid.uuid4().hex[:8]}", 2)
    outputs: dict[int, pd.DataFrame] = {}
    schema = "state string, key binary, value binary"
    try:
        run(spark, config, [0], outputs)
        before = visits_of(BATCHES[:1])

        def write(frame: Any, mode: str = "append", **extra: str) -> None:
            frame.write.format("kafka-changelog").options(**writer_options(config),
                                                          **extra).mode(mode).save()

        def refused(frame: Any, message: str, mode: str = "append", **extra: str) -> None:
            with pytest.raises(Exception) as caught:
                write(frame, mode, **extra)
            assert message in str(caught.value), str(caught.value)[-3000:]
            latest = WorkerResources.coordinator(config).checkpoints.latest(config.application)
            assert latest is not None and latest.checkpoint_id == 1, "something was committed"

        good = spark.createDataFrame([("visits", b"u01", int64(5))], schema)
        refused(spark.createDataFrame([("visits", b"u01", None)], schema),
                "state 'visits' key b'u01': a row without value deletes an entry, and a "
                "write replacing the whole state has nothing to delete", mode="overwrite")
        refused(good, "select what a read of format('kafka-changelog') reads", checkpoint="1")
        refused(good, "runs at parallelism 2 (checkpoint 1): a write applying rows keeps it",
                parallelism="3")
        refused(good, "parallelism must be in [1, max parallelism 128], got 200",
                mode="overwrite", parallelism="200")
        refused(good, "option parallelism must be at least 1, got 0", mode="overwrite",
                parallelism="0")
        refused(spark.createDataFrame([("visits", b"u01", int64(5), 1)], f"{schema}, n int"),
                "a state write does not know the column(s) ['n']")
        refused(spark.createDataFrame([("visits", "u01", int64(5))],
                                      "state string, key string, value binary"),
                "column 'key' must be of type binary, got string")
        refused(spark.createDataFrame([("clicks", b"u01", int64(5))], schema),
                "state 'clicks' is not a registered state of the application (known: "
                "['visits'])")
        refused(spark.createDataFrame([("visits", b"u01", None)],
                                      "state string, key binary, value binary").selectExpr(
            "state", "key", "value", "'x' AS value_decoded"),
                "state 'visits' key b'u01': value_decoded 'x' is not a int64 value")
        # The same key from two tasks; then one task's bad row after the others wrote.
        twice = spark.createDataFrame(spark.sparkContext.parallelize(
            [("visits", b"u01", int64(5))] * 2, 2), schema)
        assert twice.rdd.getNumPartitions() == 2
        refused(twice, "1 entry has more than one row (state 'visits': in Spark task(s) "
                       "[0, 1])")
        refused(spark.createDataFrame([("visits", b"u01", int64(5))] * 2, schema).coalesce(1),
                "1 entry has more than one row (state 'visits': in Spark task(s) [0])")
        mixed = spark.createDataFrame(
            [("visits", f"u{i:02d}".encode(), int64(i)) for i in range(40)]
            + [("nope", b"u99", int64(1))], schema).repartition(4)
        refused(mixed, "state 'nope' is not a registered state")
        # A live driver holds the application: refused while it runs, not after.
        with stateful_foreach_batch(config, count, "user", OUTPUT_SCHEMA) as processor:
            processor(spark.createDataFrame(pd.DataFrame(BATCHES[1]), EVENT_SCHEMA), 1)
            latest = WorkerResources.coordinator(config).checkpoints.latest(config.application)
            assert latest is not None and latest.checkpoint_id == 2
            with pytest.raises(Exception, match=f"cannot write the state of application "
                                                f"'{config.application}': .* holds it"):
                write(good)
        assert restored_visits(config) == visits_of(BATCHES[:2])
        write(good)
        assert restored_visits(config) == {**visits_of(BATCHES[:2]), "u01": 5}
        assert before != visits_of(BATCHES[:2])
    finally:
        WorkerResources.release(config)


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_killed_write_leaves_nothing_visible(spark: Any, kafka_cluster: Any,
                                               tmp_path: Path, mode: str) -> None:
    config = app_config(kafka_cluster, f"write-kill-{uuid.uuid4().hex[:8]}", 2)
    outputs: dict[int, pd.DataFrame] = {}
    marker = tmp_path / "stalled"
    try:
        run(spark, config, [0], outputs)
        before = visits_of(BATCHES[:1])
        # A driver of its own, killed -9 with its workers while its second task writes
        # (the first task's log is persisted by then, or its snapshot layers written).
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.killed_state_write",
             json.dumps(writer_options(config)), str(marker), mode],
            cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 300
            while not marker.exists():
                assert writer.poll() is None, writer.communicate()[1][-3000:]
                assert time.monotonic() < deadline, "the write never reached its second task"
                time.sleep(0.2)
        finally:
            os.killpg(writer.pid, signal.SIGKILL)
            writer.wait(60)
        store = WorkerResources.coordinator(config).checkpoints
        latest = store.latest(config.application)
        assert latest is not None and latest.checkpoint_id == 1
        assert restored_visits(config) == before
        if mode == "overwrite":
            # The first task's layers are chunks of backends no checkpoint names: the
            # sweep removes them once older than its grace (here: at once).
            left = unnamed_chunks(config)
            assert left > 0
            coordinator = CheckpointCoordinator(
                config.application, store, WorkerResources.coordinator(config).snapshots,
                WorkerResources.coordinator(config).storage, MAX_P, sweep_grace_s=0.0)
            assert coordinator.sweep_chunks().swept == left
            assert unnamed_chunks(config) == 0
        # The next write and the query go on from checkpoint 1: none of the killed write's
        # rows appear, the new ones do.
        spark.createDataFrame([("visits", b"u01", int64(5))],
                              "state string, key binary, value binary").write.format(
            "kafka-changelog").options(**writer_options(config)).mode("append").save()
        assert restored_visits(config) == {**before, "u01": 5}
        resumes_on(spark, config, {**before, "u01": 5}, 1, outputs)
    finally:
        WorkerResources.release(config)
