"""The change feed and key pushdown: throughput of the feed, cost of a one-key lookup.

Two applications are written directly with the storage (no stateful job), four subtasks
(key groups 0..127 split four ways, 16 changelog partitions):

- ``feed``: CHECKPOINTS checkpoints, each appending N / CHECKPOINTS ``SET`` changes of
  int64 values (keys from a pool of 20,000) to the same writers and persisting their log
  since the start, as a running job does between materializations: each checkpoint's
  handles are cumulative. Then, in a ``local[2]`` session, every change is read:

  * the change feed, ``readStream.format("kafka-changelog")`` from
    ``startingCheckpoint=earliest`` with ``trigger(availableNow=True)`` and a
    ``foreachBatch`` counting the rows of each micro-batch: from ``start()`` to the
    end of the query (each checkpoint's committed changes, found from its handles
    minus its predecessor's);
  * the baseline, the batch reader in mode ``changes`` on the latest checkpoint (its
    handles hold every change once), ``count(*)``: the same rows without the diffing
    and the checkpoint columns;
  * also reported: the batch read of the same range (``startingCheckpoint=earliest``),
    and the feed's fixed cost: the same streaming query from ``startingCheckpoint=latest``
    (nothing to read; PySpark starts a Python process per streaming query to plan it).

- ``lookup``: one checkpoint holding KEYS keys (one ``SET`` each, changelog only). Mode
  ``state`` of the whole state (``count(*)``, every key restored) against a one-key
  lookup (``where(key = ...)``: the pushed filter makes the plan read one key group's
  part of the changelog). Target: the lookup at least 10x faster.

Each Spark query runs once unmeasured (Python workers, JIT), then ``--rounds`` times
(default 2; the best counts). "Others' CPU" is the share of the machine used by other
processes meanwhile (not the broker, not Spark).

Run: ``PYTHONPATH=. python -m benchmarks.bench_change_feed [--json FILE] [--rounds N]``
(default ``benchmarks/results/change_feed.json``; ``BENCH_SCALE`` scales N and KEYS).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench_spark_reader import own_pids
from benchmarks.common import (
    MAX_PARALLELISM,
    RESULTS_DIR,
    Broker,
    ForeignLoad,
    kafka_broker,
    machine_info,
    scaled,
    table,
    unique_topic,
    wait_for_quiet,
    write_json,
)
from kafka_changelog import key_group_for_key, key_group_range_for_operator
from kafka_changelog.kafka import KafkaChangelogConfig, KafkaChangelogHandle, KafkaChangelogStorage
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    SubtaskState,
)
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp

DEFAULT_JSON = RESULTS_DIR / "change_feed.json"
OPERATOR = "op"
SUBTASKS = 4
USERS = 20_000
#: Changes of the feed application at BENCH_SCALE=1, over CHECKPOINTS checkpoints.
CHANGES = 1_000_000
CHECKPOINTS = 5
#: Keys of the lookup application's state at BENCH_SCALE=1.
KEYS = 1_000_000
#: The target: full state read seconds / one-key lookup seconds.
LOOKUP_TARGET = 10.0
#: The target: the feed's rows/s / the batch changes reader's on the same changes.
FEED_TARGET = 0.8


@dataclass
class Run:
    """One measured Spark query."""

    impl: str
    rows: int
    seconds: float
    foreign_cpu_share: float
    waited_s: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.rows else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rows_per_s": self.rows_per_s}


@dataclass
class App:
    """A written application: its topics and what its checkpoints hold."""

    name: str
    changelog: KafkaChangelogConfig
    checkpoint_topic: str
    changes: int


def _ranges() -> list[Any]:
    return [key_group_range_for_operator(MAX_PARALLELISM, SUBTASKS, i) for i in range(SUBTASKS)]


def write_app(broker: Broker, name: str, batches: list[list[tuple[bytes, bytes]]]) -> App:
    """Checkpoints 1..len(batches) of application ``name``: checkpoint i appends the
    (key, op payload) of ``batches[i-1]`` to its key's subtask's writer and commits
    every writer's log since the start (cumulative handles)."""
    config = broker.changelog_config(unique_topic(f"feed-{name}-log"))
    checkpoint_topic = unique_topic(f"feed-{name}-cp")
    broker.topics.append(checkpoint_topic)
    ranges = _ranges()
    metas = [StateMeta("count", StateKind.VALUE, "int64").to_bytes()]
    store = KafkaCheckpointStore(CheckpointStoreConfig(
        bootstrap_servers=broker.bootstrap_servers, topic=checkpoint_topic, retain=CHECKPOINTS + 1,
        client_config={k: v for k, v in broker.client_config.items()
                       if k != "bootstrap.servers"}))
    changes = 0
    with KafkaChangelogStorage(config) as storage, store:
        writers = [storage.create_writer(OPERATOR, r) for r in ranges]
        starts = [w.initial_sequence_number() for w in writers]
        for writer in writers:
            for meta in metas:
                writer.append_meta(meta)
        changes += len(metas) * SUBTASKS
        for checkpoint_id, batch in enumerate(batches, start=1):
            for n, (key, payload) in enumerate(batch):
                key_group = key_group_for_key(key, MAX_PARALLELISM)
                writers[key_group * SUBTASKS // MAX_PARALLELISM].append(key_group, payload)
                if n % 50_000 == 0:
                    for writer in writers:
                        writer.next_sequence_number()  # several change sets, as a job has
            changes += len(batch)
            subtasks = []
            for index, (writer, start) in enumerate(zip(writers, starts, strict=True)):
                handle = writer.persist(start, checkpoint_id).result(timeout=600).job_owned
                if not isinstance(handle, KafkaChangelogHandle):
                    raise RuntimeError(f"subtask {index} persisted nothing")
                keyed = KeyedStateHandle(f"{name}-{index}", ranges[index], 0, None, (handle,))
                subtasks.append(SubtaskState(OPERATOR, index, SUBTASKS, keyed, None))
            store.commit(CompletedCheckpoint(name, checkpoint_id, int(time.time() * 1000),
                                             MAX_PARALLELISM, tuple(subtasks)))
        for writer in writers:
            writer.close()
    return App(name, config, checkpoint_topic, changes)


def feed_batches(count: int) -> list[list[tuple[bytes, bytes]]]:
    """CHECKPOINTS batches of ``count`` changes in all: SETs of int64 values."""
    rng = random.Random(42)
    keys = [f"user-{i:05d}".encode() for i in range(USERS)]
    per = count // CHECKPOINTS
    return [[(key, StateOp("count", OpKind.SET, key,
                           value=rng.randrange(1 << 40).to_bytes(8, "big")).to_bytes())
             for key in (rng.choice(keys) for _ in range(per))] for _ in range(CHECKPOINTS)]


def state_batch(keys: int) -> list[list[tuple[bytes, bytes]]]:
    """One checkpoint setting each of ``keys`` keys once."""
    value = (7).to_bytes(8, "big")
    return [[(key, StateOp("count", OpKind.SET, key, value=value).to_bytes())
             for key in (f"key-{i:07d}".encode() for i in range(keys))]]


def options(broker: Broker, app: App, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": broker.bootstrap_servers,
            **{f"kafka.{k}": str(v) for k, v in broker.client_config.items()
               if k != "bootstrap.servers"},
            "application": app.name, "checkpoint.topic": app.checkpoint_topic, **extra}


def measure(broker: Broker, impl: str, query: Callable[[], int], expected: int,
            rounds: int, check: Callable[[], None] | None = None) -> list[Run]:
    """One warm-up, then ``rounds`` measured runs of ``query`` (which must give
    ``expected`` rows), each followed by ``check`` (not measured; None: no check)."""
    found = query()
    if found != expected:
        raise RuntimeError(f"{impl}: {found} rows, expected {expected}")
    if check is not None:
        check()
    runs = []
    for _ in range(rounds):
        waited = wait_for_quiet(own_pids(broker))["waited_s"]
        foreign = ForeignLoad(own_pids(broker))
        start = time.perf_counter()
        found = query()
        seconds = time.perf_counter() - start
        if found != expected:
            raise RuntimeError(f"{impl}: {found} rows, expected {expected}")
        run = Run(impl, found, seconds, foreign.share(), waited)
        if check is not None:
            check()
        runs.append(run)
        print(f"  {impl:<22} {run.rows_per_s:>12,.0f} rows/s ({seconds:.2f} s, others used "
              f"{run.foreign_cpu_share:.0%} of the CPUs)", flush=True)
    return runs


def run(broker: Broker, rounds: int = 2) -> dict[str, Any]:
    """Write both applications, run every query; the JSON-able results."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    changes = int(scaled(CHANGES, minimum=20_000))
    keys = int(scaled(KEYS, minimum=20_000))
    print(f"\n[change feed] writing {changes:,} changes in {CHECKPOINTS} checkpoints and a "
          f"{keys:,}-key state", flush=True)
    started = time.perf_counter()
    feed_app = write_app(broker, "feed", feed_batches(changes))
    lookup_app = write_app(broker, "lookup", state_batch(keys))
    print(f"  written in {time.perf_counter() - started:.1f} s", flush=True)

    from pyspark.sql import functions as F

    from spark_integration import register
    from spark_integration.sessions.session import local_session

    spark = local_session(
        app_name="bench-change-feed", parallelism=2,
        extra_config={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                      "spark.driver.memory": "2g", "spark.ui.showConsoleProgress": "false"})
    runs: list[Run] = []
    lookup_partitions = full_partitions = 0
    try:
        register(spark)

        def count(**extra: str) -> Callable[[], int]:
            def query() -> int:
                df = spark.read.format("kafka-changelog").options(
                    **options(broker, feed_app, **extra)).load()
                return int(df.agg(F.count(F.lit(1))).collect()[0][0])
            return query

        def feed(starting: str = "earliest") -> int:
            seen: list[int] = []
            with tempfile.TemporaryDirectory() as where:
                query = (spark.readStream.format("kafka-changelog")
                         .options(**options(broker, feed_app, startingCheckpoint=starting))
                         .load().writeStream
                         .foreachBatch(lambda df, _: seen.append(df.count()))
                         .trigger(availableNow=True)
                         .option("checkpointLocation", where).start())
                query.awaitTermination()
            return sum(seen)

        runs += measure(broker, "feed_stream", feed, feed_app.changes, rounds)
        # The same query with nothing to read: what a feed run costs before any change.
        runs += measure(broker, "feed_stream_empty", lambda: feed("latest"), 0, rounds)
        runs += measure(broker, "batch_changes_latest", count(checkpoint=str(CHECKPOINTS)),
                        feed_app.changes, rounds)
        runs += measure(broker, "batch_between", count(startingCheckpoint="earliest"),
                        feed_app.changes, rounds)

        state = spark.read.format("kafka-changelog").options(
            **options(broker, lookup_app, mode="state")).load()
        one = b"key-0000042"
        # A DataFrame of its own: PySpark 4.2.0 keeps a pushed-down plan on the DataFrame.
        lookup = spark.read.format("kafka-changelog").options(
            **options(broker, lookup_app, mode="state", pushdown="true")).load().where(
            F.col("key") == F.lit(one))
        full_partitions = state.rdd.getNumPartitions()
        lookup_partitions = lookup.rdd.getNumPartitions()
        runs += measure(broker, "state_full", lambda: int(state.count()), keys, rounds)
        runs += measure(broker, "state_lookup", lambda: len(lookup.collect()), 1, rounds)
    finally:
        spark.stop()

    best = {impl: min((r for r in runs if r.impl == impl), key=lambda r: r.seconds)
            for impl in dict.fromkeys(r.impl for r in runs)}
    feed_ratio = best["feed_stream"].rows_per_s / best["batch_changes_latest"].rows_per_s
    fixed_s = best["feed_stream_empty"].seconds
    lookup_ratio = best["state_full"].seconds / best["state_lookup"].seconds
    return {
        "name": "change_feed",
        "changes": feed_app.changes,
        "checkpoints": CHECKPOINTS,
        "keys": keys,
        "rounds": rounds,
        "feed_ratio": feed_ratio,
        "feed_target": FEED_TARGET,
        "feed_pass": feed_ratio >= FEED_TARGET,
        "feed_fixed_s": fixed_s,
        "lookup": {"ratio": lookup_ratio, "target": LOOKUP_TARGET,
                   "pass": lookup_ratio >= LOOKUP_TARGET,
                   "input_partitions": lookup_partitions,
                   "full_input_partitions": full_partitions},
        "best": {impl: r.as_dict() for impl, r in best.items()},
        "runs": [r.as_dict() for r in runs],
    }


def report(results: dict[str, Any]) -> str:
    rows = [[impl, str(best["rows"]), f"{best['rows_per_s']:,.0f}", f"{best['seconds']:.2f}",
             f"{best['foreign_cpu_share']:.0%}"] for impl, best in results["best"].items()]
    return table(["query", "rows", "rows/s", "seconds", "others' CPU"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write the results to this file")
    parser.add_argument("--rounds", type=int, default=2, help="measured runs of each query")
    args = parser.parse_args(argv)
    with kafka_broker() as broker:
        results = run(broker, rounds=args.rounds)
        results["machine"] = machine_info()
    print(f"\nchange feed ({results['changes']:,} changes in {results['checkpoints']} "
          f"checkpoints) and a {results['keys']:,}-key state; best run of each")
    print(report(results))
    lookup = results["lookup"]
    print(f"target: feed / batch changes of the latest checkpoint, rows/s >= "
          f"{results['feed_target']:g}x: {results['feed_ratio']:.3f}x "
          f"{'PASS' if results['feed_pass'] else 'MISS'} (a feed run with nothing new takes "
          f"{results['feed_fixed_s']:.2f} s)")
    print(f"target: full state read / one-key lookup >= {lookup['target']:g}x: "
          f"{lookup['ratio']:.2f}x {'PASS' if lookup['pass'] else 'MISS'} (input partitions "
          f"{lookup['full_input_partitions']} against {lookup['input_partitions']})")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
