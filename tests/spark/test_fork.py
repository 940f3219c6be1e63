"""``fork``: blue/green on identical state, continuing independently on shared topics.

One streaming run (blue's state in memory: materializations at known batches; green's in
RocksDB): blue runs two batches; green is forked at blue's latest checkpoint and teal at
blue's first; blue and green then run three batches each with different input (retain 2,
materializations due at every batch, so both applications' garbage collection subsumes the
forked checkpoints and tombstones chunks); a sweep of the snapshot topic; every chunk a
stored checkpoint names is still live (a snapshot naming chunks under the wrong backend id
would fail this too); blue's state is read (a full restore from Kafka) and compared with
what it must be; blue is reset, and green and teal restore exactly; green continues.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kafka_changelog.cli.main import main
from kafka_changelog.kafka import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.history.fork import FORK_APPLICATION, FORK_CHECKPOINT
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch
from spark_integration.streaming.driver import StatefulProcessor
from spark_integration.streaming.worker_resources import WorkerResources

pytestmark = [pytest.mark.broker, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
TOTAL = value_state("total", INT64)


def add_amounts(key: str, rows: pd.DataFrame, state: Any) -> None:
    total = state(TOTAL)
    total.update((total.value() or 0) + int(rows["amount"].sum()))


def cli(config: StreamingStateConfig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_changelog.cli", *args, "-b", config.bootstrap_servers,
         "--checkpoint-topic", config.checkpoint_topic, "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=180)


@contextmanager
def processor(config: StreamingStateConfig) -> Iterator[StatefulProcessor]:
    with stateful_foreach_batch(config, add_amounts, "user", "user string") as running:
        yield running


def state_of(spark: Any, config: StreamingStateConfig, application: str) -> dict[str, int]:
    rows = (spark.read.format("kafka-changelog")
            .options(**dataclasses.replace(config, application=application).reader_options())
            .option("mode", "state").load().where("state = 'total'").collect())
    return {r["key_decoded"]: int(r["value_decoded"]) for r in rows}


def assert_named_chunks_live(coordinator: CheckpointCoordinator) -> None:
    """Every chunk a stored checkpoint of any application names is not tombstoned."""
    named = {chunk.record_key(s.keyed.snapshot.backend_id)
             for cp in coordinator.checkpoints.all_checkpoints() for s in cp.subtasks
             if s.keyed is not None and s.keyed.snapshot is not None
             for chunk in s.keyed.snapshot.chunks}
    assert named
    live = {key.key for key in coordinator.snapshots.live_keys()}
    assert sorted(named - live) == []


def apply(expected: dict[str, int], rows: list[tuple[str, int]]) -> None:
    for user, amount in rows:
        expected[user] = expected.get(user, 0) + amount


def test_forks_continue_independently_and_survive_each_others_gc_and_reset(
        spark: Any, kafka_cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"fork-{uuid.uuid4().hex[:8]}"
    blue = StreamingStateConfig(
        f"{prefix}-blue", "sums", kafka_cluster.bootstrap_servers, partitions=2, retain=2,
        # In memory, a due materialization runs at the start of each task: every
        # checkpoint names a snapshot (deterministically) and reuses unchanged key groups'
        # chunks, which the forked checkpoints then share.
        materialization_interval_s=0.001, state_backend="memory",
        changelog_topic=f"{prefix}-log",
        snapshot_topic=f"{prefix}-snap", checkpoint_topic=f"{prefix}-cp")
    # Green keeps its state in host-local RocksDB stores (the default backend): a fork
    # restores into either, and its background materializations write under its own
    # backend ids.
    green = dataclasses.replace(blue, application=f"{prefix}-green", state_backend="rocksdb")
    teal = f"{prefix}-teal"

    def frame(rows: list[tuple[str, int]]) -> Any:
        return spark.createDataFrame(rows, "user string, amount long")

    first = [("ann", 1), ("bob", 2)]
    second = [("ann", 3), ("cat", 4)]
    blue_expected: dict[str, int] = {}
    try:
        with processor(blue) as run_blue:
            for batch_id, rows in enumerate((first, second)):
                run_blue(frame(rows), batch_id)
                apply(blue_expected, rows)
        teal_expected = {"ann": 1, "bob": 2}
        green_expected = dict(blue_expected)

        forked = cli(blue, "fork", blue.application, green.application)
        assert forked.returncode == 0, forked.stderr
        summary = json.loads(forked.stdout)
        assert {k: summary[k] for k in ("outcome", "checkpoint_id", "changelog_topics",
                                        "snapshot_topics")} == {
            "outcome": "created", "checkpoint_id": 2, "changelog_topics": [f"{prefix}-log"],
            "snapshot_topics": [f"{prefix}-snap"]}
        # The same command in this process (no interpreter start).
        capsys.readouterr()
        assert main(["fork", blue.application, teal, "--checkpoint", "1", "-b",
                     blue.bootstrap_servers, "--checkpoint-topic", blue.checkpoint_topic,
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["checkpoint_id"] == 1
        with KafkaCheckpointStore(CheckpointStoreConfig(
                bootstrap_servers=blue.bootstrap_servers, topic=blue.checkpoint_topic)) as store:
            green_first = store.get(green.application, 2)
            blue_second = store.get(blue.application, 2)
        assert green_first.properties == {**blue_second.properties,
                                          FORK_APPLICATION: blue.application,
                                          FORK_CHECKPOINT: "2"}
        # The same state by reference: snapshots and changelog ranges, not backend ids.
        assert [(s.keyed.snapshot, s.keyed.changelog) for s in green_first.subtasks
                if s.keyed is not None] == [(s.keyed.snapshot, s.keyed.changelog)
                                            for s in blue_second.subtasks if s.keyed is not None]
        assert any(s.keyed.snapshot is not None and s.keyed.snapshot.chunks
                   for s in green_first.subtasks if s.keyed is not None)
        assert not {s.keyed.backend_id for s in green_first.subtasks if s.keyed is not None} & {
            s.keyed.backend_id for s in blue_second.subtasks if s.keyed is not None}

        # Both continue, interleaved, with different input; GC runs at every commit.
        # Blue never touches bob again: its checkpoints keep reusing the chunk of bob's key
        # group that the forked checkpoint names too, which green's GC must keep.
        blue_input = [[("ann", 10), ("dan", 5)], [("dan", 7)], [("ann", 1), ("eve", 2)]]
        green_input = [[("bob", 100)], [("cat", 200), ("fay", 1)], [("ann", 1000)]]
        with processor(blue) as run_blue, processor(green) as run_green:
            pairs = zip(blue_input, green_input, strict=True)
            # (The driver collects garbage after each commit in the background.)
            gcs = (WorkerResources.coordinator(blue), WorkerResources.coordinator(green))
            for batch_id, (blue_rows, green_rows) in enumerate(pairs, start=2):
                run_blue(frame(blue_rows), batch_id)
                assert gcs[0].wait_for_collection(60)
                apply(blue_expected, blue_rows)
                run_green(frame(green_rows), batch_id)
                assert gcs[1].wait_for_collection(60)
                apply(green_expected, green_rows)
            for coordinator in (WorkerResources.coordinator(blue),
                                WorkerResources.coordinator(green)):
                assert coordinator.last_garbage.error is None
                assert coordinator.last_garbage.discarded_checkpoints == [3]
            blue_gc = WorkerResources.coordinator(blue)
            assert blue_gc.checkpoints.checkpoint_ids(blue.application) == [4, 5]
            assert blue_gc.checkpoints.checkpoint_ids(green.application) == [4, 5]
            # The sweep reads every application's checkpoints: forked chunks stay named.
            blue_gc.sweep_chunks()
            # Kafka serves a tombstoned chunk until compaction: reads alone would not see a
            # chunk deleted under the other application, so look at what is live.
            assert_named_chunks_live(blue_gc)

        assert state_of(spark, blue, blue.application) == blue_expected

        # Green's and teal's reads after blue's reset also show that blue's GC kept theirs.
        capsys.readouterr()
        assert main(["reset", blue.application, "--yes", "--force", "-b",
                     blue.bootstrap_servers, "--checkpoint-topic", blue.checkpoint_topic,
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["reset"] is True
        assert state_of(spark, blue, green.application) == green_expected
        assert state_of(spark, blue, teal) == teal_expected
        assert_named_chunks_live(WorkerResources.coordinator(green))

        # Green goes on after blue is gone.
        with processor(green) as run_green:
            run_green(frame([("gus", 3)]), 5)
            apply(green_expected, [("gus", 3)])
        assert state_of(spark, blue, green.application) == green_expected
    finally:
        WorkerResources.release(blue)
        WorkerResources.release(green)
