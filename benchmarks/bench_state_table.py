"""State tables: the RocksDB working copy against the in-memory one, and reattaching a
host-local store against restoring it from Kafka.

1. Operations (CPU only). On each table: ``apply`` of N ``SET`` ops to distinct keys,
   ``get`` of those N keys, ``MAP_PUT`` and ``LIST_ADD`` of N ops over N/4 keys; then the
   state API through a backend over the in-memory changelog storage (what a streaming
   function does per key: ``count.update(count.value() + 1)`` and ``pages.put(page,
   pages.get(page) + 1)``). Ops/s of each, and the ratio RocksDB / memory (higher is
   better for RocksDB). The batched paths too, each on a fresh table: ``apply_batch`` of
   the same SETs, MAP_PUTs and LIST_ADDs interleaved, in batches of a restore's replay
   (what restore and delta layers do), and ``apply_columns`` of N SETs, N MAP_PUTs and
   N/4 LIST_REPLACEs in columns of 10,000 (what bulk state does). ``--rounds`` rounds,
   alternating the tables; the best round counts.
2. Restore of K keys (value state plus a 2-entry map state per key, materialized, then a
   tail of K/10 updates) from a local Kafka broker into each table
   (``restore_backend(table=...)``): seconds, and the ratio.
3. Reattach against restore, as streaming does with ``state_backend="rocksdb"``
   (``kafka_changelog.state.host.host_store``): the subtask's store is restored from Kafka into
   the local directory, released at its checkpoint (flushed, manifest written), then
   taken over by a new backend as another Python worker would (``attach`` without a
   cached backend: open the store, read the manifest, adopt the base). Seconds of both
   and the ratio restore / reattach.

Figures depend on the machine (2 cores shared with the broker here); ``Others' CPU`` is
the share of the CPUs other processes used meanwhile.

Run: ``python -m benchmarks.bench_state_table [--json FILE] [--rounds N]`` (default
``benchmarks/results/state_table.json``; ``BENCH_SCALE`` scales N and K).
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    write_json,
)
from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange, key_group_for_key
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore, SnapshotStoreConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.backend.restore import REPLAY_BATCH, restore_backend
from kafka_changelog.state.checkpoints.checkpoint import SubtaskState
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.schema.descriptors import StateKind, map_state, value_state
from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp
from kafka_changelog.state.schema.serializers import INT64, UTF8
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
from kafka_changelog.state.tables.memory import StateTable
from kafka_changelog.state.tables.protocol import KeyedStateTable

DEFAULT_JSON = RESULTS_DIR / "state_table.json"
OPS = 200_000
RESTORE_KEYS = 200_000
ALL = KeyGroupRange.of(0, MAX_PARALLELISM - 1)
COUNT = value_state("count", INT64)
PAGES = map_state("pages", UTF8, INT64)
PAGE_NAMES = ["home", "cart", "search", "item"]
#: Ops per ``apply_columns`` call (a micro-batch's column).
COLUMN = 10_000


def _keys(count: int) -> list[tuple[int, bytes]]:
    keys = [f"user-{i:09d}".encode() for i in range(count)]
    random.Random(1).shuffle(keys)
    return [(key_group_for_key(k, MAX_PARALLELISM), k) for k in keys]


class Tables:
    """New tables of either kind; RocksDB ones in a temporary directory."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="bench-state-table-"))

    def new(self, kind: str) -> KeyedStateTable:
        if kind == "memory":
            return StateTable()
        return RocksDBStateTable(self.directory / f"t{time.monotonic_ns()}",
                                 remove_on_close=True)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _timed(work: Callable[[], int]) -> float:
    """Ops per second of ``work`` (which returns how many ops it did), GC off."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        done = work()
        return done / (time.perf_counter() - started)
    finally:
        gc.enable()


def operations_round(kind: str, tables: Tables, n: int) -> dict[str, float]:
    """Ops/s of each operation on a fresh table of ``kind``."""
    keys = _keys(n)
    metas = [StateMeta("count", StateKind.VALUE, "int64"),
             StateMeta("events", StateKind.LIST, "utf8"),
             StateMeta("pages", StateKind.MAP, "int64", "utf8")]
    value = (7).to_bytes(8, "big")
    table = tables.new(kind)
    for meta in metas:
        table.register(meta)
    sets = [(kg, StateOp("count", OpKind.SET, k, value=value)) for kg, k in keys]
    quarter = keys[: max(1, n // 4)]
    puts = [(kg, StateOp("pages", OpKind.MAP_PUT, k, PAGE_NAMES[i % 4].encode(), value))
            for i, (kg, k) in enumerate(quarter * 4)][:n]
    adds = [(kg, StateOp("events", OpKind.LIST_ADD, k, values=(b"page",)))
            for kg, k in quarter * 4][:n]
    results: dict[str, float] = {}

    def apply_all(ops: list[tuple[int, StateOp]]) -> Callable[[], int]:
        def work() -> int:
            apply = table.apply
            for key_group, op in ops:
                apply(key_group, op)
            return len(ops)
        return work

    def get_all() -> int:
        get = table.get
        for key_group, key in keys:
            get(key_group, "count", key)
        return len(keys)

    results["apply SET"] = _timed(apply_all(sets))
    results["get (value)"] = _timed(get_all)
    results["apply MAP_PUT"] = _timed(apply_all(puts))
    results["apply LIST_ADD"] = _timed(apply_all(adds))
    table.close()
    results["apply_batch (replay)"] = _batch_round(kind, tables, metas, sets, puts, adds)
    results.update(_columns_round(kind, tables, metas, keys, value))
    results["state API (per key)"] = _backend_round(kind, tables, keys[: n // 2])
    return results


def _batch_round(kind: str, tables: Tables, metas: list[StateMeta],
                 *streams: list[tuple[int, StateOp]]) -> float:
    """Ops/s of ``apply_batch`` of the streams interleaved, in replay-sized batches."""
    ops = [op for ops in zip(*streams, strict=True) for op in ops]
    table = tables.new(kind)
    for meta in metas:
        table.register(meta)

    def work() -> int:
        for start in range(0, len(ops), REPLAY_BATCH):
            table.apply_batch(ops[start:start + REPLAY_BATCH])
        return len(ops)

    rate = _timed(work)
    table.close()
    return rate


def _columns_round(kind: str, tables: Tables, metas: list[StateMeta],
                   keys: list[tuple[int, bytes]], value: bytes) -> dict[str, float]:
    """Ops/s of ``apply_columns`` of SETs, MAP_PUTs and LIST_REPLACEs on a fresh table."""
    table = tables.new(kind)
    for meta in metas:
        table.register(meta)
    groups = [kg for kg, _ in keys]
    names = [k for _, k in keys]
    pages = [PAGE_NAMES[i % 4].encode() for i in range(len(keys))]
    values: list[bytes | None] = [value] * len(keys)
    items: list[tuple[bytes, ...] | None] = [(b"page", b"cart")] * len(keys)

    def columns(state: str, op: OpKind, count: int, **data: Any) -> Callable[[], int]:
        def work() -> int:
            for start in range(0, count, COLUMN):
                end = min(count, start + COLUMN)
                table.apply_columns(state, op, groups[start:end], names[start:end],
                                    **{name: column[start:end] for name, column
                                       in data.items()})
            return count
        return work

    n = len(keys)
    results = {
        "apply_columns SET": _timed(columns("count", OpKind.SET, n, values=values)),
        "apply_columns MAP_PUT": _timed(columns("pages", OpKind.MAP_PUT, n, map_keys=pages,
                                                values=values)),
        "apply_columns LIST_REPLACE": _timed(columns("events", OpKind.LIST_REPLACE,
                                                     max(1, n // 4), items=items)),
    }
    table.close()
    return results


def _backend_round(kind: str, tables: Tables, keys: list[tuple[int, bytes]]) -> float:
    """Keys per second through a backend: a value read-modify-write and a map one."""
    with InMemoryChangelogStorage() as storage:
        backend = ChangelogKeyedStateBackend(storage, InMemorySnapshotStore(), "op", ALL,
                                             MAX_PARALLELISM, table=tables.new(kind))

        def work() -> int:
            for i, (key_group, key) in enumerate(keys):
                backend.set_current_key(key, key_group)
                count = backend.state(COUNT)
                count.update((count.value() or 0) + 1)
                pages = backend.state(PAGES)
                page = PAGE_NAMES[i % 4]
                pages.put(page, (pages.get(page) or 0) + 1)
            return len(keys)

        rate = _timed(work)
        backend.close()
    return rate


def operations(rounds: int) -> dict[str, Any]:
    n = int(scaled(OPS, minimum=2_000))
    tables = Tables()
    best: dict[str, dict[str, float]] = {"memory": {}, "rocksdb": {}}
    try:
        for number in range(rounds):
            for kind in (("memory", "rocksdb") if number % 2 == 0 else ("rocksdb", "memory")):
                for name, rate in operations_round(kind, tables, n).items():
                    best[kind][name] = max(rate, best[kind].get(name, 0.0))
    finally:
        tables.close()
    return {"ops": n, "best_ops_per_s": best,
            "ratio": {name: best["rocksdb"][name] / best["memory"][name]
                      for name in best["memory"]}}


def _kafka_stores(broker: Broker, prefix: str) -> tuple[KafkaChangelogStorage,
                                                       KafkaSnapshotStore]:
    config = broker.changelog_config(unique_topic(f"{prefix}-log"))
    snapshots = SnapshotStoreConfig(bootstrap_servers=broker.bootstrap_servers,
                                    client_config=dict(broker.client_config),
                                    topic=unique_topic(f"{prefix}-snap"), partitions=16,
                                    max_parallelism=MAX_PARALLELISM)
    broker.topics.append(snapshots.topic)
    return KafkaChangelogStorage(config), KafkaSnapshotStore(snapshots)


def _write_state(storage: KafkaChangelogStorage, snapshots: KafkaSnapshotStore,
                 keys: list[tuple[int, bytes]]) -> Any:
    """K keys with a value and a 2-entry map, materialized, then a tail of K/10 updates;
    returns the checkpoint's handle."""
    backend = ChangelogKeyedStateBackend(storage, snapshots, "op", ALL, MAX_PARALLELISM,
                                         MaterializationConfig(interval_s=None))
    for i, (key_group, key) in enumerate(keys):
        backend.set_current_key(key, key_group)
        backend.state(COUNT).update(i)
        pages = backend.state(PAGES)
        pages.put(PAGE_NAMES[i % 4], i)
        pages.put(PAGE_NAMES[(i + 1) % 4], i)
    backend.materialize_now()
    for i, (key_group, key) in enumerate(keys[: len(keys) // 10]):
        backend.set_current_key(key, key_group)
        backend.state(COUNT).update(-i)
    handle = backend.snapshot(1).result(300)
    backend.close()
    return handle


def restore_and_reattach(broker: Broker, rounds: int) -> dict[str, Any]:
    from kafka_changelog.state.host import host_store
    from kafka_changelog.state.host.subtask_backend import StateSource, SubtaskPlacement

    k = int(scaled(RESTORE_KEYS, minimum=2_000))
    storage, snapshots = _kafka_stores(broker, "state-table")
    tables = Tables()
    try:
        handle = _write_state(storage, snapshots, _keys(k))
        best: dict[str, float] = {}
        load = ForeignLoad(broker.pids())
        for number in range(rounds):
            for kind in (("memory", "rocksdb") if number % 2 == 0 else ("rocksdb", "memory")):
                gc.collect()
                started = time.perf_counter()
                backend = restore_backend(storage, snapshots, "op", ALL, MAX_PARALLELISM,
                                          [handle], table=tables.new(kind))
                seconds = time.perf_counter() - started
                # Entries: each key's value and its map's two entries.
                assert backend.state_rows() == 3 * k, backend.state_rows()
                backend.close()
                best[f"restore into {kind}"] = min(seconds, best.get(f"restore into {kind}",
                                                                     float("inf")))
            placement = SubtaskPlacement(f"bench-{number}", "op", 0, 1, MAX_PARALLELISM)
            settings = host_store.HostStoreSettings(tables.directory / "local")
            materialization = MaterializationConfig(interval_s=None)
            gc.collect()
            attached = host_store.attach(settings, placement, 1, [handle], None, storage,
                                         snapshots, materialization)
            assert attached.source is StateSource.RESTORED
            encoded = SubtaskState("op", 0, 1, handle, None).to_bytes()
            # The handle of checkpoint 1 is the one restored: released "at" checkpoint 1.
            kept = host_store.release(attached, 1, encoded)
            assert kept is not None  # no materialization was started
            kept.backend.close()
            restore_local = attached.seconds
            gc.collect()
            started = time.perf_counter()
            again = host_store.attach(settings, placement, 1, [handle], None, storage,
                                      snapshots, materialization)
            reattach = time.perf_counter() - started
            assert again.source is StateSource.REATTACHED_LOCAL
            assert again.backend.state_rows() == 3 * k, again.backend.state_rows()
            host_store.abandon(again)
            best["restore into the local store"] = min(
                restore_local, best.get("restore into the local store", float("inf")))
            best["reattach the local store"] = min(
                reattach, best.get("reattach the local store", float("inf")))
        share = load.share()
    finally:
        tables.close()
        snapshots.close()
        storage.close()
    return {"keys": k, "entries": 3 * k, "tail_updates": k // 10, "best_s": best,
            "others_cpu_share": round(share, 3),
            "restore_rocksdb_over_memory": best["restore into rocksdb"]
            / best["restore into memory"],
            "restore_over_reattach": best["restore into the local store"]
            / best["reattach the local store"]}


def run(broker: Broker | None = None, rounds: int = 3) -> dict[str, Any]:
    """Every part (on ``broker``, or a fresh local one); returns the JSON-able results."""
    if broker is None:
        with kafka_broker() as own:
            return run(own, rounds)
    load = ForeignLoad(broker.pids())
    ops = operations(rounds)
    ops["others_cpu_share"] = round(load.share(), 3)
    return {"name": "state_table", "rounds": rounds, "operations": ops,
            "restore": restore_and_reattach(broker, rounds)}


def report(results: dict[str, Any]) -> str:
    ops = results["operations"]
    rows = [[name, f"{ops['best_ops_per_s']['memory'][name]:,.0f}",
             f"{ops['best_ops_per_s']['rocksdb'][name]:,.0f}", ratio_text(ratio)]
            for name, ratio in ops["ratio"].items()]
    text = (f"operations ({ops['ops']:,} per operation; state API: {ops['ops'] // 2:,} keys; "
            f"best of {results['rounds']}; others' CPU {ops['others_cpu_share']:.0%})\n")
    text += table(["operation", "memory ops/s", "rocksdb ops/s", "rocksdb / memory"], rows)
    restore = results["restore"]
    best = restore["best_s"]
    text += (f"\n\nrestore from Kafka: {restore['keys']:,} keys ({restore['entries']:,} "
             f"entries, snapshot + {restore['tail_updates']:,} updates of tail); "
             f"others' CPU {restore['others_cpu_share']:.0%}\n")
    text += table(["", "seconds"], [[name, f"{seconds:.4f}"] for name, seconds in best.items()])
    text += (f"\nrestore into rocksdb / into memory: "
             f"{ratio_text(restore['restore_rocksdb_over_memory'])}"
             f"\nrestore into the local store / reattach it: "
             f"{ratio_text(restore['restore_over_reattach'])}")
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
    print()
    print(report(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
