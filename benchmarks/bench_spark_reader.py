"""Spark reader throughput: ``format("kafka-changelog")`` (changes mode) vs the in-process reader.

One checkpoint of application ``bench`` is written directly with the storage: four
subtasks (key groups 0..127 split four ways, 16 partitions) append N state-op
changes (70% ``SET`` of an int64, 20% ``MAP_PUT``, 10% ``LIST_ADD``; keys from a
pool of 20,000 users, each change in its key's key group) after their
registrations, persist once and commit the checkpoint. Then every change of the
checkpoint is read:

- in process, with one :class:`~kafka_changelog.kafka.KafkaChangelogReader` over
  every subtask's handles (every change iterated), from creating the reader to
  closing it: the baseline; also reported, the same reader's column-wise read
  (``read_columns``, what restores use: no Python object per change);
- with Spark, ``spark.read.format("kafka-changelog")`` in mode ``changes`` and an
  aggregate over all rows (``count(*)``, checked equal to the in-process count), at
  ``local[1]`` and ``local[2]``: the wall time of the query, planning included,
  after one unmeasured warm-up query (Python worker start-up). Spark also decodes
  every payload into columns, which the in-process reader does not;
- the baseline: Spark's own Kafka connector, ``spark.read.format("kafka")`` over the
  same offset ranges (the union of the handles' ranges per partition: one subtask per
  partition here, so exactly the records the handles span), in the same sessions,
  aggregating ``count(*)`` and the bytes of every value (checked equal to the offsets
  spanned). It reads the raw records (several changes each, undecoded) in the JVM:
  what reading the checkpoint's records costs before any decoding.

"Others' CPU" is the share of the machine used by processes other than this one,
the broker and Spark (its JVM and Python workers) during a run: on a shared 2-core
machine, the figure that says how much to trust the others.

Figures are changes/s (for ``format("kafka")``: the checkpoint's changes over the
time to read the records holding them); the ratios are reader / in-process.
``--rounds`` measured runs of each (default 2); the best counts.

Run: ``python -m benchmarks.bench_spark_reader [--json FILE] [--rounds N]`` (default
``benchmarks/results/spark_reader.json``; ``BENCH_SCALE`` scales the number of changes).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import (
    MAX_PARALLELISM,
    RESULTS_DIR,
    Broker,
    ForeignLoad,
    kafka_broker,
    machine_info,
    ratio_text,
    scaled,
    table,
    unique_topic,
    wait_for_quiet,
    write_json,
)
from kafka_changelog import key_group_for_key, key_group_range_for_operator
from kafka_changelog.kafka import (
    KafkaChangelogConfig,
    KafkaChangelogHandle,
    KafkaChangelogReader,
    KafkaChangelogStorage,
)
from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore
from kafka_changelog.state.checkpoints.checkpoint import (
    CompletedCheckpoint,
    KeyedStateHandle,
    SubtaskState,
)
from kafka_changelog.state.schema.descriptors import StateKind
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp

DEFAULT_JSON = RESULTS_DIR / "spark_reader.json"
APPLICATION = "bench"
OPERATOR = "op"
SUBTASKS = 4
USERS = 20_000
#: Changes at BENCH_SCALE=1.
CHANGES = 1_000_000
SPARK_PARALLELISM = (1, 2)

#: The target: Spark ``local[2]`` changes/s at least this many times the in-process reader's.
TARGET_RATIO = 1.5

SPARK_KAFKA_BASELINE = (
    "Spark's own connector, spark.read.format('kafka') over the same offset ranges "
    "(startingOffsets/endingOffsets per partition), count(*) and sum(length(value)): the "
    "raw records, undecoded, read in the JVM"
)


@dataclass
class Run:
    """One measured read."""

    impl: str
    changes: int
    seconds: float
    #: CPU seconds of this Python process (for Spark: the driver's only).
    cpu_s: float
    #: Share of the machine's CPUs used by other processes (not the broker, not Spark).
    foreign_cpu_share: float
    input_partitions: int = 0
    waited_s: float = 0.0
    #: Kafka records read (``format("kafka")`` runs only).
    records: int = 0

    @property
    def changes_per_s(self) -> float:
        return self.changes / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "changes_per_s": self.changes_per_s}


@dataclass
class Checkpoint:
    """The written checkpoint: topics, handles and how many changes they hold."""

    changelog: KafkaChangelogConfig
    checkpoint_topic: str
    handles: list[KafkaChangelogHandle]
    changes: int


def _payload_pool(rng: random.Random) -> list[tuple[int, list[bytes]]]:
    """Per user: its key group and a few encoded state ops."""
    pool = []
    for i in range(USERS):
        key = f"user-{i:05d}".encode()
        ops = [
            StateOp("count", OpKind.SET, key, value=rng.randrange(1 << 40).to_bytes(8, "big")),
            StateOp("count", OpKind.SET, key, value=rng.randrange(1 << 20).to_bytes(8, "big")),
            StateOp("pages", OpKind.MAP_PUT, key, rng.choice([b"home", b"cart", b"pay"]),
                    rng.randrange(100).to_bytes(8, "big")),
            StateOp("events", OpKind.LIST_ADD, key, values=(b"click",)),
        ]
        pool.append((key_group_for_key(key, MAX_PARALLELISM), [op.to_bytes() for op in ops]))
    return pool


def write_checkpoint(broker: Broker, count: int) -> Checkpoint:
    """Write ``count`` changes as checkpoint 1 of :data:`APPLICATION`."""
    rng = random.Random(42)
    pool = _payload_pool(rng)
    config = broker.changelog_config(unique_topic("spark-reader-log"))
    checkpoint_topic = unique_topic("spark-reader-cp")
    broker.topics.append(checkpoint_topic)
    metas = [StateMeta("count", StateKind.VALUE, "int64").to_bytes(),
             StateMeta("pages", StateKind.MAP, "int64", "utf8").to_bytes(),
             StateMeta("events", StateKind.LIST, "utf8").to_bytes()]
    ranges = [key_group_range_for_operator(MAX_PARALLELISM, SUBTASKS, i) for i in range(SUBTASKS)]
    users = [[(kg, ops) for kg, ops in pool if r.contains(kg)] for r in ranges]
    subtasks = []
    handles = []
    with KafkaChangelogStorage(config) as storage:
        writers = [storage.create_writer(OPERATOR, r) for r in ranges]
        starts = [w.initial_sequence_number() for w in writers]
        for writer in writers:
            for meta in metas:
                writer.append_meta(meta)
        for i in range(count):
            index = i % SUBTASKS
            key_group, ops = rng.choice(users[index])
            roll = rng.random()
            payload = ops[0 if roll < 0.35 else 1 if roll < 0.7 else 2 if roll < 0.9 else 3]
            writers[index].append(key_group, payload)
            if i % 50_000 == 0:
                for writer in writers:
                    writer.next_sequence_number()  # several change sets, as a job has
        for index, (writer, start) in enumerate(zip(writers, starts, strict=True)):
            handle = writer.persist(start, 1).result(timeout=300).job_owned
            if not isinstance(handle, KafkaChangelogHandle):
                raise RuntimeError(f"subtask {index} persisted nothing")
            handles.append(handle)
            keyed = KeyedStateHandle(f"bench-{index}", ranges[index], 0, None, (handle,))
            subtasks.append(SubtaskState(OPERATOR, index, SUBTASKS, keyed, None))
        for writer in writers:
            writer.close()
    store = KafkaCheckpointStore(CheckpointStoreConfig(
        bootstrap_servers=broker.bootstrap_servers, topic=checkpoint_topic,
        client_config={k: v for k, v in broker.client_config.items()
                       if k != "bootstrap.servers"}))
    with store:
        store.commit(CompletedCheckpoint(APPLICATION, 1, int(time.time() * 1000),
                                         MAX_PARALLELISM, tuple(subtasks)))
    return Checkpoint(config, checkpoint_topic, handles, count + len(metas) * SUBTASKS)


def own_pids(broker: Broker) -> list[int]:
    """The broker's JVMs and every process this one started (Spark's JVM, its Python
    workers): their CPU is the benchmark's, not other processes' load."""
    pids = set(broker.pids())
    pids.update(child.pid for child in psutil.Process().children(recursive=True))
    pids.discard(os.getpid())
    return sorted(pids)


def run_in_process(broker: Broker, checkpoint: Checkpoint, columns: bool = False) -> Run:
    """Every change of every handle with one reader: iterated (``read``, a
    ``StateChange`` each: the baseline), or with ``columns`` decoded column-wise
    (``read_columns``, what restores use; reported, not the baseline)."""
    gc.collect()
    foreign = ForeignLoad(own_pids(broker))
    cpu0 = time.process_time()
    start = time.perf_counter()
    count = 0
    with KafkaChangelogReader(checkpoint.changelog) as reader:
        for handle in checkpoint.handles:
            if columns:
                decoded = reader.read_columns([handle])
                if decoded is None:
                    raise RuntimeError(f"read_columns declined {handle}")
                count += len(decoded)
            else:
                for _ in reader.read(handle):
                    count += 1
    seconds = time.perf_counter() - start
    return Run("in_process_columns" if columns else "in_process", count, seconds,
               time.process_time() - cpu0, foreign.share())


def spark_options(broker: Broker, checkpoint: Checkpoint) -> dict[str, str]:
    """Reader options for the checkpoint."""
    return {
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        **{f"kafka.{k}": str(v) for k, v in broker.client_config.items()
           if k != "bootstrap.servers"},
        "application": APPLICATION,
        "changelog.topic": checkpoint.changelog.topic,
        "checkpoint.topic": checkpoint.checkpoint_topic,
        "mode": "changes",
    }


def kafka_ranges(checkpoint: Checkpoint) -> tuple[str, str, int]:
    """``startingOffsets`` and ``endingOffsets`` (JSON) of the handles' offset ranges,
    per partition, and the number of offsets they span."""
    starts: dict[str, int] = {}
    ends: dict[str, int] = {}
    for handle in checkpoint.handles:
        for piece in handle.ranges:
            key = str(piece.partition)
            starts[key] = min(starts.get(key, piece.start_offset), piece.start_offset)
            ends[key] = max(ends.get(key, piece.end_offset), piece.end_offset)
    topic = checkpoint.changelog.topic
    spanned = sum(ends[key] - starts[key] for key in starts)
    return json.dumps({topic: starts}), json.dumps({topic: ends}), spanned


def run_spark(broker: Broker, checkpoint: Checkpoint, parallelism: int,
              rounds: int) -> list[Run]:
    """A warm-up query, then ``rounds`` measured ones, in a ``local[parallelism]`` session."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import functions as F

    from spark_integration import register
    from spark_integration.reader.datasource import input_partitions
    from spark_integration.reader.planning import parse_options, plan_read
    from spark_integration.sessions.session import local_session

    options = spark_options(broker, checkpoint)
    # What register() makes the reader do in this session: slices packed for its cores.
    parsed = replace(parse_options(options), min_partitions=parallelism)
    partitions = len(input_partitions(plan_read(parsed), parsed))
    spark = local_session(
        app_name=f"bench-spark-reader-{parallelism}", parallelism=parallelism,
        extra_config={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                      "spark.driver.memory": "2g", "spark.ui.showConsoleProgress": "false"})
    runs = []
    try:
        register(spark)

        def query() -> int:
            df = spark.read.format("kafka-changelog").options(**options).load()
            row = df.agg(F.count(F.lit(1)).alias("n"), F.sum("offset")).collect()[0]
            return int(row["n"])

        found = query()  # warm-up: Python workers, JIT
        if found != checkpoint.changes:
            raise RuntimeError(f"Spark read {found} changes; the checkpoint holds "
                               f"{checkpoint.changes}")
        starting, ending, spanned = kafka_ranges(checkpoint)
        kafka_partitions = len(json.loads(starting)[checkpoint.changelog.topic])

        def kafka_query() -> int:
            df = (spark.read.format("kafka")
                  .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                  .option("assign", json.dumps({checkpoint.changelog.topic: sorted(
                      int(p) for p in json.loads(starting)[checkpoint.changelog.topic])}))
                  .option("startingOffsets", starting).option("endingOffsets", ending)
                  .load())
            row = df.agg(F.count(F.lit(1)).alias("n"),
                         F.sum(F.length("value")).alias("bytes")).collect()[0]
            return int(row["n"])

        found = kafka_query()  # warm-up
        if found != spanned:
            raise RuntimeError(f"format('kafka') read {found} records; the ranges span "
                               f"{spanned} offsets")
        for _ in range(rounds):
            for impl, measured in ((f"spark_local_{parallelism}", query),
                                   (f"spark_kafka_local_{parallelism}", kafka_query)):
                waited = wait_for_quiet(own_pids(broker))["waited_s"]
                foreign = ForeignLoad(own_pids(broker))
                cpu0 = time.process_time()
                start = time.perf_counter()
                found = measured()
                seconds = time.perf_counter() - start
                kafka = measured is kafka_query
                run = Run(impl, checkpoint.changes if kafka else found, seconds,
                          time.process_time() - cpu0, foreign.share(),
                          kafka_partitions if kafka else partitions, waited,
                          records=found if kafka else 0)
                runs.append(run)
                what = "format('kafka')       " if kafka else "format('kafka-changelog')"
                print(f"  local[{parallelism}] {what} {run.changes_per_s:>12,.0f} changes/s "
                      f"({seconds:.1f} s, {run.input_partitions} input partitions, others used "
                      f"{run.foreign_cpu_share:.0%} of the CPUs)", flush=True)
    finally:
        spark.stop()
    return runs


def run(broker: Broker, rounds: int = 2) -> dict[str, Any]:
    """Write the checkpoint, read it every way; the JSON-able results."""
    count = int(scaled(CHANGES, minimum=20_000))
    print(f"\n[spark reader] writing {count:,} changes ({SUBTASKS} subtasks)", flush=True)
    started = time.perf_counter()
    checkpoint = write_checkpoint(broker, count)
    print(f"  written in {time.perf_counter() - started:.1f} s", flush=True)
    runs: list[Run] = []
    for _ in range(rounds):
        for columns in (False, True):
            waited = wait_for_quiet(own_pids(broker))["waited_s"]
            result = run_in_process(broker, checkpoint, columns)
            result.waited_s = waited
            if result.changes != checkpoint.changes:
                raise RuntimeError(f"{result.impl} read {result.changes} changes; the "
                                   f"checkpoint holds {checkpoint.changes}")
            runs.append(result)
            print(f"  {result.impl:<18} {result.changes_per_s:>12,.0f} changes/s "
                  f"({result.seconds:.1f} s, others used {result.foreign_cpu_share:.0%} of "
                  "the CPUs)", flush=True)
    for parallelism in SPARK_PARALLELISM:
        runs.extend(run_spark(broker, checkpoint, parallelism, rounds))
    best = {impl: max((r for r in runs if r.impl == impl), key=lambda r: r.changes_per_s)
            for impl in dict.fromkeys(r.impl for r in runs)}
    base = best["in_process"].changes_per_s
    achieved = best["spark_local_2"].changes_per_s / base
    return {
        "name": "spark_reader",
        "target": {"figure": "spark_local_2 / in_process, changes/s", "ratio": TARGET_RATIO,
                   "measured": achieved, "pass": achieved >= TARGET_RATIO},
        "changes": checkpoint.changes,
        "subtasks": SUBTASKS,
        "rounds": rounds,
        "best": {impl: r.as_dict() for impl, r in best.items()},
        "ratios": {impl: r.changes_per_s / base for impl, r in best.items()
                   if impl != "in_process"},
        "spark_kafka_baseline": SPARK_KAFKA_BASELINE,
        "runs": [r.as_dict() for r in runs],
    }


def report(results: dict[str, Any]) -> str:
    rows = []
    base = results["best"]["in_process"]["changes_per_s"]
    for impl, best in results["best"].items():
        rows.append([
            impl, f"{best['changes_per_s']:,.0f}", f"{best['seconds']:.2f}",
            str(best["input_partitions"] or "-"),
            ratio_text(best["changes_per_s"] / base),
            f"{best['foreign_cpu_share']:.0%}",
        ])
    return table(["reader", "changes/s", "seconds", "input partitions", "vs in-process",
                  "others' CPU"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write the results to this file")
    parser.add_argument("--rounds", type=int, default=2, help="measured runs of each reader")
    args = parser.parse_args(argv)
    with kafka_broker() as broker:
        results = run(broker, rounds=args.rounds)
        results["machine"] = machine_info()
    print(f"\nreader throughput, changes mode ({results['changes']:,} changes; best run of "
          "each; ratio = reader / in-process KafkaChangelogReader)")
    print(report(results))
    print(f"spark_kafka_local_N: {SPARK_KAFKA_BASELINE}")
    target = results["target"]
    print(f"target: Spark local[2] / in-process >= {target['ratio']:g}x: "
          f"{target['measured']:.3f}x {'PASS' if target['pass'] else 'MISS'}")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
