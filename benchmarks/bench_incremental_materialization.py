"""Materialization that costs what changed: delta layers against whole key groups.

One subtask's host-local RocksDB store (``kafka_changelog.state.host.host_store``, what every
streaming task runs) holds K keys of a 100-byte value state (``--keys``; ``BENCH_SCALE``
scales it), materialized once. Then, round after round, a task updates U random keys
(``--changed``, default 1% of K: they touch every key group, as random users do), takes
its checkpoint and starts the background materialization of its copy, which is written
at once and timed:

- **incremental** (what streaming does): each changed key group that has a snapshot gets
  a delta layer of its changed keys (a whole rewrite past 4 layers or half its size);
- **whole** (the baseline, the same round's work before delta layers): every changed key
  group written whole (the same job with no change epoch).

Rounds alternate (incremental, whole, ...), each applied by the next task; the figures
are the medians over the rounds of each kind: seconds and bytes written, and the ratio
incremental / whole. Then one more round's copy is written both ways, and the two
snapshots of the same state (delta layers on the previous whole round's key groups, and
whole key groups) are restored alone into RocksDB, in alternating rounds (best of each).
Every restore is checked: all K values equal the model.

Targets: incremental <= 0.2x whole in seconds at 1% changed; a restore through delta
layers <= 1.5x one of whole key groups.

Run: ``python -m benchmarks.bench_incremental_materialization [--keys K] [--changed U]
[--rounds N] [--json FILE]`` (default ``benchmarks/results/incremental_materialization.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.common import (
    MB,
    RESULTS_DIR,
    Broker,
    ForeignLoad,
    kafka_broker,
    machine_info,
    ratio_text,
    scaled,
    table,
    verdict,
    write_json,
)
from kafka_changelog import KeyGroupRange
from kafka_changelog.kafka import KafkaChangelogStorage
from kafka_changelog.kafka.snapshot_store import KafkaSnapshotStore
from kafka_changelog.state import BYTES, value_state
from kafka_changelog.state.backend.restore import restore_backend
from kafka_changelog.state.checkpoints.checkpoint import KeyedStateHandle, SubtaskState
from kafka_changelog.state.host import host_store
from kafka_changelog.state.host import store_materialization as jobs
from kafka_changelog.state.host.subtask_backend import CachedBackend
from kafka_changelog.state.rocksdb.table import RocksDBStateTable
from kafka_changelog.state.snapshots.materializer import MaterializationConfig
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.task import host_store_settings, placement_of

DEFAULT_JSON = RESULTS_DIR / "incremental_materialization.json"
VALUE = value_state("value", BYTES)
ALL = KeyGroupRange(0, 127)
EVERY_TASK = MaterializationConfig(interval_s=1e-6, start_jitter_s=0.0)
NEVER = MaterializationConfig(interval_s=None)
TARGET_TIME = 0.2
TARGET_RESTORE = 1.5


class Store:
    """One subtask run task by task on its local store, with the model of its state."""

    def __init__(self, broker: Broker, directory: Path) -> None:
        prefix = f"bench-incr-{uuid.uuid4().hex[:8]}"
        self.config = StreamingStateConfig(
            application=prefix, operator_id="op", bootstrap_servers=broker.bootstrap_servers,
            parallelism=1, changelog_topic=f"{prefix}-changelog",
            snapshot_topic=f"{prefix}-snapshots", checkpoint_topic=f"{prefix}-checkpoints",
            partitions=4, state_backend="rocksdb", local_state_dir=str(directory))
        broker.topics += [self.config.changelog_topic, self.config.snapshot_topic]
        self.storage = KafkaChangelogStorage(self.config.changelog())
        self.snapshots = KafkaSnapshotStore(self.config.snapshots())
        self.model: dict[bytes, bytes] = {}
        self.handles: dict[int, KeyedStateHandle] = {}
        self.cached: CachedBackend | None = None
        self.checkpoint = 0

    def task(self, keys: list[bytes], materialization: MaterializationConfig
             ) -> host_store.StoreHold:
        base = self.checkpoint or None
        self.checkpoint += 1
        settings = host_store_settings(self.config)
        assert settings is not None
        attached = host_store.attach(
            settings, placement_of(self.config, 0), base, [self.handles[base]] if base else [],
            self.cached, self.storage, self.snapshots, materialization)
        backend = attached.backend
        for key in keys:
            value = os.urandom(100)
            backend.set_current_key(key)
            backend.state(VALUE).update(value)
            self.model[key] = value
        handle = backend.snapshot(self.checkpoint).result(600)
        encoded = SubtaskState("op", 0, 1, handle, None).to_bytes()
        host_store.materialize_in_background(attached, self.checkpoint, encoded,
                                             materialization)
        self.cached = host_store.release(attached, self.checkpoint, encoded)
        self.handles[self.checkpoint] = handle
        return attached

    def restore_seconds(self, handle: KeyedStateHandle, directory: Path) -> float:
        """Restore ``handle`` (the state is the model's) into a fresh RocksDB table;
        checks every value."""
        shutil.rmtree(directory, ignore_errors=True)
        started = time.perf_counter()
        backend = restore_backend(self.storage, self.snapshots, "op", ALL, 128, [handle],
                                  table=RocksDBStateTable(directory))
        seconds = time.perf_counter() - started
        try:
            assert backend.state_rows() == len(self.model), backend.state_rows()
            state = backend.state(VALUE)
            for key, value in self.model.items():
                backend.set_current_key(key)
                if state.value() != value:
                    raise RuntimeError(f"key {key!r} restored wrong")
        finally:
            backend.close()
        return seconds

    def close(self) -> None:
        if self.cached is not None:
            self.cached.backend.close()
        self.snapshots.close()
        self.storage.close()


def _write(started: jobs.StartedJob, snapshots: KafkaSnapshotStore, whole: bool
           ) -> tuple[float, int]:
    if whole:
        started = dataclasses.replace(started, job=dataclasses.replace(started.job, epoch=None))
    begun = time.perf_counter()
    handle = jobs.run_job(started, snapshots)
    seconds = time.perf_counter() - begun
    if handle is None:
        raise RuntimeError("a materialization failed (see the log)")
    written = sum(c.size for c in handle.chunks
                  if c.materialization_id == started.job.materialization_id)
    return seconds, written


def run(broker: Broker, keys: int, changed: int, rounds: int) -> dict[str, Any]:
    load = ForeignLoad(broker.pids())
    directory = Path(tempfile.mkdtemp(prefix="bench-incremental-"))
    store = Store(broker, directory / "local")
    rng = random.Random(5)
    names = [f"user-{i:09d}".encode() for i in range(keys)]
    try:
        started = time.perf_counter()
        first = store.task(names, EVERY_TASK)
        assert first.started is not None
        first_s, first_bytes = _write(first.started, store.snapshots, whole=False)
        build_s = time.perf_counter() - started
        figures: dict[str, list[tuple[float, int]]] = {"incremental": [], "whole": []}
        for number in range(2 * rounds):
            kind = "incremental" if number % 2 == 0 else "whole"
            attached = store.task(rng.sample(names, changed), EVERY_TASK)
            assert attached.started is not None, "a materialization was due"
            figures[kind].append(_write(attached.started, store.snapshots,
                                        whole=kind == "whole"))
        # One more round, written from its copy both ways: two snapshots of the same state
        # (the model's), one of whole key groups, one with delta layers on top of the
        # previous whole round's; each restored alone, in alternating rounds.
        last = store.task(rng.sample(names, changed), EVERY_TASK)
        assert last.started is not None
        job = last.started.job
        copy = RocksDBStateTable(last.started.path / "db", track_changes=True)
        try:
            whole = jobs.write_snapshot(copy, dataclasses.replace(
                job, epoch=None, materialization_id=job.materialization_id + 1),
                store.snapshots)
        finally:
            copy.close()
        layered = jobs.run_job(last.started, store.snapshots)
        assert layered is not None and layered.layered and not whole.layered
        handles = {kind: KeyedStateHandle(job.backend_id, ALL, snapshot.materialization_id,
                                          snapshot, ())
                   for kind, snapshot in (("whole", whole), ("layered", layered))}
        restores: dict[str, list[float]] = {"whole": [], "layered": []}
        for _ in range(rounds):
            for kind, handle in handles.items():
                restores[kind].append(store.restore_seconds(handle, directory / "restored"))
        whole_restore, layered_restore = min(restores["whole"]), min(restores["layered"])
        share = load.share()
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)
    medians = {kind: (median(s for s, _ in runs), median(b for _, b in runs))
               for kind, runs in figures.items()}
    time_ratio = medians["incremental"][0] / medians["whole"][0]
    restore_ratio = layered_restore / whole_restore
    return {
        "name": "incremental_materialization", "keys": keys, "changed": changed,
        "rounds": rounds, "build_s": round(build_s, 2),
        "first_materialization": {"seconds": round(first_s, 3), "bytes": first_bytes},
        "runs": {kind: [{"seconds": round(s, 4), "bytes": b} for s, b in runs]
                 for kind, runs in figures.items()},
        "median_seconds": {k: round(v[0], 4) for k, v in medians.items()},
        "median_bytes": {k: v[1] for k, v in medians.items()},
        "time_ratio": time_ratio,
        "restore_s": {"whole": round(whole_restore, 3), "layered": round(layered_restore, 3)},
        "restore_ratio": restore_ratio,
        "targets": [
            {"target": f"incremental <= {TARGET_TIME}x whole (seconds)",
             "value": round(time_ratio, 4), "pass": time_ratio <= TARGET_TIME},
            {"target": f"restore through delta layers <= {TARGET_RESTORE}x whole",
             "value": round(restore_ratio, 3), "pass": restore_ratio <= TARGET_RESTORE},
        ],
        "others_cpu_share": round(share, 3),
    }


def report(results: dict[str, Any]) -> str:
    seconds, written = results["median_seconds"], results["median_bytes"]
    text = (f"{results['keys']:,} keys of 100 B in one subtask store, {results['changed']:,} "
            f"changed per round, {results['rounds']} rounds of each kind (others' CPU "
            f"{results['others_cpu_share']:.0%}); first materialization "
            f"{results['first_materialization']['seconds']:.2f} s, "
            f"{results['first_materialization']['bytes'] / MB:.1f} MB\n")
    text += table(["materialization", "median seconds", "median MB written"],
                  [[kind, f"{seconds[kind]:.3f}", f"{written[kind] / MB:.2f}"]
                   for kind in ("incremental", "whole")])
    text += (f"\nincremental / whole: {ratio_text(results['time_ratio'])}; restore through "
             f"delta layers {results['restore_s']['layered']:.2f} s against whole key "
             f"groups {results['restore_s']['whole']:.2f} s: "
             f"{ratio_text(results['restore_ratio'])}\n\ntargets:\n")
    text += "\n".join(f"  {verdict(t['pass'])}  {t['target']} ({t['value']})"
                      for t in results["targets"])
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=None, help="keys in the store")
    parser.add_argument("--changed", type=int, default=None,
                        help="keys changed per round (default: 1%% of the keys)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    keys = args.keys or int(scaled(500_000))
    changed = args.changed or max(1, keys // 100)
    with kafka_broker() as broker:
        results = run(broker, keys, changed, args.rounds)
    results["machine"] = machine_info()
    print()
    print(report(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
