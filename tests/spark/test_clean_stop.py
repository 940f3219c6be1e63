"""A stop is a stop: after ``query.stop()`` and ``processor.close()`` nothing of the
application runs or writes, in the driver process or in Spark's Python workers, and a
query with ticks stopped mid-batch ends without an error in the query or the JVM."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_changelog.kafka.checkpoint_store import KafkaCheckpointView
from kafka_changelog.kafka.live_clients import live_clients
from kafka_changelog.state.history.rewind import check_not_held
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64
from spark_integration.streaming import (
    BatchEvent,
    StreamingStateConfig,
    stateful_foreach_batch,
    with_ticks,
)

pytestmark = [pytest.mark.spark, pytest.mark.broker]

COUNT = value_state("count", INT64)


def count(key: Any, rows: pd.DataFrame, state: Any) -> list[dict[str, Any]]:
    seen = state(COUNT)
    seen.update((seen.value() or 0) + len(rows))
    return [{"user": key, "count": seen.value()}]


def _threads(pid: int | str) -> list[str]:
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # ended meanwhile
            names.append(Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
    return names


def _kafka_clients_of(pid: int | str) -> int:
    """librdkafka clients of a process: each has one ``rdk:main`` thread."""
    return sum(1 for name in _threads(pid) if name == "rdk:main")


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found.append((child, command))
        todo.extend(children.get(child, []))
    return found


def _python_workers() -> list[int]:
    return [pid for pid, command in _descendants(os.getpid())
            if "pyspark" in command and "java" not in command.split()[0]]


def _end_offsets(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "clean-stop-test",
                         "enable.auto.commit": False})
    try:
        ends = {}
        for topic in topics:
            metadata = consumer.list_topics(topic, timeout=30).topics[topic]
            for partition in metadata.partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                         timeout=30)
                ends[(topic, partition)] = high
        return ends
    finally:
        consumer.close()


def _config(cluster: Any, prefix: str) -> StreamingStateConfig:
    return StreamingStateConfig(
        application=prefix, operator_id="op", bootstrap_servers=cluster.bootstrap_servers,
        parallelism=2, changelog_topic=f"{prefix}-changelog",
        snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
        partitions=2, materialization_interval_s=0.5, driver_lease_s=8.0)


def _jvm_stderr_to(spark: Any, path: Path) -> Any:
    """Send the JVM's ``System.err`` (where an uncaught error of a thread is printed) to
    ``path``; returns the stream to restore."""
    jvm = spark.sparkContext._jvm
    before = jvm.java.lang.System.err
    jvm.java.lang.System.setErr(jvm.java.io.PrintStream(
        jvm.java.io.FileOutputStream(str(path)), True))
    return before


def test_close_after_stopping_ticking_queries_leaves_nothing_running(
    spark: Any, kafka_cluster: Any, tmp_path: Path
) -> None:
    """Three ticking queries one after another, each stopped while a batch runs, then
    closed: no query error, no uncaught JVM error (Spark's interruption check once died
    of a StackOverflowError on a long traceback), and afterwards no Kafka client, thread
    or materialization process of the library in the driver or the Python workers, and
    no record written to the application's topics."""
    # Workers left by other tests (with their applications' clients) are not this one's.
    baseline_clients = {c.number for c in live_clients()}
    baseline_rdk = _kafka_clients_of("self")
    baseline_threads = set(threading.enumerate())  # other tests' storages still open
    jvm_err = tmp_path / "jvm-stderr.log"
    restore = _jvm_stderr_to(spark, jvm_err)
    topics: list[str] = []
    configs: list[StreamingStateConfig] = []
    try:
        for run in range(3):
            prefix = f"stop-{uuid.uuid4().hex[:8]}"
            config = _config(kafka_cluster, prefix)
            configs.append(config)
            topics += [config.changelog_topic, config.snapshot_topic, config.checkpoint_topic]
            source = tmp_path / f"input-{run}"
            source.mkdir()
            (source / "0.json").write_text('{"user": "a"}\n{"user": "b"}\n')
            batch_started = threading.Event()

            def listener(event: BatchEvent, batch_id: int,
                         started: threading.Event = batch_started) -> None:
                if event is BatchEvent.BATCH_START and batch_id >= 2:
                    started.set()

            processor = stateful_foreach_batch(config, count, "user", "user string, count long",
                                               listener=listener)
            stream = with_ticks(spark.readStream.schema("user string").json(str(source)))
            query = (stream.writeStream.foreachBatch(processor)
                     .option("checkpointLocation", str(tmp_path / f"checkpoint-{run}"))
                     .trigger(processingTime="500 milliseconds").start())
            try:
                deadline = time.monotonic() + 180
                while not batch_started.wait(0.2):
                    assert query.exception() is None, query.exception()
                    assert time.monotonic() < deadline, "no third batch within 180 s"
                time.sleep(0.2 * run)  # at the batch's start, and into it
            finally:
                query.stop()
            assert query.exception() is None, query.exception()
            workers = _python_workers()
            started = time.monotonic()
            processor.close()
            took = time.monotonic() - started
            assert took < 60, f"close took {took:.0f} s with nothing left to write"
    finally:
        spark.sparkContext._jvm.java.lang.System.setErr(restore)
    logged = jvm_err.read_text()
    assert "StackOverflowError" not in logged, logged[:3000]
    assert "Exception in thread" not in logged, logged[:3000]

    # The driver process: no client of the library left, nor librdkafka's threads, nor
    # a thread of the library.
    assert [(c.kind.value, c.purpose) for c in live_clients()
            if c.number not in baseline_clients] == []
    assert _kafka_clients_of("self") <= baseline_rdk
    assert [t.name for t in threading.enumerate() if t.name.startswith("kafka-changelog")
            and t not in baseline_threads] == []
    # The Python workers that ran the tasks: no Kafka client, and no materialization
    # process below any of them.
    assert workers, "the tasks ran in no Python worker of this session"
    assert {pid: _kafka_clients_of(pid) for pid in _python_workers()
            if Path(f"/proc/{pid}").exists() and _kafka_clients_of(pid)} == {}
    assert [c for _, c in _descendants(os.getpid()) if "job_process" in c] == []
    # Nothing is written to the applications' topics any more.
    ends = _end_offsets(kafka_cluster.bootstrap_servers, topics)
    time.sleep(5)
    assert _end_offsets(kafka_cluster.bootstrap_servers, topics) == ends
    # fork, reset and rewind see a quiet application: no driver holds it any more.
    for config in configs:
        with KafkaCheckpointView(config.checkpoints()) as view:
            check_not_held(view, config.application)
