"""Restore of keyed state (materialized snapshot + changelog tail) against a raw consumer.

For each case, one backend over all 128 key groups writes K keys of one state, materializes
them (snapshot chunks in the snapshot topic), then updates K/10 of them (the changelog tail)
and takes a checkpoint. That checkpoint's handle is then read back, in alternating rounds:

- **raw consumer** (the baseline): a plain confluent-kafka ``Consumer`` with the snapshot
  store's reader settings reads exactly the records the restore reads — the snapshot chunk
  records of every partition (from its first chunk's offset to its last one's) at once,
  then the changelog ranges of each handle at once — summing the record value bytes;
- **into RocksDB**: ``restore_backend(..., table=RocksDBStateTable(fresh dir))``, what
  streaming's ``state_backend="rocksdb"`` does when a subtask moves to another host (the
  tail read first and merged into the key groups written as SST files: see
  ``docs/state.md``, "Restoring into an empty RocksDB store");
- **into memory**: ``restore_backend(...)`` into the in-memory table.

MB/s of every side = the same record value bytes (snapshot chunk records + changelog
records) / wall time, clients created and closed inside the time. Target (issue #12): the
restore into RocksDB at >= 0.8x the raw consumer's MB/s (best rounds; the median ratio is
shown too). Every restore is checked: entry count, and the values of a sample of keys
against what was written; and the first restore into RocksDB against the first into
memory, key by key (every key group's snapshot bytes, which both tables write alike).

Cases (``BENCH_SCALE`` scales K): ``value 100 B`` (K = 1,000,000 value-state entries of
100 random bytes), ``value 1 KiB`` (K = 100,000), and ``user profile`` (K = 200,000 users
with the four states of the issue's workload: an 8-byte count, an 8-byte total, a map of 4
kinds to counts and a list of the last 5 pages: small entries, the worst case per byte).

Run: ``python -m benchmarks.bench_restore_rocksdb [--json FILE] [--rounds N] [--case NAME]
[--profile]`` (default ``benchmarks/results/restore_rocksdb.json``; ``--profile`` adds a
cProfile of one restore into RocksDB per case, top functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import io
import os
import pstats
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from confluent_kafka import Consumer

from benchmarks.common import (
    MAX_PARALLELISM,
    MB,
    PARTITIONS,
    RESULTS_DIR,
    Broker,
    ForeignLoad,
    kafka_broker,
    machine_info,
    ratio_text,
    raw_read,
    scaled,
    table,
    unique_topic,
    verdict,
    wait_for_quiet,
    write_json,
)
from kafka_changelog import KeyGroupRange, key_group_for_key
from kafka_changelog.kafka import KafkaChangelogHandle, KafkaChangelogStorage
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.descriptors import (
    list_state,
    map_state,
    value_state,
)
from kafka_changelog.state.schema.serializers import BYTES, INT64, UTF8
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.tables.memory import StateTable
from kafka_changelog.state.tables.protocol import KeyedStateTable

DEFAULT_JSON = RESULTS_DIR / "restore_rocksdb.json"
ALL = KeyGroupRange.of(0, MAX_PARALLELISM - 1)
TARGET = 0.8  # restore into RocksDB / raw consumer, MB/s
OPERATOR = "op"
SAMPLE = 1000  # keys checked after every restore

VALUE = value_state("value", BYTES)
COUNT = value_state("count", INT64)
TOTAL = value_state("total", INT64)
KINDS = map_state("kinds", UTF8, INT64)
PAGES = list_state("pages", UTF8)
KIND_NAMES = ["view", "click", "cart", "buy"]


@dataclass(frozen=True)
class Case:
    """A state shape to restore."""

    name: str
    keys: int  # at BENCH_SCALE=1
    value_bytes: int  # 0: the user-profile states


CASES = (
    Case("value 100 B", 1_000_000, 100),
    Case("value 1 KiB", 100_000, 1024),
    Case("user profile", 200_000, 0),
)


def _key(i: int) -> bytes:
    return f"user-{i:09d}".encode()


def _write(case: Case, keys: int, storage: KafkaChangelogStorage,
           snapshots: KafkaSnapshotStore
           ) -> tuple[KeyedStateHandle, dict[bytes, Any], int, float]:
    """K keys, materialized, then K/10 updates; the checkpoint's handle, the expected
    state of a sample of keys, the entries of the state, the seconds it took."""
    started = time.perf_counter()
    rng = random.Random(3)
    backend = ChangelogKeyedStateBackend(storage, snapshots, OPERATOR, ALL, MAX_PARALLELISM,
                                         MaterializationConfig(interval_s=None))
    sample = set(rng.sample(range(keys), min(SAMPLE, keys)))
    expected: dict[bytes, Any] = {}
    new_map_entries = [0]  # the user profile's map entries written

    def put(i: int, generation: int) -> None:
        key = _key(i)
        backend.set_current_key(key, key_group_for_key(key, MAX_PARALLELISM))
        if case.value_bytes:
            value = os.urandom(case.value_bytes)
            backend.state(VALUE).update(value)
            if i in sample:
                expected[key] = value
            return
        count = backend.state(COUNT)
        count.update((count.value() or 0) + 1)
        total = backend.state(TOTAL)
        total.update((total.value() or 0) + i % 97 + generation)
        kind = KIND_NAMES[(i + generation) % 4]
        kinds = backend.state(KINDS)
        seen = kinds.get(kind)
        if seen is None:
            new_map_entries[0] += 1
        kinds.put(kind, (seen or 0) + 1)
        pages = backend.state(PAGES)
        pages.update([*list(pages.get())[-4:], f"/page/{(i * 7 + generation) % 500}"])
        if i in sample:
            expected[key] = (count.value(), total.value(), dict(kinds.items()),
                             list(pages.get()))

    try:
        for i in range(keys):
            put(i, 0)
        backend.materialize_now(timeout=600)
        for i in rng.sample(range(keys), keys // 10):
            put(i, 1)
        handle = backend.snapshot(1).result(timeout=600)
    finally:
        backend.close()
    # Entries as the state counts them: a value's or list's key once, each map entry.
    entries = keys if case.value_bytes else 3 * keys + new_map_entries[0]
    return handle, expected, entries, time.perf_counter() - started


def _check(case: Case, backend: ChangelogKeyedStateBackend, entries: int,
           expected: dict[bytes, Any]) -> None:
    if backend.state_rows() != entries:
        raise RuntimeError(f"{case.name}: restored {backend.state_rows()} entries, expected "
                           f"{entries}")
    for key, want in expected.items():
        backend.set_current_key(key, key_group_for_key(key, MAX_PARALLELISM))
        if case.value_bytes:
            found: Any = backend.state(VALUE).value()
        else:
            found = (backend.state(COUNT).value(), backend.state(TOTAL).value(),
                     dict(backend.state(KINDS).items()), list(backend.state(PAGES).get()))
        if found != want:
            raise RuntimeError(f"{case.name}: key {key!r} restored as {_short(found)}, "
                               f"expected {_short(want)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


# -- the sides -------------------------------------------------------------------------------


def read_raw(handle: KeyedStateHandle, snapshot_config: SnapshotStoreConfig,
             changelog_consumer: dict[str, Any]) -> tuple[int, int]:
    """Records and value bytes of the handle's snapshot chunks and changelog ranges."""
    records = value_bytes = 0
    snapshot = handle.snapshot
    if snapshot is not None:
        consumer = Consumer(snapshot_config.consumer())
        try:
            by_partition: dict[int, set[int]] = {}
            for chunk in snapshot.chunks:
                by_partition.setdefault(chunk.partition, set()).add(chunk.offset)
            records, value_bytes = raw_read(consumer, snapshot.topic, {
                partition: (min(offsets), max(offsets) + 1, offsets)
                for partition, offsets in by_partition.items()})
        finally:
            consumer.close()
    consumer = Consumer(changelog_consumer)
    try:
        for log in handle.changelog:
            assert isinstance(log, KafkaChangelogHandle)
            got, size = raw_read(consumer, log.topic, {
                r.partition: (r.start_offset, r.end_offset, None) for r in log.ranges})
            records, value_bytes = records + got, value_bytes + size
    finally:
        consumer.close()
    return records, value_bytes


class Sides:
    """The three ways to read one checkpoint, each timed."""

    def __init__(self, case: Case, entries: int, handle: KeyedStateHandle,
                 expected: dict[bytes, Any], storage: KafkaChangelogStorage,
                 snapshots: KafkaSnapshotStore, snapshot_config: SnapshotStoreConfig,
                 directory: Path) -> None:
        self.case, self.entries, self.handle, self.expected = (case, entries, handle,
                                                                expected)
        self.storage, self.snapshots = storage, snapshots
        self.snapshot_config = snapshot_config
        self.directory = directory
        #: Per table kind, (snapshot phase, changelog phase) seconds of each restore.
        self.phases: dict[str, list[tuple[float, float]]] = {}
        #: Per table kind, the digest of each key group's state after its first restore.
        self.digests: dict[str, dict[int, bytes]] = {}

    def same_state(self) -> int:
        """The key groups compared; raises when the two tables' restores differ."""
        rocksdb, memory = self.digests["rocksdb"], self.digests["memory"]
        differing = sorted(kg for kg in set(rocksdb) | set(memory)
                           if rocksdb.get(kg) != memory.get(kg))
        if differing:
            raise RuntimeError(
                f"{self.case.name}: restored into RocksDB and into memory, key groups "
                f"{differing[:10]} differ ({len(differing)} of {len(memory)})")
        return len(memory)

    def raw(self) -> tuple[float, int]:
        gc.collect()
        started = time.perf_counter()
        _, value_bytes = read_raw(self.handle, self.snapshot_config,
                                  self.storage.config.consumer())
        return time.perf_counter() - started, value_bytes

    def restore(self, kind: str, profiler: cProfile.Profile | None = None) -> float:
        path = self.directory / f"db-{time.monotonic_ns()}"
        gc.collect()
        if profiler is not None:
            profiler.enable()
        started = time.perf_counter()
        table: KeyedStateTable = (RocksDBStateTable(path, remove_on_close=True)
                                  if kind == "rocksdb" else StateTable())
        marks = _mark_phases(table)
        backend = restore_backend(self.storage, self.snapshots, OPERATOR, ALL,
                                  MAX_PARALLELISM, [self.handle], table=table)
        seconds = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
        snapshot_end = max(marks.get("load_group", started), marks.get("load_groups", started))
        self.phases.setdefault(kind, []).append(
            (snapshot_end - started, marks.get("apply_batch", snapshot_end) - snapshot_end))
        try:
            _check(self.case, backend, self.entries, self.expected)
            if kind not in self.digests:
                table = backend.table
                self.digests[kind] = {
                    kg: hashlib.sha256(table.serialize_group(kg)).digest()
                    for kg in table.key_groups()}
        finally:
            backend.close()
        return seconds


def _mark_phases(table: KeyedStateTable) -> dict[str, float]:
    """When ``table``'s last ``load_group`` / ``load_groups`` and ``apply_batch`` calls
    ended (the snapshot and the changelog phases of a restore), recorded as they run."""
    marks: dict[str, float] = {}
    for name in ("load_group", "load_groups", "apply_batch"):
        method = getattr(table, name, None)
        if method is None:
            continue

        def timed(*args: Any, _method: Any = method, _name: str = name) -> None:
            _method(*args)
            marks[_name] = time.perf_counter()

        setattr(table, name, timed)
    return marks


def run_case(broker: Broker, case: Case, rounds: int, profile: bool) -> dict[str, Any]:
    keys = int(scaled(case.keys, minimum=2_000))
    changelog = broker.changelog_config(unique_topic("rr-log"))
    snapshot_config = SnapshotStoreConfig(
        bootstrap_servers=broker.bootstrap_servers, client_config=dict(broker.client_config),
        topic=unique_topic("rr-snap"), partitions=PARTITIONS, max_parallelism=MAX_PARALLELISM)
    broker.topics.append(snapshot_config.topic)
    directory = Path(tempfile.mkdtemp(prefix="bench-restore-rocksdb-"))
    storage = KafkaChangelogStorage(changelog)
    snapshots = KafkaSnapshotStore(snapshot_config)
    try:
        handle, expected, entries, write_s = _write(case, keys, storage, snapshots)
        snapshot_bytes = handle.snapshot.state_size if handle.snapshot is not None else 0
        print(f"\n[{case.name}] {keys:,} keys written, materialized and {keys // 10:,} "
              f"updated in {write_s:.1f} s: snapshot {snapshot_bytes / MB:.1f} MB in "
              f"{len(handle.snapshot.chunks) if handle.snapshot else 0} chunks, changelog "
              f"{sum(h.state_size for h in handle.changelog) / MB:.1f} MB", flush=True)
        sides = Sides(case, entries, handle, expected, storage, snapshots, snapshot_config,
                      directory)
        _, value_bytes = sides.raw()  # warm-up (page cache, connections): not measured
        runs: dict[str, list[float]] = {"raw": [], "rocksdb": [], "memory": []}
        order: list[tuple[str, Callable[[], float]]] = [
            ("raw", lambda: sides.raw()[0]),
            ("rocksdb", lambda: sides.restore("rocksdb")),
            ("memory", lambda: sides.restore("memory")),
        ]
        load = ForeignLoad(broker.pids())
        for number in range(rounds):
            wait_for_quiet(broker.pids(), "  ")
            for name, side in order if number % 2 == 0 else order[::-1]:
                seconds = side()
                runs[name].append(seconds)
                print(f"  round {number + 1} {name:8s} {seconds:7.3f} s "
                      f"{value_bytes / seconds / MB:8.1f} MB/s", flush=True)
        share = load.share()
        compared = sides.same_state()
        profile_text = ""
        if profile:
            profiler = cProfile.Profile()
            sides.restore("rocksdb", profiler)
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(
                pstats.SortKey.TIME).print_stats(20)
            profile_text = out.getvalue()
            print(profile_text)
    finally:
        snapshots.close()
        storage.close()
        shutil.rmtree(directory, ignore_errors=True)
        broker.delete_topic(changelog.topic)
        broker.delete_topic(snapshot_config.topic)
    best = {name: min(times) for name, times in runs.items()}
    mbs = {name: value_bytes / seconds / MB for name, seconds in best.items()}
    ratio = mbs["rocksdb"] / mbs["raw"]
    median_ratio = median(runs["raw"]) / median(runs["rocksdb"])
    return {
        "case": case.name, "keys": keys, "value_bytes": value_bytes,
        "snapshot_bytes": snapshot_bytes, "write_s": write_s, "best_s": best,
        "mb_per_s": mbs, "runs_s": runs, "ratio": ratio, "median_ratio": median_ratio,
        "memory_ratio": mbs["memory"] / mbs["raw"], "target_ratio": TARGET,
        "verdict": verdict(ratio >= TARGET), "others_cpu_share": round(share, 3),
        "phases_s": {kind: min(times, key=sum) for kind, times in sides.phases.items()},
        "key_groups_equal": compared,
        "profile": profile_text,
    }


def run(broker: Broker | None = None, rounds: int = 3, only: str | None = None,
        profile: bool = False) -> dict[str, Any]:
    """Every case (on ``broker``, or a fresh local one); returns the JSON-able results."""
    if broker is None:
        with kafka_broker() as own:
            return run(own, rounds, only, profile)
    cases = [c for c in CASES if only is None or c.name == only]
    if not cases:
        raise SystemExit(f"no case named {only!r}; cases: {[c.name for c in CASES]}")
    return {"name": "restore_rocksdb", "rounds": rounds,
            "cases": [run_case(broker, case, rounds, profile) for case in cases]}


def report(results: dict[str, Any]) -> str:
    rows = []
    phases = []
    for case in results["cases"]:
        mbs, best = case["mb_per_s"], case["best_s"]
        phases.append([case["case"], *(
            f"{case['phases_s'][kind][0]:.2f} + {case['phases_s'][kind][1]:.2f}"
            for kind in ("rocksdb", "memory"))])
        rows.append([
            case["case"], f"{case['keys']:,}", f"{case['value_bytes'] / MB:.1f}",
            f"{best['raw']:.2f} s, {mbs['raw']:.1f}",
            f"{best['rocksdb']:.2f} s, {mbs['rocksdb']:.1f}",
            f"{best['memory']:.2f} s, {mbs['memory']:.1f}",
            ratio_text(case["ratio"]), ratio_text(case["median_ratio"]),
            ratio_text(case["memory_ratio"]), f"{case['others_cpu_share']:.0%}",
            f">= {case['target_ratio']}x", case["verdict"],
        ])
    return table(["case", "keys", "MB read", "raw consumer (s, MB/s)", "into RocksDB",
                  "into memory", "RocksDB / raw", "median", "memory / raw", "others' CPU",
                  "target", "result"], rows) + (
        "\n\nseconds of the fastest restore: snapshot chunks + changelog tail replayed after "
        "them (into RocksDB the tail is merged into the snapshot's load: all in the first)\n"
        + table(["case", "into RocksDB", "into memory"], phases)
        + "".join(f"\n{case['case']}: restored into RocksDB = into memory, key by key, in "
                  f"all {case['key_groups_equal']} key groups" for case in results["cases"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write the results to this file")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per case")
    parser.add_argument("--case", choices=[c.name for c in CASES], help="run only this case")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one restore into RocksDB per case")
    args = parser.parse_args(argv)
    with kafka_broker() as broker:
        results = run(broker, rounds=args.rounds, only=args.case, profile=args.profile)
        results["machine"] = machine_info()
    print("\nrestore of a checkpoint (snapshot + changelog tail; best round of each side; "
          "MB = 10^6 record value bytes, the same records on every side)")
    print(report(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
