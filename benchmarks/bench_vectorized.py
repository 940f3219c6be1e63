"""The vectorised stateful entry point against the per-key path, in process (no Spark).

The clickstream workload of issue #12 at 200,000 users: micro-batches of 100,000 events
(``examples.events.events``; per user: event count (value), total spent
(reducing), count per kind (map), last five pages (list); output user, events, spent).
Each batch is a pandas DataFrame with the columns Spark's driver adds (state key bytes,
key group, subtask), one subtask holding all 128 key groups, so a batch here is the
Python work of all of a batch's subtask tasks together. Sides, each on the same frames:

- **stateless** (the baseline, as in ``bench_streaming_overhead``): the same per-key
  structure without state: sort by user and ``seq``, ``groupby(user)``, and
  ``update_user``'s per-event loop on local variables per user
  (``bench_streaming_overhead.fold_user``), each user's rows a ``KeyRows`` as our
  per-key calls get them.
- **stateless_pandas_rows**: the same with each user's rows as pandas' ``groupby`` gives
  them (the baseline before per-key calls got ``KeyRows``), for comparison.
- **per_key**: ``SubtaskTask.run_function`` (what a Spark task runs for its subtask: sort,
  ``update_user`` per key with ``set_current_key`` and state objects, snapshot) on a
  backend over the in-memory changelog storage with the in-memory table, kept across
  batches.
- **vectorized**: the same ``SubtaskTask.run_function`` with ``vectorized=True`` and
  ``clickstream.update_users`` (once per batch: pandas/NumPy aggregates, bulk state).
- **vectorized_rocksdb**: the same with the RocksDB table (``--no-rocksdb`` skips it).

Batch 0 is a warm-up of every side (not measured); batches 1..N (default 3) are
measured, rotating which side goes first. A batch's time is the wall time of the call
(outputs as records, the checkpoint's changelog persisted to the in-memory storage);
this process's CPU time of the call is recorded beside it (less sensitive to other
load). Before the measured batches the benchmark waits for a quiet machine
(``BENCH_QUIET_WAIT_S``, ``BENCH_QUIET_SHARE``: see benchmarks/README.md).
After the last batch the per-key and vectorised sides must hold exactly the same state
(every key group's snapshot bytes) and have given exactly the same outputs per batch.

Target (issue #12): the vectorised entry point processes the 200k-user workload >= 5x
faster than the per-key stateless baseline (median batch time). ``BENCH_SCALE``
scales events and users (same events per user). Others' CPU share is recorded (on a
2-core machine shared with other jobs, absolute figures move by 2x and more).

Run: ``python -m benchmarks.bench_vectorized [--json FILE] [--batches N] [--no-rocksdb]``
(default ``benchmarks/results/vectorized.json``).
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd

from benchmarks.bench_streaming_overhead import fold_user
from benchmarks.common import (
    RESULTS_DIR,
    ForeignLoad,
    machine_info,
    ratio_text,
    scaled,
    table,
    verdict,
    wait_for_quiet,
    write_json,
)
from examples.clickstream import OUTPUT_COLUMNS, update_user, update_users
from examples.events import events
from kafka_changelog import InMemoryChangelogStorage, KeyGroupRange, key_group_for_key
from kafka_changelog.state.backend.config import StateBackendConfig
from kafka_changelog.state.backend.keyed_backend import ChangelogKeyedStateBackend
from kafka_changelog.state.host.acquire import AcquiredBackend
from kafka_changelog.state.host.subtask_backend import StateSource
from kafka_changelog.state.snapshots.snapshot_store import InMemorySnapshotStore
from spark_integration.streaming import StreamingStateConfig
from spark_integration.streaming.columns import KEY_COLUMN, KEY_GROUP_COLUMN, SUBTASK_COLUMN
from spark_integration.streaming.key_rows import KeyRows
from spark_integration.streaming.task import SubtaskTask

DEFAULT_JSON = RESULTS_DIR / "vectorized.json"
EVENTS_PER_BATCH = 100_000
USERS = 200_000
MAX_PARALLELISM = 128
TARGET = 5.0
STATELESS, PER_KEY, VECTORIZED, VECTORIZED_ROCKSDB = (
    "stateless", "per_key", "vectorized", "vectorized_rocksdb")
#: The baseline as it was before per-key calls got KeyRows: each user's rows as the
#: plain DataFrame pandas' groupby gives (``itertuples`` at pandas' own cost).
STATELESS_PANDAS_ROWS = "stateless_pandas_rows"


def batch_frames(batches: int, per_batch: int, users: int) -> list[pd.DataFrame]:
    """The batches as the Spark task gets them: user columns, then the state key, its
    key group and the subtask (0: one subtask owns every key group)."""
    stream = list(events(batches * per_batch, users))
    frames = []
    for start in range(0, len(stream), per_batch):
        frame = pd.DataFrame(stream[start:start + per_batch],
                             columns=["user", "seq", "kind", "page", "amount"])
        key_bytes = [u.encode() for u in frame["user"]]
        frame[KEY_COLUMN] = key_bytes
        frame[KEY_GROUP_COLUMN] = [key_group_for_key(k, MAX_PARALLELISM) for k in key_bytes]
        frame[SUBTASK_COLUMN] = 0
        frames.append(frame)
    return frames


def stateless_batch(rows: pd.DataFrame, key_rows: bool = True) -> list[dict[str, Any]]:
    """The baseline: per user, ``update_user``'s loop on local variables; each user's rows
    as our per-key calls get them (KeyRows), as the other baselines do, or (``key_rows``
    false) as pandas' groupby gives them."""
    data = rows[["user", "seq", "kind", "page", "amount"]].sort_values(["user", "seq"],
                                                                       kind="stable")
    wrap = KeyRows if key_rows else (lambda group: group)
    return [fold_user(wrap(group)) for _, group in data.groupby("user", sort=True)]


class StatefulSide:
    """A backend kept across batches and the task that runs one batch on it."""

    def __init__(self, vectorized: bool, table_kind: str, directory: str) -> None:
        self.vectorized = vectorized
        self.storage = InMemoryChangelogStorage()
        self.backend = ChangelogKeyedStateBackend(
            self.storage, InMemorySnapshotStore(), "bench", KeyGroupRange.of(0, 127),
            MAX_PARALLELISM, table=StateBackendConfig(table_kind, directory).create_table())
        self.config = StreamingStateConfig("bench", "bench", "unused:9092", parallelism=1,
                                           max_parallelism=MAX_PARALLELISM,
                                           materialization_interval_s=None)

    def run(self, batch_id: int, rows: pd.DataFrame) -> list[dict[str, Any]]:
        task = SubtaskTask(self.config, update_users if self.vectorized else update_user,
                            ["user"], ("seq",), batch_id or None, {}, batch_id + 1,
                            OUTPUT_COLUMNS, batch_id, vectorized=self.vectorized)
        outputs, _, _ = task.run_function(
            AcquiredBackend(self.backend, StateSource.REATTACHED, 0.0), rows, 0)
        self.backend.notify_checkpoint_complete(batch_id + 1)
        return outputs

    def state(self) -> dict[int, bytes]:
        table = self.backend.table
        return {kg: table.serialize_group(kg) for kg in table.key_groups()}

    def close(self) -> None:
        self.backend.close()
        self.storage.close()


def run(measured: int, rocksdb: bool) -> dict[str, Any]:
    per_batch = int(scaled(EVENTS_PER_BATCH, 1_000))
    users = int(scaled(USERS, 2_000))
    frames = batch_frames(measured + 1, per_batch, users)
    directory = tempfile.mkdtemp(prefix="bench-vectorized-")
    stateful = {PER_KEY: StatefulSide(False, "memory", directory),
                VECTORIZED: StatefulSide(True, "memory", directory)}
    if rocksdb:
        stateful[VECTORIZED_ROCKSDB] = StatefulSide(True, "rocksdb", directory)
    sides: dict[str, Callable[[int, pd.DataFrame], list[dict[str, Any]]]] = {
        STATELESS: lambda _, rows: stateless_batch(rows),
        STATELESS_PANDAS_ROWS: lambda _, rows: stateless_batch(rows, key_rows=False),
        **{name: side.run for name, side in stateful.items()}}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in stateful}
    keys = []
    quiet: dict[str, float] = {}
    load = ForeignLoad()
    try:
        for batch_id, rows in enumerate(frames):
            if batch_id == 1:  # after the warm-up
                quiet = wait_for_quiet(label="bench_vectorized: ")
                load = ForeignLoad()
            keys.append(int(rows["user"].nunique()))
            names = list(sides)
            order = names[batch_id % len(names):] + names[:batch_id % len(names)]
            for name in order:
                gc.collect()
                started, cpu_started = time.perf_counter(), time.process_time()
                produced = sides[name](batch_id, rows)
                took = time.perf_counter() - started
                if batch_id:
                    seconds[name].append(took)
                    cpu[name].append(time.process_time() - cpu_started)
                if name in outputs:
                    outputs[name].append(produced)
                print(f"  batch {batch_id} {name}: {took:.3f} s", flush=True)
        states = {name: side.state() for name, side in stateful.items()}
    finally:
        for side in stateful.values():
            side.close()
        shutil.rmtree(directory, ignore_errors=True)
    medians = {name: median(values) for name, values in seconds.items()}
    cpu_medians = {name: median(values) for name, values in cpu.items()}
    reference_state, reference_outputs = states[PER_KEY], outputs[PER_KEY]
    equal = {name: states[name] == reference_state and outputs[name] == reference_outputs
             for name in stateful if name != PER_KEY}
    speedup = medians[STATELESS] / medians[VECTORIZED]
    return {
        "name": "vectorized", "events_per_batch": per_batch, "users": users,
        "measured_batches": measured, "keys_per_batch": keys,
        "seconds": seconds, "median_s": medians,
        "cpu_seconds": cpu, "median_cpu_s": cpu_medians,
        "stateless_over_vectorized": speedup,
        "stateless_over_vectorized_cpu": cpu_medians[STATELESS] / cpu_medians[VECTORIZED],
        "stateless_pandas_rows_over_vectorized": (medians[STATELESS_PANDAS_ROWS]
                                                  / medians[VECTORIZED]),
        "per_key_over_vectorized": medians[PER_KEY] / medians[VECTORIZED],
        "per_key_over_stateless": medians[PER_KEY] / medians[STATELESS],
        "rocksdb_over_memory": (medians[VECTORIZED_ROCKSDB] / medians[VECTORIZED]
                                if rocksdb else None),
        "same_state_and_outputs_as_per_key": equal,
        "target": f"stateless / vectorized >= {TARGET}x",
        "result": verdict(speedup >= TARGET and all(equal.values())),
        "others_cpu_share": round(load.share(), 3),
        "quiet_wait": quiet,
    }


def report(results: dict[str, Any]) -> str:
    medians = results["median_s"]
    base = medians[STATELESS]
    cpu, cpu_base = results["median_cpu_s"], results["median_cpu_s"][STATELESS]
    rows = [[name, f"{m:.3f}", f"{results['events_per_batch'] / m:,.0f}", ratio_text(m / base),
             f"{cpu[name]:.3f}", ratio_text(cpu[name] / cpu_base)]
            for name, m in medians.items()]
    text = (f"{results['events_per_batch']:,} events per batch, {results['users']:,} users "
            f"({', '.join(f'{k:,}' for k in results['keys_per_batch'])} keys per batch); "
            f"median of {results['measured_batches']} batches; others' CPU "
            f"{results['others_cpu_share']:.0%}\n")
    text += table(["side", "median s", "events/s", "time / stateless", "CPU s",
                   "CPU / stateless"], rows)
    text += (f"\n\nper_key / stateless: {ratio_text(results['per_key_over_stateless'])}"
             f"\nper_key / vectorized: {ratio_text(results['per_key_over_vectorized'])}")
    if results["rocksdb_over_memory"] is not None:
        text += f"\nvectorized rocksdb / memory: {ratio_text(results['rocksdb_over_memory'])}"
    same = results["same_state_and_outputs_as_per_key"]
    text += ("\nsame state and outputs as per_key: "
             + ", ".join(f"{name} {'yes' if ok else 'NO'}" for name, ok in same.items()))
    text += (f"\nstateless / vectorized: {ratio_text(results['stateless_over_vectorized'])} "
             f"(CPU time: {ratio_text(results['stateless_over_vectorized_cpu'])}; target >= "
             f"{TARGET:.0f}x in time, state and outputs equal): {results['result']}")
    text += ("\nstateless with pandas' own rows (the baseline before KeyRows) / vectorized: "
             f"{ratio_text(results['stateless_pandas_rows_over_vectorized'])}")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write the results to this file")
    parser.add_argument("--batches", type=int, default=3, help="measured batches")
    parser.add_argument("--no-rocksdb", action="store_true",
                        help="skip the vectorised side on the RocksDB table")
    args = parser.parse_args(argv)
    results = run(args.batches, not args.no_rocksdb)
    results["machine"] = machine_info()
    print()
    print(report(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
