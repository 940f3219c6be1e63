"""End-to-end latency: from a record produced to the output that reflects it, visible to a
``read_committed`` consumer, ours (exactly-once outputs) against Spark's own stateful
operator writing with Spark's Kafka sink (at-least-once), on the same trigger.

Method. One local broker (or ``KAFKA_BOOTSTRAP_SERVERS``). Per side, in turn, on topics of
its own: a child process runs the query (``local[2]``, two subtasks / shuffle partitions,
``trigger(processingTime="1 second")``, Spark's ``format("kafka")`` source); this process
produces clicks at a steady rate (``RATE`` a second, ``USERS`` users in turn, each record's
value carrying its send time) for ``WARMUP_S`` + ``MEASURE_S`` seconds, and a consumer
(``isolation.level=read_committed``) reads the outputs. The job is a click counter per user:
an output row ``(user, count, last_ms)`` per user and batch. A record, the ``k``-th of its
user, is reflected by the first output of that user whose ``count >= k``: its latency is
the time that output was received minus the record's send time (one clock: this
process's). Records sent in the warm-up are not counted. After the producer stops, the run
waits until every user's last output counts all its records (exactness: the final counts
equal the records produced), then stops the query.

Sides:

- **ours**: ``stateful_foreach_batch`` (per-key function, one ``value_state``, memory
  working copy) with ``KafkaOutputSink``: each task commits its outputs with its part of
  the checkpoint in one transaction;
- **spark_transform_with_state**: ``groupBy("user").transformWithStateInPandas`` (one
  ``ValueState``, RocksDB state store with changelog checkpointing), output mode
  ``Update``, ``writeStream.format("kafka")``: at-least-once (a restarted batch writes its
  outputs again).

Reported per side: p50, p99 and max latency, outputs, and outputs repeated (the same user
and count twice: ours must have none), and where a batch's time goes (the medians of
Spark's ``durationMs`` phases over the batches with input). Target (issue #40): our p99
<= Spark's.

Run: ``python -m benchmarks.bench_latency [--json FILE]`` (default
``benchmarks/results/latency.json``); ``BENCH_SCALE`` scales the measured time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from benchmarks.common import (
    REPO_ROOT,
    RESULTS_DIR,
    Broker,
    ForeignLoad,
    kafka_broker,
    machine_info,
    percentile,
    scaled,
    table,
    wait_for_quiet,
    write_json,
)

DEFAULT_JSON = RESULTS_DIR / "latency.json"
RATE = 1_000
USERS = 200
WARMUP_S = 20.0
MEASURE_S = 60.0
TRIGGER = "1 second"
PARTITIONS = 2
SIDES = ("ours", "spark_transform_with_state")
LABELS = {"ours": "ours (KafkaOutputSink, exactly-once)",
          "spark_transform_with_state": "Spark transformWithStateInPandas + Kafka sink"}
READY = "READY"
PHASES = "PHASES"
#: How long the outputs may take to count every record once the producer stopped.
DRAIN_S = 120.0


# --- the child: one side's streaming query -----------------------------------------------


def _clicks(spark: Any, bootstrap: str, topic: str) -> Any:
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest").load())
    return raw.select(F.col("key").cast("string").alias("user"),
                      F.get_json_object(F.col("value").cast("string"), "$.ms")
                      .cast("long").alias("ms"))


def _start_ours(spark: Any, bootstrap: str, input_topic: str, output_topic: str,
                checkpoint: str, application: str) -> tuple[Any, Any]:
    import pandas as pd

    from kafka_changelog.state import INT64, value_state
    from spark_integration import KafkaOutputSink
    from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch

    count_state = value_state("count", INT64)

    def count_clicks(user: str, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
        count = state(count_state)
        total = (count.value() or 0) + len(rows)
        count.update(total)
        return [{"user": user, "count": total, "last_ms": int(rows["ms"].max())}]

    config = StreamingStateConfig(
        application=application, operator_id="clicks", bootstrap_servers=bootstrap,
        changelog_topic=f"{application}-changelog", snapshot_topic=f"{application}-snapshots",
        checkpoint_topic=f"{application}-checkpoints", partitions=PARTITIONS,
        parallelism=PARTITIONS)
    processor = stateful_foreach_batch(
        config, count_clicks, "user", "user string, count long, last_ms long",
        sink=KafkaOutputSink(output_topic, key_column="user"))
    query = (_clicks(spark, bootstrap, input_topic).writeStream.foreachBatch(processor)
             .option("checkpointLocation", checkpoint).trigger(processingTime=TRIGGER).start())
    return query, processor


def _start_spark(spark: Any, bootstrap: str, input_topic: str, output_topic: str,
                 checkpoint: str) -> Any:
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class CountClicks(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "value long")

        def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[pd.DataFrame],
                            timerValues: Any) -> Iterator[pd.DataFrame]:
            frames = list(rows)
            got = self.count.get()
            total = (got[0] if got is not None else 0) + sum(len(f) for f in frames)
            self.count.update((total,))
            last = max(int(f["ms"].max()) for f in frames)
            yield pd.DataFrame({"user": [key[0]], "count": [total], "last_ms": [last]})

        def close(self) -> None:
            pass

    counted = _clicks(spark, bootstrap, input_topic).groupBy("user").transformWithStateInPandas(
        CountClicks(), "user string, count long, last_ms long", "Update", "None")
    out = counted.select(F.col("user").alias("key"),
                         F.to_json(F.struct("user", "count", "last_ms")).alias("value"))
    return (out.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("topic", output_topic).option("checkpointLocation", checkpoint)
            .outputMode("update").trigger(processingTime=TRIGGER).start())


def child(side: str, bootstrap: str, input_topic: str, output_topic: str, checkpoint: str,
          stop_file: str) -> int:
    """Run ``side``'s query until ``stop_file`` exists."""
    from spark_integration.sessions.session import spark_session

    spark = spark_session("local[2]", f"bench-latency-{side}", PARTITIONS, {
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    processor = None
    if side == "ours":
        query, processor = _start_ours(spark, bootstrap, input_topic, output_topic,
                                       checkpoint, f"latency-{uuid.uuid4().hex[:8]}")
    else:
        query = _start_spark(spark, bootstrap, input_topic, output_topic, checkpoint)
    print(READY, flush=True)
    try:
        while not os.path.exists(stop_file):
            if query.exception() is not None:
                raise RuntimeError(f"{side}: the query failed: {query.exception()}")
            time.sleep(0.2)
    finally:
        progress = [p for p in query.recentProgress if p.numInputRows > 0]
        query.stop()
        if processor is not None:
            processor.close()
        spark.stop()
    # Where a batch's time goes: the medians of Spark's phases (ms) over batches with input.
    phases = sorted({name for p in progress for name in p.durationMs})
    medians = {name: statistics.median(p.durationMs.get(name, 0) for p in progress)
               for name in phases} if progress else {}
    if processor is not None and processor.reports:  # ours: the parts of addBatch
        reports = [r for r in processor.reports if r.rows_out]
        for name in ("seconds", "input_check_s", "task_s", "commit_s"):
            medians[f"ours_{name}"] = round(1000 * statistics.median(
                getattr(r, name) for r in reports), 1)
    print(PHASES, json.dumps(medians), flush=True)
    return 0


# --- this process: the producer, the consumer, the figures -------------------------------


@dataclass
class SideRun:
    """What one side's run measured."""

    sent: dict[str, list[float]] = field(default_factory=dict)  # user -> send ms per record
    reflected: dict[str, int] = field(default_factory=dict)  # user -> records reflected
    latencies_ms: list[float] = field(default_factory=list)
    outputs: int = 0
    repeated: int = 0
    seen: set[tuple[str, int]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self, user: str, count: int, at_ms: float, measured_from_ms: float) -> None:
        with self.lock:
            self.outputs += 1
            if (user, count) in self.seen:
                self.repeated += 1
            self.seen.add((user, count))
            done = self.reflected.get(user, 0)
            times = self.sent.get(user, [])
            for sent_ms in times[done:count]:
                if sent_ms >= measured_from_ms:
                    self.latencies_ms.append(at_ms - sent_ms)
            self.reflected[user] = max(done, count)

    def complete(self) -> bool:
        with self.lock:
            return all(self.reflected.get(u, 0) == len(t) for u, t in self.sent.items())


def _produce(broker: Broker, topic: str, run: SideRun, seconds: float) -> None:
    """``RATE`` records a second for ``seconds``, in 10-ms steps."""
    producer = Producer({**broker.client_config, "linger.ms": 1})
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * RATE)
        while sent < due:
            user = f"user-{sent % USERS:04d}"
            now_ms = time.time() * 1000.0
            with run.lock:
                run.sent.setdefault(user, []).append(now_ms)
            producer.produce(topic, key=user, value=json.dumps({"ms": int(now_ms)}))
            sent += 1
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(30)


def _consume(broker: Broker, topic: str, run: SideRun, measured_from_ms: list[float],
             stop: threading.Event) -> None:
    consumer = Consumer({**broker.client_config, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            message = consumer.poll(0.05)
            value = message.value() if message is not None and not message.error() else None
            if value is None:
                continue
            at_ms = time.time() * 1000.0
            row = json.loads(value)
            run.received(row["user"], int(row["count"]), at_ms, measured_from_ms[0])
    finally:
        consumer.close()


def run_side(broker: Broker, side: str, warmup_s: float, measure_s: float) -> dict[str, Any]:
    """One side's run (module docstring); its figures."""
    load = ForeignLoad(broker.pids())
    others_share = float("nan")
    input_topic = broker.create_topic(f"latency-in-{uuid.uuid4().hex[:8]}", PARTITIONS)
    output_topic = broker.create_topic(f"latency-out-{uuid.uuid4().hex[:8]}", PARTITIONS)
    run = SideRun()
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as directory:
        stop_file = os.path.join(directory, "stop")
        log = open(os.path.join(directory, "child.log"), "w+")  # noqa: SIM115 (read below)
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_latency", "--child", side,
             "--bootstrap", broker.bootstrap_servers, "--input", input_topic,
             "--output", output_topic, "--checkpoint", os.path.join(directory, "checkpoint"),
             "--stop-file", stop_file],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
            start_new_session=True)
        stop = threading.Event()
        measured_from = [float("inf")]
        consumer = threading.Thread(target=_consume,
                                    args=(broker, output_topic, run, measured_from, stop))
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if READY not in line:
                proc.wait(60)
                log.seek(0)
                raise RuntimeError(f"{side}: the query did not start:\n{log.read()[-3000:]}")
            consumer.start()
            measured_from[0] = time.time() * 1000.0 + warmup_s * 1000.0
            _produce(broker, input_topic, run, warmup_s + measure_s)
            deadline = time.monotonic() + DRAIN_S
            while not run.complete():
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"{side}: the outputs did not count every record "
                                       f"within {DRAIN_S:.0f} s:\n{log.read()[-3000:]}")
                time.sleep(0.2)
            others_share = load.share()  # while the child runs (its CPU is ours)
        finally:
            stop.set()
            if consumer.is_alive():
                consumer.join(30)
            Path(stop_file).touch()
            try:
                rest, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rest, _ = proc.communicate()
            log.close()
    phases: dict[str, float] = next((json.loads(line[len(PHASES):])
                                     for line in (rest or "").splitlines()
                                     if line.startswith(PHASES)), {})
    latencies = run.latencies_ms
    produced = sum(len(t) for t in run.sent.values())
    return {"side": side, "label": LABELS[side], "records": produced,
            "measured_records": len(latencies), "outputs": run.outputs,
            "repeated_outputs": run.repeated,
            "final_counts_exact": run.complete(),
            "p50_ms": round(percentile(latencies, 50), 1),
            "p99_ms": round(percentile(latencies, 99), 1),
            "max_ms": round(max(latencies), 1) if latencies else None,
            "others_cpu_share": round(others_share, 3),
            "batch_phases_median_ms": phases}


def run(args: argparse.Namespace) -> dict[str, Any]:
    warmup_s = args.warmup if args.warmup is not None else scaled(WARMUP_S, 10)
    measure_s = args.measure if args.measure is not None else scaled(MEASURE_S, 10)
    sides = []
    with kafka_broker() as broker:
        for side in args.sides.split(","):
            wait_for_quiet(broker.pids(), label=f"latency {side}")
            figures = run_side(broker, side, warmup_s, measure_s)
            sides.append(figures)
            print(report_side(figures), flush=True)
    by_side = {s["side"]: s for s in sides}
    results: dict[str, Any] = {
        "benchmark": "latency", "rate_per_s": RATE, "users": USERS, "trigger": TRIGGER,
        "warmup_s": warmup_s, "measure_s": measure_s, "sides": sides,
        "machine": machine_info()}
    if {"ours", "spark_transform_with_state"} <= by_side.keys():
        ours, spark = by_side["ours"], by_side["spark_transform_with_state"]
        exact = ours["final_counts_exact"] and spark["final_counts_exact"] and (
            ours["repeated_outputs"] == 0)
        results["p99_ratio"] = round(ours["p99_ms"] / spark["p99_ms"], 3)
        results["result"] = ("WRONG" if not exact else
                             "PASS" if ours["p99_ms"] <= spark["p99_ms"] else "MISS")
    return results


def report_side(side: dict[str, Any]) -> str:
    return (f"  {side['label']}: p50 {side['p50_ms']:.0f} ms, p99 {side['p99_ms']:.0f} ms, "
            f"max {side['max_ms']:.0f} ms over {side['measured_records']:,} records; "
            f"{side['outputs']:,} outputs, {side['repeated_outputs']} repeated; final counts "
            f"{'exact' if side['final_counts_exact'] else 'WRONG'}")


def report(results: dict[str, Any]) -> str:
    rows = [[s["label"], f"{s['p50_ms']:.0f}", f"{s['p99_ms']:.0f}", f"{s['max_ms']:.0f}",
             f"{s['repeated_outputs']}", "yes" if s["final_counts_exact"] else "NO"]
            for s in results["sides"]]
    text = table(["side", "p50 ms", "p99 ms", "max ms", "repeated outputs", "exact"], rows)
    if "result" in results:
        text += (f"\nour p99 / Spark's: {results['p99_ratio']:.2f}x (target <= 1x): "
                 f"{results['result']}")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--warmup", type=float, default=None, help="seconds (default scaled)")
    parser.add_argument("--measure", type=float, default=None, help="seconds (default scaled)")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    for name in ("--bootstrap", "--input", "--output", "--checkpoint", "--stop-file"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.bootstrap, args.input, args.output, args.checkpoint,
                     args.stop_file)
    results = run(args)
    print(report(results))
    write_json(args.json, results)
    return 0 if results.get("result") != "WRONG" else 1


if __name__ == "__main__":
    sys.exit(main())
