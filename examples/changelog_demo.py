"""A state changelog round trip through a real Kafka broker, without Spark.

Runs a small clickstream through two writers (the in-memory reference storage
and the Kafka storage), persists checkpoints, restores from Kafka and compares
with the reference, then replays the Kafka records with kcat. Uses the broker
in ``KAFKA_BOOTSTRAP_SERVERS`` or starts a local one itself.

Run it from the repository root with ``python -m examples.changelog_demo``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kafka_changelog import (
    InMemoryChangelogStorage,
    KeyGroupRange,
    StateChange,
    key_group_for_key,
)
from kafka_changelog.kafka import (
    KafkaChangelogConfig,
    KafkaChangelogHandle,
    KafkaChangelogReader,
    KafkaChangelogStorage,
)

from .events import events

MAX_PARALLELISM = 128


def progress(message: str) -> None:
    """One line of progress, flushed at once."""
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


@contextmanager
def broker(keep: bool = False) -> Iterator[dict[str, Any]]:
    """Client settings of the configured broker, or of a local one started for the demo.

    With ``keep``, a broker the demo started keeps running after the demo until Ctrl-C
    (or SIGTERM), so that the commands it printed (kcat, kafka-changelog) can be run.
    """
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if servers:
        progress(f"using the broker at {servers} (KAFKA_BOOTSTRAP_SERVERS)")
        yield {"bootstrap.servers": servers}
        return
    from kafka_changelog.local_kafka.broker import LocalKafkaCluster

    progress("starting a local Apache Kafka broker (KRaft, jars from Maven Central) ...")
    started = time.monotonic()
    with LocalKafkaCluster(nodes=1) as cluster:
        progress(f"broker up at {cluster.bootstrap_servers} in "
                 f"{time.monotonic() - started:.1f} s")
        yield cluster.client_config()
        if keep:
            _wait_for_stop(cluster.bootstrap_servers)
    progress("broker stopped")


def _wait_for_stop(servers: str) -> None:
    """Block until SIGINT or SIGTERM."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    progress(f"the broker keeps running at {servers} (--keep-broker); Ctrl-C stops it")
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def clickstream(count: int, users: int) -> Iterator[tuple[bytes, bytes]]:
    """The click events as (user, JSON event) pairs."""
    for event in events(count, users):
        yield event["user"].encode(), json.dumps(event).encode()


def run(count: int, users: int, checkpoints: int) -> int:
    """Run the demo; returns a process exit code."""
    with broker() as settings:
        client = dict(settings)
        config = KafkaChangelogConfig(
            bootstrap_servers=client.pop("bootstrap.servers"), client_config=client,
            topic="kafka-changelog-demo", partitions=8, max_parallelism=MAX_PARALLELISM,
        )
        key_groups = KeyGroupRange.of(0, MAX_PARALLELISM - 1)
        stream = list(clickstream(count, users))
        per_checkpoint = max(1, len(stream) // checkpoints)
        handles: list[KafkaChangelogHandle] = []
        with InMemoryChangelogStorage() as memory, KafkaChangelogStorage(config) as kafka, \
                memory.create_writer("clicks", key_groups) as reference, \
                kafka.create_writer("clicks", key_groups) as writer:
            progress(f"changelog topic {config.topic}: {kafka.topic.partitions} partitions")
            for w in (reference, writer):
                w.append_meta(b'{"state": "events-per-user", "type": "list"}')
            started = time.monotonic()
            for cp in range(1, checkpoints + 1):
                chunk = stream[(cp - 1) * per_checkpoint: cp * per_checkpoint]
                if cp == checkpoints:
                    chunk = stream[(cp - 1) * per_checkpoint:]
                for user, event in chunk:
                    kg = key_group_for_key(user, MAX_PARALLELISM)
                    reference.append(kg, user + b"|" + event)
                    writer.append(kg, user + b"|" + event)
                result = writer.persist(writer.initial_sequence_number(), cp).result(60)
                assert isinstance(result.job_owned, KafkaChangelogHandle)
                handles.append(result.job_owned)
                writer.confirm(writer.initial_sequence_number(), writer.next_sequence_number(),
                               cp)
                progress(f"checkpoint {cp}: {len(chunk)} events persisted, handle covers "
                         f"{sum(r.offset_count for r in result.job_owned.ranges)} records")
            elapsed = time.monotonic() - started
            reference_handle = reference.persist(reference.initial_sequence_number(), 0) \
                .result().job_owned
            assert reference_handle is not None
            expected = list(memory.reader().read(reference_handle))
        latest = handles[-1]
        progress("restoring the latest checkpoint from Kafka ...")
        started = time.monotonic()
        with KafkaChangelogReader(config) as reader:
            restored = list(reader.read(latest))
        restore_s = time.monotonic() - started
        if restored != expected:
            progress(f"FAIL: restored {len(restored)} changes, expected {len(expected)}")
            return 1
        progress(f"restored {len(restored)} changes in {restore_s:.2f} s: equal to the "
                 "in-memory reference")
        narrowed = latest.intersection(KeyGroupRange.of(0, 31))
        assert narrowed is not None
        in_range = [c for c in expected if c.is_meta or c.key_group <= 31]
        with KafkaChangelogReader(config) as reader:
            rescaled = list(reader.read(narrowed))
        if rescaled != in_range:
            progress("FAIL: rescaled restore of key groups 0..31 differs")
            return 1
        progress(f"rescaled restore (key groups 0..31 of a 4-way split): {len(in_range)} "
                 "changes, exact")
        if not replay_with_kcat(latest, config):
            return 1
        summarise(count, users, checkpoints, elapsed, restore_s, latest, config, restored)
    return 0


def replay_with_kcat(handle: KafkaChangelogHandle, config: KafkaChangelogConfig) -> bool:
    """Run the handle's kcat commands; check they print this writer's records."""
    if shutil.which("kcat") is None:
        progress("kcat not installed: skipping the replay (scripts/setup.sh installs it)")
        return True
    records = 0
    for command in handle.kcat_commands(config.bootstrap_servers):
        if config.client_config:
            # kcat takes the same librdkafka settings as -X key=value.
            extra = " ".join(f"-X {shlex.quote(f'{k}={v}')}" for k, v in
                             config.client_config.items())
            command = command.replace("kcat -C", f"kcat -C {extra}", 1)
        out = subprocess.run(shlex.split(command), capture_output=True, text=True,
                             timeout=60, check=True).stdout
        mine = [line for line in out.splitlines() if f"key={handle.log_id}" in line]
        records += len(mine)
    progress(f"kcat replayed {records} records of log {handle.log_id}")
    return records > 0


def summarise(count: int, users: int, checkpoints: int, elapsed: float, restore_s: float,
              handle: KafkaChangelogHandle, config: KafkaChangelogConfig,
              restored: list[StateChange]) -> None:
    """The closing summary."""
    print()
    print("=== kafka-changelog demo ===")
    print(f"events            {count} from {users} users")
    print(f"checkpoints       {checkpoints} ({count / max(elapsed, 1e-9):,.0f} events/s "
          "appended and persisted)")
    print(f"restored changes  {len(restored)} in {restore_s:.2f} s")
    print(f"changelog         {handle.state_size:,} bytes in {len(handle.ranges)} partitions "
          f"of {config.topic}")
    print("look at the log with kcat:")
    for command in handle.kcat_commands(config.bootstrap_servers)[:3]:
        print(f"  {command}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m examples.changelog_demo [--events N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--checkpoints", type=int, default=5)
    args = parser.parse_args(argv)
    return run(args.events, args.users, args.checkpoints)


if __name__ == "__main__":
    sys.exit(main())
