"""State larger than a Python worker's memory: 10M keys of ~100 B through the streaming path
with ``state_backend="rocksdb"`` and Python workers capped at 1 GiB.

Spark ``local[2]`` with ``spark.executor.pyspark.memory=1g``: PySpark's worker then sets
``RLIMIT_AS`` (its address space) to 1 GiB in every Python worker, also in local mode
(checked: each worker's ``/proc/<pid>/limits`` is read and reported). That limit counts
virtual memory, which native libraries reserve far beyond what they use: glibc gives every
thread that allocates a 64 MiB malloc arena, and every thread's stack (8 MiB by default)
counts in full; a worker runs ~25 threads (librdkafka's and RocksDB's, the backends'
timers). So the workers run with ``MALLOC_ARENA_MAX=2`` (set in this process's environment,
which local mode's workers inherit) and a 2 MiB ``RLIMIT_STACK`` (glibc's default thread
stack size; set while Spark's JVM starts, which passes it on to the workers). Without them
a worker reserves ~750 MiB before it holds much state, and a first run with 8 MiB stacks
lost both Python workers at 7.0M keys (C++ ``terminate called without an active
exception``, from RocksDB, most likely out of address space). What the state costs is
measured as resident memory: a thread on the driver samples every Python worker's RSS (and
VMS) every 0.25 s.

The stateful function (:func:`remember`) keeps one value per key, a ~100-character string
(``profile``): it reads the key's value, then writes the row's payload. No output rows.
Input batches are static DataFrames made by Spark (``spark.range``), handed to the
processor the way ``foreachBatch`` does (``processor(df, batch_id)``):

1. **build**: ``--keys`` (default 10,000,000 at ``BENCH_SCALE=1``) new keys in
   ``--batches`` batches of equal size (default 50: 200,000 keys each);
2. **update**: ``--update-batches`` (default 3) batches of the same size over keys spread
   over the whole key space (every key exists: read-modify-write at full size).

Parallelism 2 (two subtasks, ~5M keys each), 128 key groups, materialization every
``--materialize-every`` seconds (default 300). Per batch: seconds, keys in state, what
each subtask's state came from (``state_source``), materializations, the Python
workers' peak RSS during the batch. Figures:

- **capped run**: every batch done with the cap in effect, and the workers' peak RSS;
- **batch cost follows the batch**: median seconds of the last 5 build batches / of
  build batches 2-6 (the same number of keys each, 40x more state), batches that started
  or completed a materialization excluded (a materialization writes the changed state:
  O(state), reported apart); target <= 1.2x;
- **the in-memory backend** (``--memory-probe-keys``, default 1,000,000, afterwards in a
  new capped session, so in new Python workers): the workers' RSS growth per key of
  state, projected to the keys a worker would hold at full size (one subtask's, and
  both: a worker keeps every subtask it ran), against the 1 GiB cap. (``--skip-large``
  runs only this part, keeping the large run's results in the ``--json`` file.)

Run: ``PYTHONPATH=. python -m benchmarks.bench_large_state [--keys N] [--batches N]
[--json FILE]`` (default ``benchmarks/results/large_state.json``; ``BENCH_SCALE`` scales
``--keys``; ``PYTHONPATH`` must name this checkout: Spark's Python workers import the
library from there). The local state directory (a temporary directory) is deleted at the
end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import psutil

from benchmarks.common import (
    RESULTS_DIR,
    Broker,
    MiB,
    kafka_broker,
    machine_info,
    ratio_text,
    scaled,
    table,
    unique_topic,
    verdict,
    write_json,
)
from kafka_changelog.state.schema.descriptors import value_state
from kafka_changelog.state.schema.serializers import UTF8
from spark_integration.streaming import (
    KeyState,
    StatefulProcessor,
    StreamingStateConfig,
    stateful_foreach_batch,
)

DEFAULT_JSON = RESULTS_DIR / "large_state.json"
KEYS = 10_000_000
BATCHES = 50
UPDATE_BATCHES = 3
PARALLELISM = 2
PARTITIONS = 16
MAX_PARALLELISM = 128
PAYLOAD_CHARS = 100
CAP = "1g"
CAP_BYTES = 1 << 30
GROWTH_TARGET = 1.2
MEMORY_PROBE_KEYS = 1_000_000
MEMORY_PROBE_BATCHES = 4
PROFILE = value_state("profile", UTF8)
#: The Python workers' ``RLIMIT_STACK``: glibc makes it every new thread's stack size, and
#: each thread's stack counts in full against ``RLIMIT_AS`` (8 MiB by default; a worker
#: runs ~25 threads: Kafka clients, RocksDB, the backends' timers).
THREAD_STACK = 2 << 20
#: Keys of the update batches: key ``(i * STRIDE + offset) % keys`` (STRIDE is prime, so
#: the keys of one batch are distinct and spread over every key group).
STRIDE = 1_000_003


def remember(key: Any, rows: Any, state: KeyState) -> None:
    """Keep the key's latest payload (~100 characters); read what was there first."""
    profile = state(PROFILE)
    profile.value()
    profile.update(rows["payload"].iloc[-1])


# -- the Python workers' memory ----------------------------------------------------------------


@dataclass
class WorkerMemory:
    """Every Python worker's RSS and VMS, sampled from the driver."""

    interval_s: float = 0.25
    peak_rss: dict[int, int] = field(default_factory=dict)
    peak_vms: dict[int, int] = field(default_factory=dict)
    limits: dict[int, str] = field(default_factory=dict)
    window_rss: int = 0
    window_vms: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="worker-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def take_window(self) -> tuple[int, int]:
        """The largest RSS and VMS of any Python worker since the last call."""
        peak = (self.window_rss, self.window_vms)
        self.window_rss = self.window_vms = 0
        return peak

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for process in _python_workers():
                try:
                    info = process.memory_info()
                except psutil.Error:
                    continue
                pid = process.pid
                self.peak_rss[pid] = max(self.peak_rss.get(pid, 0), info.rss)
                self.peak_vms[pid] = max(self.peak_vms.get(pid, 0), info.vms)
                self.window_rss = max(self.window_rss, info.rss)
                self.window_vms = max(self.window_vms, info.vms)
                # A worker sets its limit when its first task starts: read it every time.
                self.limits[pid] = _address_space_limit(pid)


def _python_workers() -> list[psutil.Process]:
    """PySpark's Python workers under this process (forked by a ``pyspark.daemon``, whose
    parent is Spark's JVM; the daemon itself is not a worker)."""
    workers = []
    for process in psutil.Process().children(recursive=True):
        try:
            if ("pyspark.daemon" in " ".join(process.cmdline())
                    and "pyspark.daemon" in " ".join(process.parent().cmdline())):
                workers.append(process)
        except (psutil.Error, AttributeError):
            continue
    return workers


def _address_space_limit(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max address space"):
                return line.split()[3]  # soft limit, bytes or "unlimited"
    except OSError:
        pass
    return "?"


# -- batches -----------------------------------------------------------------------------------


def build_batch(spark: Any, first: int, count: int, salt: str) -> Any:
    """Keys ``first .. first + count - 1`` with a payload each."""
    from pyspark.sql import functions as F

    return spark.range(first, first + count, numPartitions=PARALLELISM).select(
        F.format_string("user-%09d", F.col("id")).alias("user"),
        F.substring(F.sha2(F.concat(F.col("id").cast("string"), F.lit(salt)), 512), 1,
                    PAYLOAD_CHARS).alias("payload"))


def update_batch(spark: Any, keys: int, count: int, offset: int, salt: str) -> Any:
    """``count`` distinct existing keys spread over the whole key space."""
    from pyspark.sql import functions as F

    key = (F.col("id") * STRIDE + offset) % keys
    return spark.range(0, count, numPartitions=PARALLELISM).select(
        F.format_string("user-%09d", key).alias("user"),
        F.substring(F.sha2(F.concat(key.cast("string"), F.lit(salt)), 512), 1,
                    PAYLOAD_CHARS).alias("payload"))


@dataclass
class Batch:
    """One batch through the processor."""

    phase: str
    batch_id: int
    keys_in: int
    seconds: float
    task_s: float
    state_rows: int
    sources: list[str]
    materializations_started: int
    materializations_completed: int
    materialized_bytes: int
    worker_peak_rss: int
    worker_peak_vms: int


def run_batch(processor: StatefulProcessor, df: Any, batch_id: int, phase: str,
              keys_in: int, memory: WorkerMemory) -> Batch:
    memory.take_window()
    started = time.perf_counter()
    processor(df, batch_id)
    seconds = time.perf_counter() - started
    report = processor.reports[-1]
    metrics = [report.subtask_metrics[s] for s in sorted(report.subtask_metrics)]
    if not report.committed or sum(m.keys for m in metrics) != keys_in:
        raise RuntimeError(f"batch {batch_id}: {report}")
    return Batch(phase, batch_id, keys_in, seconds, report.task_s,
                 sum(m.state_rows for m in metrics), [m.state_source for m in metrics],
                 sum(m.materializations_started for m in metrics),
                 sum(m.materializations_completed for m in metrics),
                 sum(m.materialized_bytes for m in metrics), *memory.take_window())


def state_config(broker: Broker, backend: str, local_dir: str,
                 materialize_every: float | None) -> StreamingStateConfig:
    topics = {name: unique_topic(f"large-{backend}-{name}")
              for name in ("changelog", "snapshots", "checkpoints")}
    broker.topics.extend(topics.values())
    return StreamingStateConfig(
        application=f"bench-large-{backend}-{uuid.uuid4().hex[:8]}", operator_id="profiles",
        bootstrap_servers=broker.bootstrap_servers,
        client_config={k: v for k, v in broker.client_config.items()
                       if k != "bootstrap.servers"},
        changelog_topic=topics["changelog"], snapshot_topic=topics["snapshots"],
        checkpoint_topic=topics["checkpoints"], partitions=PARTITIONS,
        max_parallelism=MAX_PARALLELISM, parallelism=PARALLELISM,
        materialization_interval_s=materialize_every, state_backend=backend,
        local_state_dir=local_dir)


def print_batch(batch: Batch) -> None:
    print(f"  {batch.phase:6s} batch {batch.batch_id:3d}: {batch.seconds:6.2f} s "
          f"(task {batch.task_s:6.2f}) state {batch.state_rows:>11,} keys, "
          f"{'/'.join(batch.sources):30s} materializations {batch.materializations_started}"
          f"/{batch.materializations_completed} ({batch.materialized_bytes / MiB:,.0f} MiB), "
          f"workers' RSS <= {batch.worker_peak_rss / MiB:,.0f} MiB, VMS <= "
          f"{batch.worker_peak_vms / MiB:,.0f} MiB", flush=True)


def large_run(broker: Broker, spark: Any, keys: int, batches: int, update_batches: int,
              materialize_every: float | None, memory: WorkerMemory) -> dict[str, Any]:
    per_batch = keys // batches
    local_dir = tempfile.mkdtemp(prefix="bench-large-state-")
    config = state_config(broker, "rocksdb", local_dir, materialize_every)
    processor = stateful_foreach_batch(config, remember, "user", "user string")
    runs: list[Batch] = []
    print(f"\n[large state, rocksdb] {keys:,} keys in {batches} batches of {per_batch:,}, "
          f"then {update_batches} update batches; local state in {local_dir}", flush=True)
    started = time.perf_counter()
    failure = ""
    largest: dict[str, Any] = {}
    try:
        plan = [("build", number) for number in range(batches)] + [
            ("update", number) for number in range(update_batches)]
        for phase, number in plan:
            if phase == "build":
                df = build_batch(spark, number * per_batch, per_batch, "build")
                batch_id = number
            else:
                df = update_batch(spark, per_batch * batches, per_batch, 7 + number * 13,
                                  f"update-{number}")
                batch_id = batches + number
            try:
                runs.append(run_batch(processor, df, batch_id, phase, per_batch, memory))
            except Exception as exc:  # a worker that hit the cap: recorded, not raised
                failure = f"batch {batch_id}: {type(exc).__name__}: " + (
                    str(exc).strip().splitlines() or [""])[0][:300]
                print(f"  {phase:6s} batch {batch_id:3d} FAILED: {failure}", flush=True)
                break
            print_batch(runs[-1])
            mapped = _largest_worker_maps()
            if mapped.get("vms_mib", 0) >= largest.get("vms_mib", 0):
                largest = mapped
        disk = _disk_bytes(local_dir)
    finally:
        processor.close()
        shutil.rmtree(local_dir, ignore_errors=True)
    total_s = time.perf_counter() - started
    build = [b for b in runs if b.phase == "build"] or runs
    if not build:
        raise RuntimeError(f"no batch ran: {failure}")
    quiet = [b for b in build[1:] if not b.materializations_started
             and not b.materializations_completed] or build[1:] or build
    early, late = quiet[:5], quiet[-5:]
    growth = median(b.seconds for b in late) / median(b.seconds for b in early)
    final_rows = runs[-1].state_rows
    peak = max(memory.peak_rss.values(), default=0)
    capped = bool(memory.limits) and all(v == str(CAP_BYTES) for v in memory.limits.values())
    return {
        "keys": per_batch * batches, "batches": batches, "keys_per_batch": per_batch,
        "failure": failure, "largest_worker_mappings": largest,
        "final_state_rows": final_rows, "total_s": total_s, "local_disk_bytes": disk,
        "runs": [asdict(b) for b in runs],
        "worker_peak_rss": peak, "worker_peak_vms": max(memory.peak_vms.values(), default=0),
        "worker_address_space_limits": sorted(set(memory.limits.values())),
        "capped": capped,
        "capped_verdict": verdict(capped and not failure
                                  and final_rows == per_batch * batches and peak < CAP_BYTES),
        "growth": {"early_batches": [b.batch_id for b in early],
                   "late_batches": [b.batch_id for b in late],
                   "early_median_s": median(b.seconds for b in early),
                   "late_median_s": median(b.seconds for b in late),
                   "ratio": growth, "target": GROWTH_TARGET,
                   "verdict": verdict(growth <= GROWTH_TARGET)},
        "update_median_s": median(b.seconds for b in runs if b.phase == "update")
        if any(b.phase == "update" for b in runs) else None,
        "materializing_batches": [asdict(b) for b in build if b.materializations_started
                                  or b.materializations_completed],
        "restored_subtask_batches": sum(s == "restored" for b in runs for s in b.sources),
    }


def _largest_worker_maps() -> dict[str, Any]:
    """Where the address space of the Python worker with the most of it goes: the heap,
    thread stacks (anonymous 8 MiB mappings), malloc arenas (64 MiB), other anonymous
    memory and files."""
    best: tuple[int, int] | None = None
    for process in _python_workers():
        try:
            vms = process.memory_info().vms
        except psutil.Error:
            continue
        if best is None or vms > best[1]:
            best = (process.pid, vms)
    if best is None:
        return {}
    summary = {"pid": best[0], "vms_mib": best[1] >> 20, "heap_mib": 0, "stacks": 0,
               "arenas": 0, "anon_other_mib": 0, "files_mib": 0}
    try:
        lines = Path(f"/proc/{best[0]}/maps").read_text().splitlines()
    except OSError:
        return summary
    for line in lines:
        parts = line.split()
        low, high = (int(x, 16) for x in parts[0].split("-"))
        size = high - low
        name = parts[5] if len(parts) > 5 else ""
        if name == "[heap]":
            summary["heap_mib"] += size >> 20
        elif name.startswith("/"):
            summary["files_mib"] += size >> 20
        elif not name and 8 << 20 <= size <= (8 << 20) + (64 << 10):
            summary["stacks"] += 1
        elif not name and 60 << 20 <= size <= 64 << 20:
            summary["arenas"] += 1
        elif not name:
            summary["anon_other_mib"] += size >> 20
    return summary


def _disk_bytes(directory: str) -> int:
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())


def memory_probe(broker: Broker, spark: Any, keys: int, memory: WorkerMemory,
                 projected_keys: int) -> dict[str, Any]:
    """The in-memory backend's worker RSS per key (uncapped session, smaller state)."""
    batches = MEMORY_PROBE_BATCHES
    per_batch = keys // batches
    config = state_config(broker, "memory", tempfile.gettempdir(), None)
    processor = stateful_foreach_batch(config, remember, "user", "user string")
    print(f"\n[in-memory backend probe] {per_batch * batches:,} keys in {batches} batches",
          flush=True)
    points: list[tuple[int, int, int]] = []
    try:
        for number in range(batches):
            df = build_batch(spark, number * per_batch, per_batch, "probe")
            batch = run_batch(processor, df, number, "memory", per_batch, memory)
            print_batch(batch)
            time.sleep(2 * memory.interval_s)
            points.append((batch.state_rows, *_workers_rss_now()))
    finally:
        processor.close()
    # The workers' summed RSS growth per key of state: a subtask that moved to the other
    # worker is restored there while the first still caches it, so keys can count twice.
    (rows0, total0, smallest0), (rows1, total1, _) = points[0], points[-1]
    per_key = (total1 - total0) / max(1, rows1 - rows0)
    # The table alone per key (in this process), and a worker without state: the smallest
    # worker at the first batch less the table of its subtask's keys then.
    table_per_key = table_bytes_per_key(per_batch * batches)
    base = max(0.0, smallest0 - table_per_key * rows0 / PARALLELISM)
    one = base + table_per_key * projected_keys / PARALLELISM
    return {"keys": per_batch * batches, "points": points, "rss_bytes_per_key": per_key,
            "table_bytes_per_key": table_per_key, "worker_base_rss": base,
            "projected_keys": projected_keys,
            "projected_worker_rss_one_subtask": one,
            "projected_worker_rss_both_subtasks": base + table_per_key * projected_keys,
            "exceeds_cap": one > CAP_BYTES}


def table_bytes_per_key(keys: int) -> float:
    """Memory of the in-memory table per key of this benchmark's state, measured in this
    process (RSS growth while a ``StateTable`` takes ``keys`` such keys): the lower bound
    of what a worker holding them needs, without Spark or the backend around it."""
    import gc
    import hashlib

    from kafka_changelog import key_group_for_key
    from kafka_changelog.state.schema.descriptors import StateKind
    from kafka_changelog.state.schema.ops import OpKind, StateMeta, StateOp
    from kafka_changelog.state.tables.memory import StateTable

    table = StateTable()
    table.register(StateMeta(PROFILE.name, StateKind.VALUE, "utf8"))
    gc.collect()
    before = psutil.Process().memory_info().rss
    for i in range(keys):
        key = f"user-{i:09d}".encode()
        value = hashlib.sha512(key).hexdigest()[:PAYLOAD_CHARS].encode()
        table.apply(key_group_for_key(key, MAX_PARALLELISM),
                    StateOp(PROFILE.name, OpKind.SET, key, value=value))
    gc.collect()
    grown: int = psutil.Process().memory_info().rss - before
    del table
    return grown / keys


def _workers_rss_now() -> tuple[int, int]:
    """The Python workers' summed RSS now, and the smallest worker's."""
    sizes = []
    for process in _python_workers():
        try:
            sizes.append(process.memory_info().rss)
        except psutil.Error:
            continue
    return sum(sizes), min(sizes, default=0)


def start_spark() -> Any:
    """``local[2]`` with the Python workers' memory capped, started with a thread stack
    size of ``THREAD_STACK`` (Spark's JVM, and through it the Python workers, inherit it)."""
    import resource

    from spark_integration.sessions.session import local_session

    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    resource.setrlimit(resource.RLIMIT_STACK, (THREAD_STACK, hard))
    try:
        return local_session("bench-large-state", parallelism=PARALLELISM, extra_config={
            "spark.ui.showConsoleProgress": "false", "spark.executor.pyspark.memory": CAP})
    finally:
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))


def report(results: dict[str, Any]) -> str:
    large = results["large"]
    growth = large["growth"]
    rows = [
        ["keys in state (rocksdb, 2 subtasks)", f"{large['final_state_rows']:,}", "",
         "10M keys of ~100 B", ""],
        *([["FAILED", large["failure"][:80], "", "", "MISS"]] if large["failure"] else []),
        ["largest worker's address space", ", ".join(
            f"{k} {v}" for k, v in large["largest_worker_mappings"].items() if k != "pid"),
         "", "", ""],
        ["Python workers' address space limit",
         ", ".join(large["worker_address_space_limits"]), "", "1 GiB (RLIMIT_AS)", ""],
        ["Python workers' peak RSS / VMS",
         f"{large['worker_peak_rss'] / MiB:,.0f} / {large['worker_peak_vms'] / MiB:,.0f} MiB",
         "", "< 1024 MiB", large["capped_verdict"]],
        ["batch seconds, last 5 / build batches 2-6",
         f"{growth['late_median_s']:.2f} / {growth['early_median_s']:.2f}",
         ratio_text(growth["ratio"]), f"<= {growth['target']}x", growth["verdict"]],
    ]
    if large["update_median_s"] is not None:
        rows.append(["update batch at full state (median)", f"{large['update_median_s']:.2f} s",
                     "", "", ""])
    for batch in large["materializing_batches"]:
        rows.append([f"batch {batch['batch_id']} with materialization",
                     f"{batch['seconds']:.2f} s, {batch['materialized_bytes'] / MiB:,.0f} MiB",
                     "", "", ""])
    probe = results.get("memory_probe")
    if probe:
        rows.append(["in-memory backend: workers' summed RSS growth per key",
                     f"{probe['rss_bytes_per_key']:.0f} B", "", "", ""])
        rows.append(["in-memory table alone, per key (in process)",
                     f"{probe['table_bytes_per_key']:.0f} B", "", "", ""])
        rows.append([f"in-memory, a worker holding one subtask of {probe['projected_keys']:,} "
                     "keys", f"{probe['projected_worker_rss_one_subtask'] / MiB:,.0f} MiB ("
                     f"{probe['worker_base_rss'] / MiB:,.0f} MiB without state; both "
                     f"subtasks: {probe['projected_worker_rss_both_subtasks'] / MiB:,.0f} "
                     "MiB)", "", "> 1024 MiB", verdict(probe["exceeds_cap"])])
    return table(["", "measured", "ratio", "target", "result"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--keys", type=int, default=None,
                        help=f"keys to build (default {KEYS:,} x BENCH_SCALE)")
    parser.add_argument("--batches", type=int, default=BATCHES)
    parser.add_argument("--update-batches", type=int, default=UPDATE_BATCHES)
    parser.add_argument("--materialize-every", type=float, default=300.0,
                        help="materialization interval in seconds (0: never)")
    parser.add_argument("--memory-probe-keys", type=int, default=MEMORY_PROBE_KEYS,
                        help="keys of the in-memory backend probe (0: skip it)")
    parser.add_argument("--skip-large", action="store_true",
                        help="run the in-memory probe only, keeping the large run of --json")
    args = parser.parse_args(argv)
    keys = args.keys or int(scaled(KEYS, minimum=10_000))
    # Local mode's Python workers inherit this process's environment: fewer malloc
    # arenas, so that RLIMIT_AS (virtual memory) is not spent on reservations.
    os.environ["MALLOC_ARENA_MAX"] = "2"
    memory = WorkerMemory()
    memory.start()
    results: dict[str, Any] = {"name": "large_state", "cap": CAP,
                               "malloc_arena_max": os.environ["MALLOC_ARENA_MAX"]}
    started = time.perf_counter()
    if args.skip_large:  # keep the large run of an earlier run of the same file
        results = json.loads(args.json.read_text(encoding="utf-8"))
        results.pop("memory_probe", None)
    try:
        with kafka_broker() as broker:
            if not args.skip_large:
                spark = start_spark()
                try:
                    results["large"] = large_run(broker, spark, keys, args.batches,
                                                 args.update_batches,
                                                 args.materialize_every or None, memory)
                finally:
                    spark.stop()
            if args.memory_probe_keys:
                # A new session: new Python workers, which hold nothing yet.
                spark = start_spark()
                try:
                    results["memory_probe"] = memory_probe(
                        broker, spark, args.memory_probe_keys, memory,
                        results["large"]["keys"])
                finally:
                    spark.stop()
            results["machine"] = machine_info()
    finally:
        memory.stop()
    results["probe_s" if args.skip_large else "total_s"] = time.perf_counter() - started
    print(f"\nlarge state ({results['total_s'] / 60:.1f} min in all)")
    print(report(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
