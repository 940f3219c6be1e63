"""Applications with known state on real Kafka topics, for the command-line tests.

:class:`Deployment` is one application's process (its own clients and stores);
:func:`run_round` makes one checkpoint of the toy application below and keeps a
model of what every key's state must be, as stored bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from kafka_changelog import KeyGroupRange, key_group_for_key, key_group_range_for_operator
from kafka_changelog.kafka import (
    CheckpointStoreConfig,
    KafkaChangelogConfig,
    KafkaChangelogStorage,
    KafkaCheckpointStore,
    KafkaSnapshotStore,
    SnapshotStoreConfig,
)
from kafka_changelog.keys import encode_key
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.checkpoints.checkpoint import CompletedCheckpoint, SubtaskState
from kafka_changelog.state.history.coordinator import CheckpointCoordinator
from kafka_changelog.state.schema.descriptors import list_state, map_state, value_state
from kafka_changelog.state.schema.serializers import BYTES, FLOAT64, INT64, JSON, UTF8

MAX_P = 128

COUNT = value_state("count", INT64)
NAME = value_state("name", UTF8)
SCORE = value_state("score", FLOAT64)
TAGS = list_state("tags", UTF8)
PAGES = map_state("pages", UTF8, INT64)
PROFILE = value_state("profile", JSON)
BLOB = value_state("blob", BYTES)
VISITS = value_state("visits", INT64)
LABEL = value_state("label", UTF8)

#: Stored state of one operator: key -> state name -> bytes | [bytes] | {bytes: bytes}.
Model = dict[bytes, dict[str, Any]]


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``kafka-changelog`` in a fresh interpreter, as a user would."""
    return subprocess.run([sys.executable, "-m", "kafka_changelog.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


def cli_json(*args: str) -> Any:
    """Run a command with ``--json``; its output, after checking it succeeded."""
    result = cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@dataclass(frozen=True)
class Topics:
    """The three topics applications share."""

    changelog: str
    snapshot: str
    checkpoint: str

    @classmethod
    def fresh(cls) -> Topics:
        """Names nobody used before."""
        prefix = f"cli-{uuid.uuid4().hex[:8]}"
        return cls(f"{prefix}-log", f"{prefix}-snap", f"{prefix}-cp")

    def cli_args(self, cluster: Any) -> list[str]:
        """``-b``, ``-X`` and the topic options for ``cluster``."""
        settings = dict(cluster.client_config())
        args = ["-b", settings.pop("bootstrap.servers")]
        for key, value in settings.items():
            args += ["-X", f"{key}={value}"]
        return [*args, "--changelog-topic", self.changelog, "--snapshot-topic", self.snapshot,
                "--checkpoint-topic", self.checkpoint]

    def all(self) -> list[str]:
        """The three names."""
        return [self.changelog, self.snapshot, self.checkpoint]


def ranges(parallelism: int) -> list[KeyGroupRange]:
    """The key-group ranges of ``parallelism`` subtasks."""
    return [key_group_range_for_operator(MAX_P, parallelism, i) for i in range(parallelism)]


def kg(key: bytes) -> int:
    """The key group of ``key``."""
    return key_group_for_key(key, MAX_P)


#: What one round does to one subtask's keys: (backend, its key groups, round, model).
Work = Callable[[ChangelogKeyedStateBackend, KeyGroupRange, int, Model], None]


@dataclass
class Operator:
    """One operator of an application: parallelism, work per round, and its model."""

    parallelism: int
    work: Work
    model: Model = field(default_factory=dict)


class Deployment:
    """One application's process: own clients, stores and coordinator."""

    def __init__(self, cluster: Any, name: str, topics: Topics) -> None:
        settings = dict(cluster.client_config())
        servers = settings.pop("bootstrap.servers")
        self.name = name
        self.changelog = KafkaChangelogConfig(
            bootstrap_servers=servers, client_config=settings, topic=topics.changelog,
            partitions=2, max_parallelism=MAX_P)
        self.storage = KafkaChangelogStorage(self.changelog)
        self.snapshots = KafkaSnapshotStore(SnapshotStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=topics.snapshot,
            partitions=2, max_parallelism=MAX_P))
        self.checkpoints = KafkaCheckpointStore(CheckpointStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=topics.checkpoint))
        self.coordinator = CheckpointCoordinator(
            name, self.checkpoints, self.snapshots, self.storage, MAX_P)

    def run_round(self, checkpoint_id: int, operators: dict[str, Operator], round_: int,
                  timestamp_ms: int, materialize: bool,
                  properties: dict[str, str] | None = None) -> CompletedCheckpoint:
        """Restore the latest checkpoint, do the round's work, commit ``checkpoint_id``."""
        latest = self.coordinator.checkpoint()
        backends, subtasks = [], []
        for operator_id, operator in operators.items():
            for index, key_groups in enumerate(ranges(operator.parallelism)):
                backend = self.coordinator.restore_keyed(operator_id, key_groups, latest,
                                                         self.changelog)
                operator.work(backend, key_groups, round_, operator.model)
                if materialize:
                    backend.materialize_now()
                handle = backend.snapshot(checkpoint_id).result(60)
                subtasks.append(SubtaskState(operator_id, index, operator.parallelism, handle,
                                             None))
                backends.append(backend)
        checkpoint = self.coordinator.complete(checkpoint_id, subtasks, timestamp_ms,
                                               properties=properties)
        for backend in backends:
            backend.notify_checkpoint_complete(checkpoint_id)
            backend.close()
        return checkpoint

    def close(self) -> None:
        self.storage.close()
        self.snapshots.close()
        self.checkpoints.close()


# -- the toy application ------------------------------------------------------------------


def users(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


def clicks_work(prefix: str, count: int) -> Work:
    """Every state kind and serializer, per user ``{prefix}-{i}``; in round 2 the count of
    the last user is cleared."""

    def work(backend: ChangelogKeyedStateBackend, key_groups: KeyGroupRange, round_: int,
             model: Model) -> None:
        for i, user in enumerate(users(prefix, count)):
            if not key_groups.contains(kg(user)):
                continue
            backend.set_current_key(user)
            stored = model.setdefault(user, {})
            if round_ == 2 and i == count - 1:
                backend.state(COUNT).clear()
                stored.pop("count", None)
            else:
                backend.state(COUNT).update(round_ * 10 + i)
                stored["count"] = INT64.serialize(round_ * 10 + i)
            if round_ == 1:
                backend.state(NAME).update(f"name-{i}")
                stored["name"] = UTF8.serialize(f"name-{i}")
                backend.state(BLOB).update(b"\x00\xff" + bytes([i]))
                stored["blob"] = b"\x00\xff" + bytes([i])
            backend.state(SCORE).update(i + round_ / 4)
            stored["score"] = FLOAT64.serialize(i + round_ / 4)
            backend.state(TAGS).add(f"r{round_}")
            stored.setdefault("tags", []).append(UTF8.serialize(f"r{round_}"))
            pages = backend.state(PAGES)
            pages.put("home", round_)
            pages.put(f"p{i}", i)
            stored.setdefault("pages", {}).update({b"home": INT64.serialize(round_),
                                                   f"p{i}".encode(): INT64.serialize(i)})
            backend.state(PROFILE).update({"i": i, "round": round_})
            stored["profile"] = JSON.serialize({"i": i, "round": round_})

    return work


def region_key(region: str, number: int) -> bytes:
    return encode_key([region, number], ["string", "bigint"])


def regions_work(count: int) -> Work:
    """Composite keys (string, bigint): visits = number * 100 + round."""

    def work(backend: ChangelogKeyedStateBackend, key_groups: KeyGroupRange, round_: int,
             model: Model) -> None:
        for i in range(count):
            key = region_key("eu", i)
            if key_groups.contains(kg(key)):
                backend.set_current_key(key)
                backend.state(VISITS).update(i * 100 + round_)
                model.setdefault(key, {})["visits"] = INT64.serialize(i * 100 + round_)

    return work


def id_key(number: int) -> bytes:
    return encode_key([number], ["bigint"])


def ids_work(count: int) -> Work:
    """bigint keys: label = id-{number}."""

    def work(backend: ChangelogKeyedStateBackend, key_groups: KeyGroupRange, round_: int,
             model: Model) -> None:
        for i in range(count):
            key = id_key(i)
            if key_groups.contains(kg(key)):
                backend.set_current_key(key)
                backend.state(LABEL).update(f"id-{i}")
                model.setdefault(key, {})["label"] = UTF8.serialize(f"id-{i}")

    return work


def entry_bytes(key: bytes, entry: Any) -> int:
    """Key plus stored value bytes of one (state, key) entry."""
    if isinstance(entry, bytes):
        return len(key) + len(entry)
    if isinstance(entry, list):
        return len(key) + sum(len(v) for v in entry)
    return len(key) + sum(len(k) + len(v) for k, v in entry.items())


def expected_sizes(model: Model, key_groups: KeyGroupRange) -> dict[str, int]:
    """Keys, entries and state bytes of the model's keys in ``key_groups``."""
    keys = [k for k in model if key_groups.contains(kg(k)) and model[k]]
    return {"keys": len(keys), "entries": sum(len(model[k]) for k in keys),
            "state_bytes": sum(entry_bytes(k, e) for k in keys for e in model[k].values())}


def end_offsets(cluster: Any, topics: list[str]) -> dict[tuple[str, int], tuple[int, int]]:
    """(log start, end) of every partition of ``topics``."""
    consumer = Consumer({**cluster.client_config(), "group.id": "cli-tests"})
    try:
        metadata = consumer.list_topics(timeout=10)
        found = {}
        for topic in topics:
            for partition in metadata.topics[topic].partitions:
                found[(topic, partition)] = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10, cached=False)
        return found
    finally:
        consumer.close()


def last_records(cluster: Any, topic: str) -> dict[bytes, bytes | None]:
    """The newest value (None: a tombstone) of every key in ``topic``."""
    consumer = Consumer({**cluster.client_config(), "group.id": "cli-tests",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        latest: dict[bytes, bytes | None] = {}
        done: set[int] = set()
        while len(done) < len(partitions):
            for message in consumer.consume(500, timeout=2):
                if message.error() is not None:
                    done.add(message.partition())
                    continue
                latest[message.key()] = message.value()
        return latest
    finally:
        consumer.close()


def stored_checkpoints(cluster: Any, topics: Topics, application: str
                       ) -> list[CompletedCheckpoint]:
    """The application's stored checkpoints, read with the library's store."""
    settings = dict(cluster.client_config())
    servers = settings.pop("bootstrap.servers")
    with KafkaCheckpointStore(CheckpointStoreConfig(
            bootstrap_servers=servers, client_config=settings, topic=topics.checkpoint)) as store:
        return [store.get(application, i) for i in store.checkpoint_ids(application)]


def chunk_keys(checkpoints: list[CompletedCheckpoint]) -> set[bytes]:
    """Record keys of every snapshot chunk the checkpoints refer to."""
    return {c.record_key(s.keyed.snapshot.backend_id).encode()
            for cp in checkpoints for s in cp.subtasks
            if s.keyed is not None and s.keyed.snapshot is not None
            for c in s.keyed.snapshot.chunks}

