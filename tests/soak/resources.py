"""The resources of a soak, measured on this machine: topic sizes on the brokers' disks
and in records, host-local state directories, and the memory and file descriptors of
the driver and of the Python workers."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError

from kafka_changelog.kafka.consume import consume_range, end_of_partition
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.worker_resources import WorkerResources
from tests.spark.jobs import record_count, watermarks
from tests.spark.standalone import LocalSparkCluster, descendants

from .processes import open_fds, python_workers, rss_kib


def directory_bytes(root: Path) -> int:
    """Bytes the files below ``root`` take on disk (as ``du``: Kafka's preallocated, sparse
    index files count what they use, not their length; 0 if ``root`` does not exist)."""
    total = 0
    for path in root.rglob("*") if root.exists() else []:
        try:
            if path.is_file():
                total += path.stat().st_blocks * 512
        except OSError:
            continue  # removed meanwhile
    return total


def topic_disk_bytes(cluster: LocalKafkaCluster, topic: str) -> int:
    """Bytes of ``topic``'s partition directories on every node (all replicas)."""
    pattern = re.compile(re.escape(topic) + r"-\d+")
    return sum(directory_bytes(partition)
               for data in cluster.root_dir.glob("node-*/data")
               for partition in data.iterdir() if pattern.fullmatch(partition.name))


def live_keys(client_config: dict[str, Any], topic: str, timeout_s: float = 60
              ) -> set[bytes | None]:
    """Keys of the compacted ``topic`` whose latest committed record is not a tombstone:
    what compaction keeps once it has cleaned every segment. (Offsets between log start
    and end only grow on a compacted topic: compaction removes records inside the log
    and never moves its start.)"""
    consumer = Consumer({**client_config, "group.id": "soak-live-keys",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    live: set[tuple[int, bytes | None]] = set()
    try:
        for partition, (low, high) in watermarks(client_config, topic).items():
            def at_end(error: KafkaError, position: int, high: int = high) -> int:
                # The end of what is committed: an open transaction's records are not
                # live (yet), so the count stops before them.
                if end_of_partition(error):
                    return high
                raise AssertionError(f"reading {topic} at offset {position}: {error}")

            for message in consume_range(consumer, topic, partition, low, high, timeout_s,
                                         at_end):
                key = (partition, message.key())
                if message.value() is None:
                    live.discard(key)
                else:
                    live.add(key)
    finally:
        consumer.close()
    return {key for _, key in live}


def referenced_chunk_keys(config: StreamingStateConfig) -> set[bytes | None]:
    """Record keys of the snapshot chunks that some stored checkpoint (of any application
    on the checkpoint topic) names."""
    checkpoints = WorkerResources.coordinator(config).checkpoints.all_checkpoints()
    return {chunk.record_key(subtask.keyed.snapshot.backend_id).encode()
            for checkpoint in checkpoints for subtask in checkpoint.subtasks
            if subtask.keyed is not None and subtask.keyed.snapshot is not None
            for chunk in subtask.keyed.snapshot.chunks}


@dataclass(frozen=True)
class Figures:
    """The resources at one moment of a soak."""

    #: The application's latest checkpoint id then.
    batch: int
    changelog_disk_bytes: int
    changelog_records: int
    snapshot_disk_bytes: int
    #: Live keys (see :func:`live_keys`): the snapshot chunks retained checkpoints name.
    snapshot_live_keys: int
    #: Of those, the chunks no stored checkpoint names (a materialization in flight, or
    #: one that was never handed out: what no garbage collection of checkpoints removes).
    snapshot_unreferenced_keys: int
    checkpoint_disk_bytes: int
    #: Live keys: retained checkpoints, guards, pointers, claims of every application.
    checkpoint_live_keys: int
    local_state_bytes: int
    #: The driver: the job's Python process and its JVM.
    driver_rss_kib: int
    driver_fds: int
    python_workers: int
    #: The largest Python worker.
    python_worker_rss_kib: int
    python_worker_fds: int
    #: ``len(processor.reports)`` in the driver (-1: unknown).
    reports: int

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON-compatible values."""
        return asdict(self)


def measure(batch: int, kafka: LocalKafkaCluster, spark: LocalSparkCluster,
            config: StreamingStateConfig, local_state: Path, driver_pid: int | None,
            status_file: Path) -> Figures:
    """Every figure now (``driver_pid`` None: no driver is running)."""
    settings = kafka.client_config()
    driver = [driver_pid, *descendants(driver_pid)] if driver_pid is not None else []
    workers = python_workers(spark)
    try:
        reports = int(json.loads(status_file.read_text())["reports"])
    except (OSError, ValueError, KeyError):
        reports = -1
    chunks = live_keys(settings, config.snapshot_topic)
    return Figures(
        batch=batch,
        changelog_disk_bytes=topic_disk_bytes(kafka, config.changelog_topic),
        changelog_records=record_count(settings, config.changelog_topic),
        snapshot_disk_bytes=topic_disk_bytes(kafka, config.snapshot_topic),
        snapshot_live_keys=len(chunks),
        snapshot_unreferenced_keys=len(chunks - referenced_chunk_keys(config)),
        checkpoint_disk_bytes=topic_disk_bytes(kafka, config.checkpoint_topic),
        checkpoint_live_keys=len(live_keys(settings, config.checkpoint_topic)),
        local_state_bytes=directory_bytes(local_state),
        driver_rss_kib=sum(rss_kib(pid) for pid in driver),
        driver_fds=sum(open_fds(pid) for pid in driver),
        python_workers=len(workers),
        python_worker_rss_kib=max((rss_kib(pid) for pid in workers), default=0),
        python_worker_fds=max((open_fds(pid) for pid in workers), default=0),
        reports=reports)


class Verdict(Enum):
    """Whether a resource stayed flat."""

    FLAT = "flat"
    MISS = "miss"
    #: A process figure taken when no such process ran (e.g. no Python worker alive).
    UNMEASURED = "unmeasured"


#: Figures of processes: 0 means no process was found, not an empty one.
PROCESS_FIGURES = ("driver_rss_kib", "driver_fds", "python_worker_rss_kib",
                   "python_worker_fds", "reports")


@dataclass(frozen=True)
class Tolerance:
    """How much a figure may grow from the first measurement to the last: at most
    ``ratio`` times plus ``slack``."""

    ratio: float
    slack: int

    def verdict(self, first: int, last: int) -> Verdict:
        """FLAT when ``last`` is within the tolerance of ``first``."""
        return Verdict.FLAT if last <= first * self.ratio + self.slack else Verdict.MISS


#: Per figure: how much it may grow. Bytes on the brokers get a segment per partition
#: replica of slack (deleted records free disk a whole segment at a time).
def tolerances(segment_bytes: int, partitions: int, replicas: int, reports_kept: int
               ) -> dict[str, Tolerance]:
    """The tolerance of each figure of :class:`Figures` (``reports`` is bounded by
    ``reports_kept``, not by its first value)."""
    segments = segment_bytes * partitions * replicas
    return {
        "changelog_disk_bytes": Tolerance(1.5, segments),
        "changelog_records": Tolerance(1.5, 1000),
        "snapshot_disk_bytes": Tolerance(1.5, segments),
        "snapshot_live_keys": Tolerance(1.5, 200),
        "snapshot_unreferenced_keys": Tolerance(1.5, 50),
        "checkpoint_disk_bytes": Tolerance(1.5, segment_bytes * replicas),
        "checkpoint_live_keys": Tolerance(1.5, 50),
        "local_state_bytes": Tolerance(1.5, 1 << 20),
        "driver_rss_kib": Tolerance(1.5, 0),
        "driver_fds": Tolerance(1.0, 50),
        "python_worker_rss_kib": Tolerance(1.5, 0),
        "python_worker_fds": Tolerance(1.0, 20),
        "reports": Tolerance(0.0, reports_kept),
    }


def verdicts(first: Figures, last: Figures, limits: dict[str, Tolerance]
             ) -> dict[str, dict[str, Any]]:
    """Per figure: its first and last value and whether it stayed within its tolerance."""
    before, after = first.to_json(), last.to_json()
    found = {}
    for name, limit in limits.items():
        verdict = limit.verdict(before[name], after[name])
        if name in PROCESS_FIGURES and min(before[name], after[name]) <= 0:
            verdict = Verdict.UNMEASURED
        found[name] = {"first": before[name], "last": after[name],
                       "tolerance": f"<= {limit.ratio} x first + {limit.slack}",
                       "verdict": verdict.value}
    return found
