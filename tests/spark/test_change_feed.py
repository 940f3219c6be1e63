"""The change feed (``readStream.format("kafka-changelog")``), changes between checkpoints and
key pushdown, against a real broker and a real ``local[2]`` Spark.

One application (operator ``op``) keeps a count and the pages of each user, with backends
kept open across checkpoints (so each checkpoint's changelog handle is cumulative since
the materialization), checkpoints 1 and 2 at parallelism 2; then a materialization at the
checkpoint boundary; checkpoint 3 (its changelog starts after the new base), a rescale to
parallelism 3 and checkpoint 4. The feed runs over 1..2, is stopped, and is started again
on the same checkpointLocation over 3..4.

``Trigger.AvailableNow`` runs on an application of their own: a run whose sink fails, then
the run started again on the same checkpointLocation, which re-runs the failed batch and
goes on to every checkpoint committed before it started (and not to one committed during
it).
"""

from __future__ import annotations

import itertools
import random
import struct
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException

from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.keygroups import key_group_for_key
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.schema.descriptors import map_state, value_state
from kafka_changelog.state.schema.serializers import INT64, UTF8
from spark_integration.reader.datasource import FEED_STRUCT, KafkaChangelogBatchReader
from spark_integration.reader.feed_planning import (
    FeedPlanner,
    parse_feed_options,
    require_whole_changelog,
)
from spark_integration.reader.feed_reading import read_feed_task
from spark_integration.reader.feed_schema import FEED_SCHEMA
from spark_integration.reader.feed_source import ChangesBetweenReader
from spark_integration.reader.planning import CheckpointSelectionError, parse_options, plan_read
from spark_integration.reader.task_reading import read_task
from spark_integration.sessions.spark_versions import SparkFeature, supports
from tests.state.state_helpers import MAX_P, ranges, users_in

pytestmark = [pytest.mark.spark, pytest.mark.broker]

FORMAT = "kafka-changelog"
COUNT = value_state("count", INT64)
PAGES = map_state("pages", UTF8, INT64)
USERS = [f"user-{i}".encode() for i in range(24)]
#: The identity of a change: its log, change set and place in the set.
ID = ("log_id", "sequence_number", "position")


class FeedApp:
    """An application on topics of its own, its backends open across checkpoints."""

    def __init__(self, cluster: Any) -> None:
        settings = dict(cluster.client_config())
        servers = settings.pop("bootstrap.servers")
        run = uuid.uuid4().hex[:8]
        self.changelog = KafkaChangelogConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"feed-log-{run}",
            partitions=2)
        self.storage = KafkaChangelogStorage(self.changelog)
        self.snapshots = KafkaSnapshotStore(SnapshotStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=f"feed-snap-{run}",
            partitions=2))
        self.checkpoint_topic = f"feed-cp-{run}"
        self.checkpoints = KafkaCheckpointStore(CheckpointStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=self.checkpoint_topic,
            retain=10))
        self.coordinator = CheckpointCoordinator(
            "feed-app", self.checkpoints, self.snapshots, self.storage, MAX_P)
        self.backends: list[ChangelogKeyedStateBackend] = []
        self.rng = random.Random(7)
        self.next_id = 1
        #: count of each user after each checkpoint
        self.counts: dict[int, dict[bytes, int]] = {}
        self.model: dict[bytes, int] = {}

    def options(self, **extra: str) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.changelog.bootstrap_servers,
                **{f"kafka.{k}": str(v) for k, v in self.changelog.client_config.items()},
                "application": "feed-app", "checkpoint.topic": self.checkpoint_topic,
                **extra}

    def open(self, parallelism: int) -> None:
        for backend in self.backends:
            backend.close()
        latest = self.coordinator.checkpoint()
        self.backends = [self.coordinator.restore_keyed("op", r, latest, self.changelog)
                         for r in ranges(parallelism)]

    def checkpoint(self, events: int) -> int:
        p = len(self.backends)
        for backend, key_groups in zip(self.backends, ranges(p), strict=True):
            mine = users_in(USERS, key_groups)
            for _ in range(events):
                user = self.rng.choice(mine)
                backend.set_current_key(user)
                count = backend.state(COUNT)
                count.update((count.value() or 0) + 1)
                pages = backend.state(PAGES)
                page = self.rng.choice(["a", "b"])
                pages.put(page, (pages.get(page) or 0) + 1)
                self.model[user] = self.model.get(user, 0) + 1
        checkpoint_id = self.next_id
        handles = [b.snapshot(checkpoint_id).result(60) for b in self.backends]
        self.coordinator.complete(checkpoint_id, [
            SubtaskState("op", i, p, h, None) for i, h in enumerate(handles)])
        for backend in self.backends:
            backend.notify_checkpoint_complete(checkpoint_id)
        self.counts[checkpoint_id] = dict(self.model)
        self.next_id += 1
        return checkpoint_id

    def materialize(self) -> None:
        for backend in self.backends:
            backend.materialize_now()

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
        self.storage.close()
        self.snapshots.close()
        self.checkpoints.close()


@pytest.fixture(scope="module")
def app(kafka_cluster: Any) -> Iterator[FeedApp]:
    application = FeedApp(kafka_cluster)
    try:
        application.open(2)
        application.checkpoint(30)
        application.checkpoint(30)
        yield application
    finally:
        application.close()


def _plain(value: Any) -> Any:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def rows_of(df: Any) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.asDict().items()} for row in df.collect()]


def checkpoint_changes(app: FeedApp, checkpoint_id: int) -> list[dict[str, Any]]:
    """Every change of one checkpoint's handles, by the (tested) mode ``changes``, read in
    process (the same tasks Spark runs)."""
    options = parse_options(app.options(checkpoint=str(checkpoint_id)))
    return [row for task in plan_read(options).tasks for batch in read_task(task, options)
            for row in batch.to_pylist()]


def feed_in_process(app: FeedApp, start: int, end: int) -> list[dict[str, Any]]:
    """The feed's rows of ``(start, end]``, planned and read in process."""
    planner = FeedPlanner(parse_feed_options(app.options(startingCheckpoint=str(start)),
                                             streaming=False))
    return [row for task in planner.plan(start, end)
            for batch in read_feed_task(task, planner.options.reader)
            for row in batch.to_pylist()]


def expected_feed(app: FeedApp, first: int, last: int) -> list[dict[str, Any]]:
    """The changes checkpoints first..last committed, by definition: each checkpoint's
    changes minus those of the one before (none before checkpoint 1), stamped."""
    expected = []
    before: set[tuple[Any, ...]] = set()
    if first > 1:
        before = {tuple(r[c] for c in ID) for r in checkpoint_changes(app, first - 1)}
    stored = {i: app.checkpoints.get("feed-app", i) for i in range(first, last + 1)}
    for checkpoint_id in range(first, last + 1):
        rows = checkpoint_changes(app, checkpoint_id)
        for r in rows:
            if tuple(r[c] for c in ID) not in before:
                expected.append({**r, "checkpoint_id": checkpoint_id, "batch_id": None,
                                 "commit_ms": stored[checkpoint_id].timestamp_ms})
        before = {tuple(r[c] for c in ID) for r in rows}
    return expected


def comparable(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = []
    for r in rows:
        r = dict(r)
        if "commit_time" in r:
            r["commit_ms"] = int(r.pop("commit_time").timestamp() * 1000)
        out.append(tuple(sorted((k, repr(v)) for k, v in r.items())))
    return sorted(out)


def check_counts_in_order(rows: list[dict[str, Any]], app: FeedApp, first: int, last: int
                          ) -> None:
    """Per key, the count's values come strictly increasing (no change twice, in order),
    and each checkpoint's last one is the count the application had at that checkpoint."""
    seen: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        if r["state"] == "count" and r["op"] == "SET":
            seen[r["key"]].append((r["checkpoint_id"], struct.unpack(">q", r["value"])[0]))
    for key, values in seen.items():
        assert all(a[1] < b[1] for a, b in itertools.pairwise(values)), (key, values)
        assert [c for c, _ in values] == sorted(c for c, _ in values), (key, values)
    for checkpoint_id in range(first, last + 1):
        last_values = {k: [v for c, v in vs if c == checkpoint_id][-1]
                       for k, vs in seen.items() if any(c == checkpoint_id for c, _ in vs)}
        before = app.counts.get(checkpoint_id - 1, {})
        changed = {u: n for u, n in app.counts[checkpoint_id].items() if before.get(u) != n}
        assert last_values == changed, (checkpoint_id, Counter(
            (r["checkpoint_id"], r["state"], r["op"]) for r in rows))


def test_the_feed_emits_each_committed_change_once_in_order_across_a_restart(
        spark: Any, app: FeedApp, tmp_path: Path) -> None:

    batches: list[tuple[int, list[dict[str, Any]]]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append((batch_id, rows_of(df)))

    def run_feed() -> None:
        stream = spark.readStream.format(FORMAT).options(
            **app.options(startingCheckpoint="earliest")).load()
        assert stream.schema == FEED_STRUCT
        query = (stream.writeStream.foreachBatch(collect)
                 .option("checkpointLocation", str(tmp_path / "feed")).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    run_feed()  # checkpoints 1 and 2
    app.materialize()  # at the checkpoint boundary, as the streaming layer does
    app.checkpoint(30)
    third = app.checkpoints.get("feed-app", 3)
    assert all(s.keyed is not None and s.keyed.snapshot is not None for s in third.subtasks)
    app.open(3)
    app.checkpoint(30)
    run_feed()  # the same checkpointLocation: 3 and 4 only

    assert [b for b, _ in batches] == list(range(len(batches)))  # no batch replayed
    emitted = [r for _, rows in batches for r in rows]
    ids = [tuple(r[c] for c in ID) for r in emitted]
    assert len(ids) == len(set(ids))
    assert comparable(emitted) == comparable(expected_feed(app, 1, 4))
    assert {r["checkpoint_id"] for r in emitted} == {1, 2, 3, 4}
    check_counts_in_order(emitted, app, 1, 4)

    # The batch reader: (1, 4] is the concatenation of (1, 2], (2, 3] and (3, 4].
    whole = rows_of(spark.read.format(FORMAT).options(**app.options(
        startingCheckpoint="1", endingCheckpoint="4")).load())

    parts = (feed_in_process(app, 1, 2) + feed_in_process(app, 2, 3)
             + feed_in_process(app, 3, 4))
    assert comparable(whole) == comparable(parts)
    assert comparable(whole) == comparable([r for r in emitted if r["checkpoint_id"] > 1])
    check_counts_in_order(whole, app, 2, 4)
    assert whole == [r for r in emitted if r["checkpoint_id"] > 1]  # the same order

    # startingCheckpoint=earliest needs a first checkpoint whose changelog holds everything.
    require_whole_changelog(app.checkpoints.get("feed-app", 1))
    with pytest.raises(CheckpointSelectionError) as refused:
        require_whole_changelog(third)
    materialization = third.subtasks[0].keyed.materialization_id  # type: ignore[union-attr]
    assert str(refused.value) == (
        "checkpoint 3 of application 'feed-app', the earliest retained, restores operator "
        f"'op' subtask 0 from a snapshot (materialization {materialization}): its changelog "
        "does not hold every change before it, so startingCheckpoint=earliest cannot start "
        "before it; use startingCheckpoint=3 to read the changes committed after it")


class SinkFailure(RuntimeError):
    """What the test's sink raises on the batch it fails."""


def test_available_now_restarted_after_a_failed_batch_emits_what_was_committed_before_it(
        spark: Any, kafka_cluster: Any, tmp_path: Path) -> None:
    feed_app = FeedApp(kafka_cluster)
    try:
        feed_app.open(2)
        for _ in range(3):
            feed_app.checkpoint(20)
        #: (run, batch id, rows) of each batch the sink took (returned from)
        delivered: list[tuple[int, int, list[dict[str, Any]]]] = []
        #: (run, batch id, rows) of each batch the sink failed
        failed: list[tuple[int, int, list[dict[str, Any]]]] = []

        def run(number: int, fail_on: int | None = None,
                commit_during: int | None = None) -> None:
            """An availableNow run on the same checkpointLocation; the sink raises on
            batch ``fail_on`` and commits a checkpoint while it takes ``commit_during``."""

            def sink(df: Any, batch_id: int) -> None:
                rows = rows_of(df)
                if batch_id == fail_on:
                    failed.append((number, batch_id, rows))
                    raise SinkFailure(f"the sink fails batch {batch_id}")
                if batch_id == commit_during:
                    feed_app.checkpoint(20)
                delivered.append((number, batch_id, rows))

            stream = spark.readStream.format(FORMAT).options(
                **feed_app.options(startingCheckpoint="earliest")).load()
            query = (stream.writeStream.foreachBatch(sink)
                     .option("checkpointLocation", str(tmp_path / "feed"))
                     .trigger(availableNow=True).start())
            try:
                if fail_on is None:
                    assert query.awaitTermination(180), "the availableNow run did not end"
                    assert query.exception() is None
                else:
                    with pytest.raises(StreamingQueryException, match="the sink fails"):
                        query.awaitTermination(180)
                assert not query.isActive
            finally:
                query.stop()

        def checkpoints_of(number: int) -> list[set[int]]:
            return [{r["checkpoint_id"] for r in rows}
                    for run_, _, rows in delivered if run_ == number]

        run(1)  # checkpoints 1..3, batch 0
        assert [(r, b) for r, b, _ in delivered] == [(1, 0)]
        assert checkpoints_of(1) == [{1, 2, 3}]
        feed_app.checkpoint(20)
        feed_app.checkpoint(20)
        run(2, fail_on=1)  # batch 1 of checkpoints 4 and 5 fails
        assert [(r, b) for r, b, _ in failed] == [(2, 1)]
        assert {r["checkpoint_id"] for r in failed[0][2]} == {4, 5}
        sixth = feed_app.checkpoint(20)  # before the restart: its run must emit it
        assert sixth == 6
        # The restart runs batch 1 again (checkpoint 7 is committed meanwhile), then
        # batch 2 up to checkpoint 6, the latest when the run started, and ends.
        run(3, commit_during=1)
        assert feed_app.next_id == 8
        assert [(r, b) for r, b, _ in delivered if r == 3] == [(3, 1), (3, 2)]
        assert checkpoints_of(3) == [{4, 5}, {6}]
        third_run = [r for run_, _, rows in delivered if run_ == 3 for r in rows]
        assert comparable(third_run) == comparable(expected_feed(feed_app, 4, 6))
        rerun = next(rows for run_, b, rows in delivered if run_ == 3 and b == 1)
        assert comparable(rerun) == comparable(failed[0][2])  # the same rows again
        run(4)  # the next run: checkpoint 7, batch 3
        assert [(r, b) for r, b, _ in delivered if r == 4] == [(4, 3)]
        assert checkpoints_of(4) == [{7}]
        run(5)  # nothing new: no batch, and the run ends
        assert [r for r, _, _ in delivered].count(5) == 0

        assert [b for _, b, _ in delivered] == [0, 1, 2, 3]
        emitted = [r for _, _, rows in delivered for r in rows]
        ids = [tuple(r[c] for c in ID) for r in emitted]
        assert len(ids) == len(set(ids))  # each change once across the runs
        assert comparable(emitted) == comparable(expected_feed(feed_app, 1, 7))
        check_counts_in_order(emitted, feed_app, 1, 7)
    finally:
        feed_app.close()


def test_a_one_key_lookup_reads_one_key_group(spark: Any, app: FeedApp) -> None:
    user = USERS[5]
    group = key_group_for_key(user, MAX_P)
    state = spark.read.format(FORMAT).options(**app.options(mode="state")).load()
    everything = rows_of(state)
    lookup = spark.read.format(FORMAT).options(**app.options(mode="state", pushdown="true")
                                               ).load().where(f"key = X'{user.hex()}'")
    assert rows_of(lookup) == [r for r in everything if r["key"] == user]
    assert {r["state"] for r in rows_of(lookup)} == {"count", "pages"}
    if not supports(SparkFeature.READER_FILTER_PUSHDOWN):
        # PySpark 4.0 (the compatibility run): the same rows, every key group read.
        assert lookup.rdd.getNumPartitions() == state.rdd.getNumPartitions() > 1
        return
    from pyspark.sql.datasource import EqualTo

    assert lookup.rdd.getNumPartitions() == 1
    assert state.where(f"key = X'{user.hex()}'").rdd.getNumPartitions() > 1  # no pushdown
    # What the pushed filter makes the reader plan: one task of one key group.
    reader = KafkaChangelogBatchReader(parse_options(app.options(mode="state")), pushdown=True)
    assert list(reader.pushFilters([EqualTo(("key",), bytearray(user))])) == [
        EqualTo(("key",), bytearray(user))]
    tasks = [p.task for p in reader.partitions()]  # type: ignore[attr-defined]
    assert [(t.key_groups.start, t.key_groups.end) for t in tasks] == [(group, group)]

    # Changes between checkpoints: only that key group's slices are read.
    between = spark.read.format(FORMAT).options(**app.options(
        startingCheckpoint="1", pushdown="true")).load()
    assert comparable(rows_of(between.where(between.key == user))) == comparable(
        [r for r in feed_in_process(app, 1, app.next_id - 1) if r["key"] == user])
    feed_reader = ChangesBetweenReader(parse_feed_options(
        app.options(startingCheckpoint="1"), streaming=False), pushdown=True)
    list(feed_reader.pushFilters([EqualTo(("key",), user)]))
    slices = [t.slice for p in feed_reader.partitions()
              for t in p.tasks]  # type: ignore[attr-defined]
    assert slices and {(s.key_group_start, s.key_group_end) for s in slices} == {(group, group)}


def test_errors_name_the_application_and_the_retained_checkpoints(
        spark: Any, app: FeedApp) -> None:
    with pytest.raises(CheckpointSelectionError) as unknown:
        FeedPlanner(parse_feed_options(
            {**app.options(startingCheckpoint="latest"), "application": "nobody"},
            streaming=True)).start()
    assert str(unknown.value) == (
        f"application 'nobody' has no checkpoint in checkpoint topic "
        f"{app.checkpoint_topic} (options application, checkpoint.topic), so there "
        "is no change feed to read; applications with checkpoints there: feed-app")
    retained = app.checkpoints.checkpoint_ids("feed-app")
    with pytest.raises(CheckpointSelectionError) as gone:
        FeedPlanner(parse_feed_options(app.options(startingCheckpoint="0"),
                                       streaming=True)).start()
    shown = ", ".join(map(str, retained))
    assert str(gone.value) == (
        "application 'feed-app': the change feed needs checkpoint 0 (option "
        "startingCheckpoint) to tell what the checkpoints after it committed, but it is not "
        f"retained in checkpoint topic {app.checkpoint_topic}; retained checkpoint "
        f"ids: {shown}. Set failOnDataLoss=false to continue after checkpoint {retained[0]} "
        "(the changes committed up to it are then not emitted)")
    lenient = FeedPlanner(parse_feed_options(
        app.options(startingCheckpoint="0", failOnDataLoss="false"), streaming=True))
    base, todo = lenient.checkpoints(lenient.start(), retained[1])
    assert base is not None and base.checkpoint_id == retained[0]
    assert [c.checkpoint_id for c in todo] == [retained[1]]
    # Through Spark: the message is kept.
    with pytest.raises(AnalysisException, match="application 'nobody' has no checkpoint"):
        spark.read.format(FORMAT).options(**{**app.options(startingCheckpoint="1"),
                                             "application": "nobody"}).load().collect()


def test_the_feed_schema_is_what_spark_derives() -> None:
    from spark_integration.sessions.spark_versions import arrow_schema_of

    assert arrow_schema_of(FEED_STRUCT).equals(FEED_SCHEMA)
