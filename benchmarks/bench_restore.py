"""Restore: reading handles back against a raw consumer, and restore time versus history.

1. Restore throughput. For 100-byte and 10-KB changes, a writer over key groups
   0..127 appends N changes round robin and persists them once; the handle is read
   back with ``KafkaChangelogReader``, change by change (``read``: every change
   iterated, its payload length summed) and column-wise (``read_columns``, what restores
   and catch-ups replay: every payload length summed from the columns), and, as the
   baseline, with a raw confluent-kafka ``Consumer`` using the same settings
   (``config.consumer()``) that assigns all of the handle's ranges at once at their
   start offsets (as the reader does) and consumes batches of up to 1,000 records until
   every end offset, summing ``len(value)``: the same records. MB/s of each are the
   record value bytes (checked equal) over the wall time from creating the client to
   closing it. ``--rounds`` alternating rounds (default 3); the best of each side
   counts. Target: ours >= 0.8x the raw MB/s. Afterwards (not timed) both ways are read
   once more and every change checked: the one appended at its place, in its key group,
   with its payload.
2. Restore time versus history, with ``ChangelogKeyedStateBackend``: a fixed key
   space (20,000 keys), one INT64 value state per key, H updates (every key once in
   random order, then random keys), a checkpoint after H1 = 50,000 updates and after
   10 x H1 (one backend, so the long history extends the short one). With
   materialization every H1/5 updates, placed so that the last one comes H1/20
   updates before each checkpoint (the same tail for both), restoring the 10 x H1
   checkpoint must take at most 1.3x as long as the H1 one. Without materialization
   (a second backend, the same updates) the whole log is replayed, so the time grows
   about linearly (~10x): shown for contrast. Every restore is checked against the
   expected values of all keys (outside the timing).

Run: ``python -m benchmarks.bench_restore [--json FILE] [--rounds N]`` (default
``benchmarks/results/restore.json``; ``BENCH_SCALE`` scales the amounts).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from confluent_kafka import Consumer

from benchmarks.common import (
    MAX_PARALLELISM,
    MB,
    PARTITIONS,
    RESULTS_DIR,
    Broker,
    kafka_broker,
    machine_info,
    payloads,
    ratio_text,
    raw_read,
    scaled,
    table,
    unique_topic,
    verdict,
    write_json,
)
from kafka_changelog import KeyGroupRange
from kafka_changelog.kafka import (
    KafkaChangelogConfig,
    KafkaChangelogHandle,
    KafkaChangelogReader,
    KafkaChangelogStorage,
)
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import INT64

DEFAULT_JSON = RESULTS_DIR / "restore.json"
ALL_KEY_GROUPS = KeyGroupRange.of(0, MAX_PARALLELISM - 1)

#: (payload bytes, changes at BENCH_SCALE=1, minimum changes)
THROUGHPUT_CASES: tuple[tuple[int, int, int], ...] = (
    (100, 500_000, 50_000),
    (10 * 1024, 10_000, 1_000),
)
THROUGHPUT_TARGET = 0.8  # ours / raw MB/s

KEYS = 20_000  # key space at BENCH_SCALE=1
H1_PER_KEY = 2.5  # H1 = KEYS * H1_PER_KEY updates
HISTORY_FACTOR = 10  # the long history is HISTORY_FACTOR x H1
MATERIALIZATIONS_PER_H1 = 5
TAIL_FRACTION = 20  # the tail after the last materialization: H1 / TAIL_FRACTION
HISTORY_TARGET = 1.3  # restore(10 x H1) / restore(H1), materialized
OPERATOR = "op"


# -- 1. restore throughput -------------------------------------------------------------------


@dataclass
class Read:
    """One timed read of a handle."""

    impl: str
    payload_bytes: int
    changes: int
    records: int
    #: Record value bytes read (the same on both sides).
    value_bytes: int
    seconds: float
    cpu_s: float

    @property
    def changes_per_s(self) -> float:
        return self.changes / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / self.seconds / MB

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "changes_per_s": self.changes_per_s, "mb_per_s": self.mb_per_s}


def write_handle(
    broker: Broker, size: int, count: int
) -> tuple[KafkaChangelogConfig, KafkaChangelogHandle, float]:
    """Append ``count`` changes round robin over 128 key groups, persist once."""
    config = broker.changelog_config(unique_topic("restore"))
    data = payloads(size)
    mask = MAX_PARALLELISM - 1
    start = time.perf_counter()
    with KafkaChangelogStorage(config) as storage:
        writer = storage.create_writer("bench", ALL_KEY_GROUPS)
        append = writer.append
        for i in range(count):
            kg = i & mask
            append(kg, data[kg])
        result = writer.persist(writer.initial_sequence_number(), 1).result(timeout=300)
        writer.close()
    handle = result.job_owned
    if not isinstance(handle, KafkaChangelogHandle):
        raise RuntimeError(f"persist returned {handle!r}, not a Kafka handle")
    return config, handle, time.perf_counter() - start


def read_ours(config: KafkaChangelogConfig, handle: KafkaChangelogHandle, size: int) -> Read:
    """Iterate the handle's changes with ``KafkaChangelogReader``."""
    changes = payload_total = 0
    gc.collect()
    cpu0 = time.process_time()
    start = time.perf_counter()
    with KafkaChangelogReader(config) as reader:
        for change in reader.read(handle):
            changes += 1
            payload_total += len(change.payload)
    seconds = time.perf_counter() - start
    cpu_s = time.process_time() - cpu0
    if payload_total != changes * size:
        raise RuntimeError(f"reader: {payload_total} payload bytes for {changes} changes")
    return Read("kafka_changelog", size, changes, reader.records_read, reader.bytes_read,
                seconds, cpu_s)


def read_columns(config: KafkaChangelogConfig, handle: KafkaChangelogHandle, size: int
                 ) -> Read:
    """Read the handle column-wise (``read_columns``: what a restore replays), summing
    the payload lengths of every change."""
    gc.collect()
    cpu0 = time.process_time()
    start = time.perf_counter()
    with KafkaChangelogReader(config) as reader:
        columns = reader.read_columns([handle])
        if columns is None:
            raise RuntimeError("the reader left the handle to its per-change read")
        changes, payload_total = len(columns), int(columns.payload_lengths.sum())
    seconds = time.perf_counter() - start
    cpu_s = time.process_time() - cpu0
    if payload_total != changes * size:
        raise RuntimeError(f"columns: {payload_total} payload bytes for {changes} changes")
    return Read("kafka_changelog_columns", size, changes, reader.records_read,
                reader.bytes_read, seconds, cpu_s)


def read_raw(config: KafkaChangelogConfig, handle: KafkaChangelogHandle, size: int,
             changes: int) -> Read:
    """Consume the handle's ranges with a plain consumer, all partitions assigned at once
    (as the reader does), summing the value lengths."""
    gc.collect()
    cpu0 = time.process_time()
    start = time.perf_counter()
    consumer = Consumer(config.consumer())
    try:
        records, value_bytes = raw_read(consumer, handle.topic, {
            r.partition: (r.start_offset, r.end_offset, None) for r in handle.ranges})
    finally:
        consumer.close()
    seconds = time.perf_counter() - start
    cpu_s = time.process_time() - cpu0
    return Read("raw_consumer", size, changes, records, value_bytes, seconds, cpu_s)


def check_exact(config: KafkaChangelogConfig, handle: KafkaChangelogHandle, size: int,
                count: int) -> None:
    """Read the handle both ways once more (not timed): change ``i`` must be the one
    appended ``i``-th, in key group ``i % 128`` with that key group's payload."""
    data = payloads(size)
    mask = MAX_PARALLELISM - 1
    with KafkaChangelogReader(config) as reader:
        read = 0
        for index, change in enumerate(reader.read(handle)):
            if change.key_group != index & mask or change.payload != data[change.key_group]:
                raise RuntimeError(f"reader: change {index} is of key group "
                                   f"{change.key_group} with another payload than appended")
            read += 1
        columns = reader.read_columns([handle])
    if read != count or columns is None or len(columns) != count:
        raise RuntimeError(f"{read} changes read, {count} appended (columns: "
                           f"{None if columns is None else len(columns)})")
    expected = np.arange(count, dtype=np.int64) & mask
    if not np.array_equal(columns.key_groups, expected):
        raise RuntimeError("columns: the changes' key groups are not those appended, in order")
    body = columns.data
    for index, (start, length) in enumerate(zip(columns.payload_starts.tolist(),
                                                 columns.payload_lengths.tolist(),
                                                 strict=True)):
        if body[start:start + length] != data[index & mask]:
            raise RuntimeError(f"columns: change {index} has another payload than appended")


def throughput_case(broker: Broker, size: int, count: int, rounds: int) -> dict[str, Any]:
    config, handle, write_s = write_handle(broker, size, count)
    print(f"\n[restore throughput] {size}-byte changes x {count:,} ({count * size / MB:,.0f} MB "
          f"of payload, written in {write_s:.1f} s, {len(handle.ranges)} ranges), "
          f"{rounds} round(s)", flush=True)
    read_raw(config, handle, size, count)  # warm-up (not measured): page cache, connections
    readers: tuple[Callable[[], Read], ...] = (
        lambda: read_raw(config, handle, size, count),
        lambda: read_ours(config, handle, size),
        lambda: read_columns(config, handle, size),
    )
    reads: list[Read] = []
    for index in range(rounds):
        # Alternate the order so neither side always reads right after the other.
        for read in readers if index % 2 == 0 else readers[::-1]:
            result = read()
            reads.append(result)
            print(f"  round {index + 1} {result.impl:16s} {result.changes_per_s:>12,.0f} "
                  f"changes/s {result.mb_per_s:>8.1f} MB/s  ({result.seconds:.2f} s, "
                  f"{result.records:,} records, {result.cpu_s:.2f} CPU s)", flush=True)
    check_exact(config, handle, size, count)
    print("  exact: every change read back both ways is the one appended, in order",
          flush=True)
    broker.delete_topic(config.topic)
    ours_reads = [r for r in reads if r.impl == "kafka_changelog"]
    column_reads = [r for r in reads if r.impl == "kafka_changelog_columns"]
    raw_reads = [r for r in reads if r.impl == "raw_consumer"]
    for r in ours_reads + column_reads:
        if r.changes != count:
            raise RuntimeError(f"{r.impl} returned {r.changes} of {count} changes")
    for r in raw_reads:
        ours_first = ours_reads[0]
        if (r.records, r.value_bytes) != (ours_first.records, ours_first.value_bytes):
            raise RuntimeError(
                f"raw consumer read {r.records} records / {r.value_bytes} bytes, the reader "
                f"{ours_first.records} / {ours_first.value_bytes}")
    ours = min(ours_reads, key=lambda r: r.seconds)
    columns = min(column_reads, key=lambda r: r.seconds)
    raw = min(raw_reads, key=lambda r: r.seconds)
    ratio = ours.mb_per_s / raw.mb_per_s  # same bytes: equal to the changes/s ratio
    columns_ratio = columns.mb_per_s / raw.mb_per_s
    median_ratio = median(r.mb_per_s for r in ours_reads) / median(r.mb_per_s for r in raw_reads)
    return {
        "payload_bytes": size,
        "changes": count,
        "records": ours.records,
        "value_bytes": ours.value_bytes,
        "write_s": write_s,
        "target_ratio": THROUGHPUT_TARGET,
        "ratio": ratio,
        "median_ratio": median_ratio,
        "verdict": verdict(ratio >= THROUGHPUT_TARGET),
        "columns_ratio": columns_ratio,
        "columns_verdict": verdict(columns_ratio >= THROUGHPUT_TARGET),
        "best": {"kafka_changelog": ours.as_dict(), "raw_consumer": raw.as_dict(),
                 "kafka_changelog_columns": columns.as_dict()},
        "runs": [r.as_dict() for r in reads],
        "exact": True,
    }


# -- 2. restore time versus history ---------------------------------------------------------


@dataclass
class Checkpoint:
    """A checkpoint of the history scenario and what restoring it must give."""

    history: int
    handle: KeyedStateHandle
    expected: dict[bytes, int]

    @property
    def snapshot_bytes(self) -> int:
        snapshot = self.handle.snapshot
        return snapshot.state_size if snapshot is not None else 0

    @property
    def changelog_bytes(self) -> int:
        return sum(h.state_size for h in self.handle.changelog)


def build_history(
    storage: KafkaChangelogStorage, store: KafkaSnapshotStore, keys: list[bytes], h1: int,
    materialize: bool,
) -> tuple[list[Checkpoint], float, int]:
    """H = HISTORY_FACTOR x h1 random-key updates, a checkpoint after h1 and after H.

    With ``materialize``, materializes (and waits) every h1 / 5 updates, the last one
    h1 / 20 updates before each checkpoint. Returns the checkpoints, the seconds the
    updates took and the materializations done.
    """
    rng = random.Random(11)
    every = h1 // MATERIALIZATIONS_PER_H1
    tail = h1 // TAIL_FRACTION
    total = HISTORY_FACTOR * h1
    counts = dict.fromkeys(keys, 0)
    descriptor = value_state("count", INT64)
    backend = ChangelogKeyedStateBackend(storage, store, OPERATOR, ALL_KEY_GROUPS,
                                         MAX_PARALLELISM)
    checkpoints: list[Checkpoint] = []
    materializations = 0
    start = time.perf_counter()
    try:
        count = backend.state(descriptor)
        set_key = backend.set_current_key
        update = count.update
        pick = rng.randrange
        n_keys = len(keys)
        # Every key once (in random order) first, so both checkpoints hold the same keys.
        first = rng.sample(keys, n_keys)
        for i in range(1, total + 1):
            key = first[i - 1] if i <= n_keys else keys[pick(n_keys)]
            value = counts[key] + 1
            counts[key] = value
            set_key(key)
            update(value)
            if materialize and (i + tail) % every == 0:
                backend.materialize_now()
                materializations += 1
            if i in (h1, total):
                handle = backend.snapshot(len(checkpoints) + 1).result(timeout=300)
                checkpoints.append(Checkpoint(i, handle, dict(counts)))
    finally:
        backend.close()
    return checkpoints, time.perf_counter() - start, materializations


def restore_once(storage: KafkaChangelogStorage, store: KafkaSnapshotStore,
                 checkpoint: Checkpoint) -> float:
    """Seconds to restore ``checkpoint`` (checked against the expected values afterwards)."""
    gc.collect()
    start = time.perf_counter()
    backend = restore_backend(
        storage, store, OPERATOR, ALL_KEY_GROUPS, MAX_PARALLELISM, [checkpoint.handle])
    seconds = time.perf_counter() - start
    try:
        count = backend.state(value_state("count", INT64))
        for key, expected in checkpoint.expected.items():
            backend.set_current_key(key)
            found = count.value(0)
            if found != expected:
                raise RuntimeError(f"restored {key!r} = {found}, expected {expected}")
    finally:
        backend.close()
    return seconds


def history_case(broker: Broker, keys: list[bytes], h1: int, materialize: bool,
                 rounds: int) -> dict[str, Any]:
    label = "materialized" if materialize else "not materialized"
    print(f"\n[restore vs history, {label}] {len(keys):,} keys, H1 = {h1:,} updates, "
          f"{HISTORY_FACTOR} x H1 = {HISTORY_FACTOR * h1:,}", flush=True)
    config = broker.changelog_config(unique_topic("history"))
    store_topic = unique_topic("snapshots")
    broker.topics.append(store_topic)
    store_config = SnapshotStoreConfig(
        bootstrap_servers=broker.bootstrap_servers, client_config=dict(broker.client_config),
        topic=store_topic, partitions=PARTITIONS, max_parallelism=MAX_PARALLELISM)
    with KafkaChangelogStorage(config) as storage, KafkaSnapshotStore(store_config) as store:
        checkpoints, build_s, materializations = build_history(
            storage, store, keys, h1, materialize)
        print(f"  {HISTORY_FACTOR * h1:,} updates in {build_s:.1f} s "
              f"({HISTORY_FACTOR * h1 / build_s:,.0f}/s), {materializations} materializations",
              flush=True)
        times: dict[int, list[float]] = {c.history: [] for c in checkpoints}
        for index in range(rounds):
            for checkpoint in checkpoints if index % 2 == 0 else checkpoints[::-1]:
                seconds = restore_once(storage, store, checkpoint)
                times[checkpoint.history].append(seconds)
                print(f"  round {index + 1} history {checkpoint.history:>10,}: restore "
                      f"{seconds:.3f} s", flush=True)
    broker.delete_topic(config.topic)
    broker.delete_topic(store_topic)
    short, long = checkpoints
    ratio = min(times[long.history]) / min(times[short.history])
    # Restore time as fixed cost + cost per update of history (a line through both points).
    per_update_s = (min(times[long.history]) - min(times[short.history])) / (
        long.history - short.history)
    result: dict[str, Any] = {
        "materialized": materialize,
        "keys": len(keys),
        "materialize_every": h1 // MATERIALIZATIONS_PER_H1 if materialize else None,
        "tail_updates": h1 // TAIL_FRACTION if materialize else None,
        "materializations": materializations,
        "build_s": build_s,
        "checkpoints": [
            {
                "history": c.history,
                "snapshot_bytes": c.snapshot_bytes,
                "changelog_bytes": c.changelog_bytes,
                "changelog_handles": len(c.handle.changelog),
                "restore_s_best": min(times[c.history]),
                "restore_s": times[c.history],
            }
            for c in checkpoints
        ],
        "ratio": ratio,
        "extra_s_per_100k_updates": per_update_s * 100_000,
        "fixed_s": min(times[short.history]) - per_update_s * short.history,
    }
    if materialize:
        result["target_ratio"] = HISTORY_TARGET
        result["verdict"] = verdict(ratio <= HISTORY_TARGET)
    return result


# -- all -------------------------------------------------------------------------------------


def run(broker: Broker | None = None, rounds: int = 3) -> dict[str, Any]:
    """Both parts (on ``broker``, or a fresh local one); returns the JSON-able results."""
    if broker is None:
        with kafka_broker() as own:
            return run(own, rounds)
    throughput = []
    for size, base_count, minimum in THROUGHPUT_CASES:
        count = int(scaled(base_count, minimum=minimum))
        throughput.append(throughput_case(broker, size, count, rounds))
    n_keys = int(scaled(KEYS, minimum=1_000))
    h1 = int(n_keys * H1_PER_KEY)
    keys = [i.to_bytes(8, "big") for i in range(n_keys)]  # like Flink's Long keys
    history = [
        history_case(broker, keys, h1, materialize=True, rounds=rounds),
        # Restoring a long unmaterialized log is slow: fewer rounds (it is not a target).
        history_case(broker, keys, h1, materialize=False, rounds=min(rounds, 2)),
    ]
    return {
        "name": "restore",
        "partitions": PARTITIONS,
        "key_groups": MAX_PARALLELISM,
        "rounds": rounds,
        "throughput": throughput,
        "history": history,
    }


def report(results: dict[str, Any]) -> str:
    rows = []
    for case in results["throughput"]:
        ours = case["best"]["kafka_changelog"]
        columns = case["best"]["kafka_changelog_columns"]
        raw = case["best"]["raw_consumer"]
        rows.append([
            f"{case['payload_bytes']} B",
            f"{ours['changes_per_s']:,.0f}", f"{ours['mb_per_s']:.1f}",
            f"{columns['mb_per_s']:.1f}",
            f"{raw['changes_per_s']:,.0f}", f"{raw['mb_per_s']:.1f}",
            ratio_text(case["ratio"]), ratio_text(case["median_ratio"]),
            f"{ratio_text(case['columns_ratio'])} {case['columns_verdict']}",
            f"{ours['cpu_s']:.2f} / {raw['cpu_s']:.2f}",
            f">= {case['target_ratio']}x MB/s", case["verdict"],
        ])
    text = table(
        ["change", "ours chg/s", "ours MB/s", "columns MB/s", "raw chg/s", "raw MB/s",
         "ratio", "median ratio", "columns ratio", "CPU s ours / raw", "target", "result"],
        rows,
    )
    rows = []
    for case in results["history"]:
        short, long = case["checkpoints"]
        rows.append([
            "materialized" if case["materialized"] else "not materialized",
            f"{case['keys']:,}",
            f"{short['history']:,}", f"{long['history']:,}",
            f"{short['restore_s_best']:.3f}", f"{long['restore_s_best']:.3f}",
            f"{(short['snapshot_bytes'] + short['changelog_bytes']) / MB:.1f} / "
            f"{(long['snapshot_bytes'] + long['changelog_bytes']) / MB:.1f}",
            f"{case['extra_s_per_100k_updates']:+.3f}",
            ratio_text(case["ratio"]),
            f"<= {case['target_ratio']}x" if "target_ratio" in case else "(~10x expected)",
            case.get("verdict", "-"),
        ])
    text += ("\n\nrestore time vs history (best round; ratio = restore(10 x H1) / restore(H1); "
             "s per 100k updates: slope between the two; state MB: snapshot + changelog)\n")
    text += table(
        ["backend", "keys", "H1", "10 x H1", "restore H1 s", "restore 10xH1 s",
         "state MB H1 / 10xH1", "s per 100k updates", "ratio", "target", "result"],
        rows,
    )
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write the results to this file")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per case")
    args = parser.parse_args(argv)
    with kafka_broker() as broker:
        results = run(broker, rounds=args.rounds)
        results["machine"] = machine_info()
    print("\nrestore throughput (best round of each side; ratio = ours / raw, the same for "
          "changes/s and MB/s; MB = 10^6 record value bytes)")
    print(report(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
