"""Timers of many keys at once: ``register_many``/``delete_many`` against key-by-key calls.

The vectorised function's ``state.timers.register_event_time(keys, times)`` (and the
deletes) used to loop over the keys in Python: ``set_current_key`` and one
``register``/``delete`` per key, each buffered and logged as the key changed. They now
write all the keys' timers in one ``mutate_columns`` of the timers state. No broker, no
Spark: CPU only, in this process.

Method. A session-style batch of ``KEYS`` keys (10,000 at ``BENCH_SCALE=1``): each key's
timer at its old session end is deleted and one at its new end registered, as
``examples/sessions`` does for every key of a batch. Sides, on fresh backends over the
in-memory changelog storage (tables: in memory, and RocksDB):

- **per_key** (the baseline, the former path): per key ``set_current_key(key, group)``,
  ``timers.delete(EVENT_TIME, old)``, ``timers.register(EVENT_TIME, new)``;
- **bulk**: ``timers.delete_many`` then ``timers.register_many`` over the same columns.

Each round first registers every key's old timer (not measured), then times one side's
batch plus the persist of its changes (``snapshot``: the changelog flushed to the
storage). Rounds alternate sides; the fastest of ``--rounds`` (default 5) counts. Before
timing, both sides must leave the same timers state. Ratio: per_key seconds / bulk
seconds (higher is better). Target (issue #40, "timers in bulk"): >= 3x on both tables.

Run: ``python -m benchmarks.bench_bulk_timers [--json FILE] [--rounds N]`` (default
``benchmarks/results/bulk_timers.json``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    ForeignLoad,
    machine_info,
    ratio_text,
    scaled,
    table,
    wait_for_quiet,
    write_json,
)
from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange, key_group_for_key
from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
from kafka_changelog.state.time.timers import TIMERS_STATE, TimeDomain

DEFAULT_JSON = RESULTS_DIR / "bulk_timers.json"
MAX_PARALLELISM = 128
TARGET_RATIO = 3.0
T0 = 1_700_000_000_000
GAP_MS = 30 * 60_000

Batch = tuple[list[int], list[bytes], list[int], list[int]]


def batch(keys: int) -> Batch:
    """Key groups, key bytes, old and new timer times of ``keys`` users."""
    key_bytes = [f"user-{i:06d}".encode() for i in range(keys)]
    groups = [key_group_for_key(k, MAX_PARALLELISM) for k in key_bytes]
    old = [T0 + i % 977 * 1_000 + GAP_MS for i in range(keys)]
    return groups, key_bytes, old, [t + 60_000 for t in old]


def new_backend(kind: str, directory: str) -> ChangelogKeyedStateBackend:
    table = StateBackendConfig(kind, directory).create_table()
    return ChangelogKeyedStateBackend(InMemoryChangelogStorage(), InMemorySnapshotStore(), "op",
                                      KeyGroupRange.of(0, MAX_PARALLELISM - 1),
                                      MAX_PARALLELISM, table=table)


def per_key(backend: ChangelogKeyedStateBackend, work: Batch) -> None:
    groups, keys, old, new = work
    timers = backend.timers
    for group, key, before, after in zip(groups, keys, old, new, strict=True):
        backend.set_current_key(key, group)
        timers.delete(TimeDomain.EVENT_TIME, before)
        timers.register(TimeDomain.EVENT_TIME, after)


def bulk(backend: ChangelogKeyedStateBackend, work: Batch) -> None:
    groups, keys, old, new = work
    backend.timers.delete_many(TimeDomain.EVENT_TIME, groups, keys, old)
    backend.timers.register_many(TimeDomain.EVENT_TIME, groups, keys, new)


SIDES: dict[str, Callable[[ChangelogKeyedStateBackend, Batch], None]] = {
    "per_key": per_key, "bulk": bulk}


def timed_round(kind: str, side: str, work: Batch, checkpoint: int) -> tuple[float, Any]:
    """Seconds of one side's batch and persist, on a backend holding the old timers; the
    timers state it leaves."""
    groups, keys, old, _ = work
    with tempfile.TemporaryDirectory() as directory:
        backend = new_backend(kind, directory)
        try:
            backend.timers.register_many(TimeDomain.EVENT_TIME, groups, keys, old)
            backend.snapshot(checkpoint).result(60)
            started = time.perf_counter()
            SIDES[side](backend, work)
            backend.snapshot(checkpoint + 1).result(60)
            seconds = time.perf_counter() - started
            table = backend.table
            timers = sorted((key, bytes(map_key)) for group in table.key_groups()
                            for name, key, entry in table.entries(group) if name == TIMERS_STATE
                            for map_key in entry)
            return seconds, timers
        finally:
            backend.close()


def run(rounds: int) -> dict[str, Any]:
    keys = int(scaled(10_000, 100))
    work = batch(keys)
    wait_for_quiet(label="bulk timers")
    load = ForeignLoad()
    cases = []
    for kind in ("memory", "rocksdb"):
        best: dict[str, float] = {}
        states: dict[str, Any] = {}
        for number in range(rounds):
            order = ("per_key", "bulk") if number % 2 == 0 else ("bulk", "per_key")
            for side in order:
                seconds, states[side] = timed_round(kind, side, work, 1)
                best[side] = min(best.get(side, seconds), seconds)
        if states["per_key"] != states["bulk"]:
            raise AssertionError(f"{kind}: the bulk timers state differs from the per-key one")
        ratio = best["per_key"] / best["bulk"]
        cases.append({"table": kind, "keys": keys, "per_key_s": round(best["per_key"], 4),
                      "bulk_s": round(best["bulk"], 4), "ratio": round(ratio, 3),
                      "verdict": "PASS" if ratio >= TARGET_RATIO else "MISS"})
    return {"benchmark": "bulk_timers", "target_ratio": TARGET_RATIO, "rounds": rounds,
            "cases": cases, "others_cpu_share": round(load.share(), 3),
            "machine": machine_info()}


def report(results: dict[str, Any]) -> str:
    rows = [[c["table"], str(c["keys"]), f"{c['per_key_s'] * 1000:.1f} ms",
             f"{c['bulk_s'] * 1000:.1f} ms", ratio_text(c["ratio"]), c["verdict"]]
            for c in results["cases"]]
    return (table(["table", "keys", "per key", "bulk", "per key / bulk", "target >= 3x"], rows)
            + f"\nothers' CPU share: {results['others_cpu_share']:.0%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    results = run(args.rounds)
    write_json(args.json, results)
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
