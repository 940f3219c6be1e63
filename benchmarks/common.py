"""Helpers shared by the benchmarks: broker, scale, payloads, statistics, machine facts."""

from __future__ import annotations

import datetime
import gc
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import psutil
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_changelog.kafka import KafkaChangelogConfig
from kafka_changelog.local_kafka.broker import LocalKafkaCluster
from kafka_changelog.local_kafka.jars import KAFKA_VERSION

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

SCALE_ENV = "BENCH_SCALE"
EXTERNAL_ENV = "KAFKA_BOOTSTRAP_SERVERS"
QUIET_WAIT_ENV = "BENCH_QUIET_WAIT_S"
QUIET_SHARE_ENV = "BENCH_QUIET_SHARE"

#: Key groups in all (max parallelism) and partitions of every benchmark topic.
MAX_PARALLELISM = 128
PARTITIONS = 16

MB = 1_000_000  # throughput figures: 10^6 payload bytes
MiB = 1024 * 1024  # memory figures


def scale() -> float:
    """``BENCH_SCALE`` (default 1.0): multiplies every duration and data volume."""
    raw = os.environ.get(SCALE_ENV, "1.0")
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{SCALE_ENV} must be a number, got {raw!r}") from None
    if value <= 0:
        raise SystemExit(f"{SCALE_ENV} must be > 0, got {value}")
    return value


def scaled(amount: float, minimum: float = 1.0) -> float:
    """``amount * BENCH_SCALE``, at least ``minimum``."""
    return max(minimum, amount * scale())


def payloads(size: int, count: int = MAX_PARALLELISM, seed: int = 7) -> list[bytes]:
    """``count`` distinct random (so incompressible) payloads of ``size`` bytes."""
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def unique_topic(name: str) -> str:
    """A fresh topic name, so runs never share (or inherit) a topic."""
    return f"bench-{name}-{uuid.uuid4().hex[:8]}"


#: ``linger.ms`` of the raw producer baselines (see :meth:`Broker.raw_producer_settings`).
RAW_LINGER_MS = 5.0


@dataclass
class Broker:
    """Where the benchmarks connect: a local single-node cluster or an external broker."""

    bootstrap_servers: str
    client_config: dict[str, Any]
    cluster: LocalKafkaCluster | None
    kafka_version: str
    topics: list[str] = field(default_factory=list)

    @property
    def external(self) -> bool:
        return self.cluster is None

    def pids(self) -> list[int]:
        """Process ids of the local broker's JVMs (none for an external broker)."""
        return self.cluster.pids() if self.cluster is not None else []

    def admin(self) -> AdminClient:
        return AdminClient(dict(self.client_config))

    def create_topic(self, name: str, partitions: int = PARTITIONS) -> str:
        """Create ``name`` with the settings the changelog storage uses (delete, keep forever)."""
        admin = self.admin()
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=-1,
            config={"cleanup.policy": "delete", "retention.ms": "-1"},
        )
        admin.create_topics([topic], request_timeout=30)[name].result(timeout=30)
        self.topics.append(name)
        return name

    def changelog_config(self, topic: str, **fields: Any) -> KafkaChangelogConfig:
        """A storage config for ``topic`` on this broker (``fields`` override defaults):
        the library's producer settings, lz4 and the benchmarks' partitions."""
        self.topics.append(topic)
        return self._config(topic, **fields)

    def _config(self, topic: str, **fields: Any) -> KafkaChangelogConfig:
        settings: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "topic": topic,
            "partitions": PARTITIONS,
            "max_parallelism": MAX_PARALLELISM,
            "compression": "lz4",
            "client_config": dict(self.client_config),
        }
        settings.update(fields)
        return KafkaChangelogConfig(**settings)

    def raw_producer_settings(self, topic: str) -> dict[str, Any]:
        """librdkafka settings of a raw producer baseline for ``topic``: the storage's
        (``acks=all``, idempotence, lz4, record sizes) with ``linger.ms`` at
        ``RAW_LINGER_MS``, the raw producer's best: it sends one record per change, so
        it needs the linger to batch them (the storage's records are batches already)."""
        return {**self._config(topic).producer(), "linger.ms": RAW_LINGER_MS}

    def record_count(self, topic: str) -> int:
        """Sum of the high watermarks of ``topic`` (records ever written to it)."""
        consumer = Consumer(
            {**self.client_config, "group.id": f"bench-{uuid.uuid4().hex[:8]}"}
        )
        try:
            metadata = consumer.list_topics(topic, timeout=30)
            partitions = metadata.topics[topic].partitions
            total = 0
            for partition in partitions:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=30
                )
                total += high
            return total
        finally:
            consumer.close()

    def delete_topic(self, name: str) -> None:
        """Delete ``name`` now (frees the broker's disk between large runs)."""
        admin = self.admin()  # keep the client alive until the answer arrives
        admin.delete_topics([name], operation_timeout=30)[name].result(timeout=60)
        self.topics = [t for t in self.topics if t != name]

    def cleanup(self) -> None:
        """Delete this run's topics from an external broker (a local one is thrown away)."""
        if not self.external or not self.topics:
            return
        admin = self.admin()
        for name, future in admin.delete_topics(sorted(set(self.topics))).items():
            try:
                future.result(timeout=30)
            except Exception as exc:  # best effort: the topic may never have been created
                print(f"  (could not delete topic {name}: {exc})", file=sys.stderr)


@contextmanager
def kafka_broker() -> Iterator[Broker]:
    """A fresh local single-node KRaft broker, or the one named by ``KAFKA_BOOTSTRAP_SERVERS``."""
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        broker = Broker(external, {"bootstrap.servers": external}, None, "external (unknown)")
        try:
            yield broker
        finally:
            broker.cleanup()
        return
    with LocalKafkaCluster(nodes=1) as cluster:
        try:
            yield Broker(
                cluster.bootstrap_servers, cluster.client_config(), cluster, KAFKA_VERSION
            )
        finally:
            # Storages hold their producer in reference cycles: free the clients before
            # the broker goes away, or librdkafka logs the disconnects.
            gc.collect()


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine spent busy (steal included) since boot."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0))


def _descendants() -> list[int]:
    """This process's children, grandchildren and so on, alive now."""
    try:
        return [child.pid for child in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []


def _own_cpu_s(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class ForeignLoad:
    """CPU used by anything but this process and ``own_pids`` (e.g. our broker) since
    creation, as a share of the whole machine: 0.5 = one of two cores busy elsewhere.

    On a shared 2-core machine this is what makes a measurement suspect.
    """

    def __init__(self, own_pids: Sequence[int] = ()) -> None:
        self._pids = sorted({os.getpid(), *own_pids, *_descendants()})
        self._wall = time.monotonic()
        self._busy = _busy_cpu_s()
        self._own = _own_cpu_s(self._pids)

    def share(self) -> float:
        wall = time.monotonic() - self._wall
        if wall <= 0:
            return 0.0
        # Processes of ours started since (Spark's Python workers, executors) count as
        # ours with all their CPU time.
        started = sorted(set(_descendants()) - set(self._pids))
        own = _own_cpu_s(self._pids) - self._own + _own_cpu_s(started)
        foreign = (_busy_cpu_s() - self._busy) - own
        return max(0.0, foreign / (wall * (os.cpu_count() or 1)))


def wait_for_quiet(own_pids: Sequence[int] = (), label: str = "") -> dict[str, float]:
    """Wait until other processes use less than ``BENCH_QUIET_SHARE`` (default 0.15) of the
    machine over a 2-s window, for at most ``BENCH_QUIET_WAIT_S`` s (default 120; 0: never
    wait). Returns the time waited and the last share seen."""
    limit = float(os.environ.get(QUIET_WAIT_ENV, "120"))
    threshold = float(os.environ.get(QUIET_SHARE_ENV, "0.15"))
    start = time.monotonic()
    announced = False
    while True:
        probe = ForeignLoad(own_pids)
        time.sleep(2.0)
        share = probe.share()
        waited = time.monotonic() - start
        if share < threshold or waited >= limit:
            break
        if not announced:
            print(f"  {label}other processes use {share:.0%} of the CPUs: waiting up to "
                  f"{limit:.0f} s for them to finish", flush=True)
            announced = True
    if announced:
        state = "quiet" if share < threshold else "still busy, measuring anyway"
        print(f"  {label}{state} after {waited:.0f} s (others at {share:.0%})", flush=True)
    return {"waited_s": round(waited, 1), "foreign_share_before": round(share, 3)}


#: Seconds a raw baseline consumer waits for the next record before it gives up.
RAW_READ_TIMEOUT_S = 60.0


def raw_read(consumer: Consumer, topic: str,
             spans: dict[int, tuple[int, int, set[int] | None]]) -> tuple[int, int]:
    """The raw-consumer baseline of the read benchmarks: records and value bytes of
    ``topic``'s offsets ``[start, end)`` per partition (only the offsets in ``wanted`` when
    given: ``spans[partition] = (start, end, wanted)``), every partition assigned at once
    as the library's reader assigns them, batches of up to 1,000 records."""
    records = value_bytes = 0
    ends = {p: end for p, (start, end, _) in spans.items() if end > start}
    positions = {p: start for p, (start, end, _) in spans.items() if end > start}
    consumer.assign([TopicPartition(topic, p, at) for p, at in positions.items()])
    deadline = time.monotonic() + RAW_READ_TIMEOUT_S
    while positions:
        left = sum(ends[p] - at for p, at in positions.items())
        messages = consumer.consume(min(1000, left), timeout=0.005)
        if not messages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw consumer: timed out in {topic} at {positions}")
            continue
        deadline = time.monotonic() + RAW_READ_TIMEOUT_S
        for message in messages:
            partition = message.partition() or 0
            if partition not in positions:
                continue
            wanted = spans[partition][2]
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                position = max(positions[partition], message.offset() or 0)
            else:
                offset = message.offset() or 0
                position = offset + 1 if offset < ends[partition] else offset
                if offset < ends[partition] and (wanted is None or offset in wanted):
                    records += 1
                    value_bytes += len(message.value() or b"")
            if position >= ends[partition]:
                del positions[partition]
            else:
                positions[partition] = position
    consumer.unassign()
    return records, value_bytes


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p99/p99.9/max/mean of latencies, in milliseconds."""
    ms = [s * 1000.0 for s in seconds]
    return {
        "samples": float(len(ms)),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "p99_9_ms": percentile(ms, 99.9),
        "max_ms": max(ms) if ms else float("nan"),
        "mean_ms": sum(ms) / len(ms) if ms else float("nan"),
    }


def ratio_text(ratio: float) -> str:
    """``0.899x``: truncated, never rounded up, so a miss never prints as the target."""
    return f"{math.floor(ratio * 1000) / 1000:.3f}x"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with right-aligned columns (the first left-aligned)."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for row in handle:
                if row.startswith("model name"):
                    return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args],
        capture_output=True, text=True, timeout=10, check=False,
    )
    return out.stdout.strip()


def _git_commit() -> str:
    """The commit measured (``+dirty``: tracked files of kafka_changelog/ were changed)."""
    try:
        commit = _git("rev-parse", "--short", "HEAD") or "unknown"
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "kafka_changelog")
    except OSError:
        return "unknown"
    return f"{commit}+dirty" if dirty else commit


def _version(found: object) -> str:
    """confluent-kafka's ``version()`` is a string in some releases, a tuple in others."""
    return str(found[0]) if isinstance(found, tuple) else str(found)


def machine_info() -> dict[str, Any]:
    """Facts that make the figures comparable: CPUs, memory, versions, date, load."""
    external = os.environ.get(EXTERNAL_ENV)
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "confluent_kafka": _version(confluent_kafka.version()),
        "librdkafka": _version(confluent_kafka.libversion()),
        "kafka": "external (unknown)" if external else f"{KAFKA_VERSION} (local KRaft, 1 node)",
        "broker": external or "local LocalKafkaCluster(nodes=1), 127.0.0.1",
        "bench_scale": scale(),
        "git_commit": _git_commit(),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")

