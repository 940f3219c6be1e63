"""Streaming overhead: the stateful ``foreachBatch`` path against the same work without state.

The clickstream job's function (:func:`examples.clickstream.update_user`:
per user, the number of events, the total spent, a count per event kind and the
last five pages) runs on micro-batches of 1,000 and 100,000 events from 2,000 users
(``BENCH_SCALE`` scales the events and the users, so events per user stay the same;
at least 100 users) in a ``local[2]`` session. No streaming query runs: each
micro-batch is a static DataFrame (``spark.createDataFrame`` of
``examples.events.events``; columns user, seq, kind, page, amount; built before any
timing, new events every batch, ``seq`` increasing across batches) handed to the
function the way ``foreachBatch`` does, ``f(df, batch_id)`` for batch ids 0, 1, 2...

- **stateful**: the processor of ``stateful_foreach_batch(config, update_user,
  "user", OUTPUT_SCHEMA, order_by=["seq"])``, no sink, parallelism 2, 128 key
  groups, 8-partition topics, no materialization: per batch, one Spark job of one
  task per subtask (backends cached in the Python workers, changelog persisted to
  Kafka), then the checkpoint commit on the driver.
- **stateless** (the baseline): the same work without state, laid out the same way:
  rows bucketed like the stateful path's subtasks (``BUCKET_EXPR``),
  ``groupBy(bucket).applyInPandas(fn, OUTPUT_SCHEMA).toPandas()``, where ``fn``
  sorts by user and ``seq`` and runs ``update_user``'s per-event loop on local
  variables per user (:func:`fold_user`): counts and totals of the batch only.
- **stateless_per_user** (``--per-user``, off by default): ``df.groupBy("user")
  .applyInPandas(...)`` of the same loop. Spark then runs one pandas call per user
  (milliseconds each, whatever the batch holds), which dwarfs the state's cost: a
  reference for the naive stateless job, not a measure of the state's overhead.

Batch 0 of each size is a warm-up of every side (topic creation, Python workers,
JIT; not measured); batches 1..N (default 5) are measured, every side on the same
DataFrame, rotating which goes first. Figures are per-batch medians of the wall
time of the call; overhead = stateful - stateless. The stateful split comes from
the processor's ``BatchReport``: ``task_s`` (the Spark job: the user's function on
the state, changelog persist), ``commit_s`` (the checkpoint commit) and the rest of
the call on the driver (latest-checkpoint lookup, planning, decoding the handles). A
last, unmeasured batch with a capturing sink checks the state: the event count and
total spent of its users must equal what every batch fed in gives.

The input-offsets side (:mod:`benchmarks.input_check_side`) runs a real Kafka-sourced
query and compares the driver's check of each batch's input against the state's with
the batch time's own noise.

Both sides shuffle rows into one Spark partition per subtask
(``spark_integration.streaming.subtask_partitioning.partition_by_subtask``), so with
parallelism 2 on ``local[2]`` the two subtasks run at the same time; the results
record the partition each subtask ran in (``subtask_partitions``, from the
processor's ``BatchReport``).

A CI run or anything else on a 2-core machine distorts these figures: the load
average (which counts this benchmark's own broker, JVM and workers too) and the
share of the CPUs other processes used (``foreign_cpu_share``: not this process,
the broker, Spark's JVM or its Python workers) are recorded with every batch. There
is no waiting for a quiet machine (it would not fit the time budget: about 3 min at
``BENCH_SCALE=1``, 1 min at 0.1).

Run: ``python -m benchmarks.bench_streaming_overhead [--json FILE] [--batches N]
[--per-user]`` (default ``benchmarks/results/streaming_overhead.json``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd
import psutil

from benchmarks.common import (
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
from benchmarks.input_check_side import input_check_case
from examples.clickstream import OUTPUT_SCHEMA, expected_state, update_user
from examples.events import events
from spark_integration.streaming import (
    StatefulProcessor,
    StreamingStateConfig,
    stateful_foreach_batch,
)
from spark_integration.streaming.key_rows import KeyRows
from spark_integration.streaming.subtask_partitioning import partition_by_subtask

DEFAULT_JSON = RESULTS_DIR / "streaming_overhead.json"
#: (events per batch at BENCH_SCALE=1, minimum)
SIZES = ((1_000, 100), (100_000, 1_000))
#: Users at BENCH_SCALE=1 (scaled like the events: the same events per user).
USERS = 2_000
MIN_USERS = 100
PARALLELISM = 2
PARTITIONS = 8
OPERATOR = "bench"
COLUMNS = ["user", "seq", "kind", "page", "amount"]
#: Events of the last (unmeasured) batch that checks the state.
CHECK_EVENTS = 200
MAX_PARALLELISM = 128
BUCKET_COLUMN = "__bucket"
#: The stateful path's subtask of a row (its key group's share of ``PARALLELISM``).
BUCKET_EXPR = (f"cast(floor(pmod(hash(user), {MAX_PARALLELISM}) * {PARALLELISM} / "
               f"{MAX_PARALLELISM}) as int)")
STATELESS = "stateless"
PER_USER = "stateless_per_user"
STATEFUL = "stateful"


def fold_user(rows: pd.DataFrame) -> dict[str, Any]:
    """``update_user``'s loop on local variables: one user's totals of this batch only."""
    count = 0
    spent: float | None = None
    kinds: dict[str, int] = {}
    pages: list[str] = []
    for row in rows.itertuples(index=False):
        count += 1
        amount = float(row.amount)
        spent = amount if spent is None else round(spent + amount, 2)
        kinds[row.kind] = kinds.get(row.kind, 0) + 1
        pages.append(row.page)
    if len(pages) > 5:
        pages = pages[-5:]
    return {"user": rows["user"].iloc[0], "events": count, "spent": spent}


def stateless_bucket(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """One bucket (= one subtask of the stateful path, one Spark partition): sort, then
    :func:`fold_user` per user, as the stateful task calls the user's function per key."""
    frames = list(batches)
    if not frames:
        return
    data = pd.concat(frames, ignore_index=True).sort_values(["user", "seq"], kind="stable")
    # Each user's rows as our per-key calls get them (KeyRows: a cheaper itertuples), so
    # that the baseline differs from ours only by the state.
    records = [fold_user(KeyRows(group.drop(columns=[BUCKET_COLUMN])))
               for _, group in data.groupby("user", sort=True)]
    yield pd.DataFrame(records, columns=["user", "events", "spent"])


def stateless_user(rows: pd.DataFrame) -> pd.DataFrame:
    """One user's rows (Spark groups by user): :func:`fold_user` in ``seq`` order."""
    return pd.DataFrame([fold_user(rows.sort_values("seq", kind="stable"))])


@dataclass
class BatchRun:
    """One measured call of one side."""

    side: str
    batch_id: int
    events: int
    users: int
    seconds: float
    rows_out: int
    #: Share of the machine's CPUs used by other processes (not us, the broker, Spark).
    foreign_cpu_share: float
    #: ``os.getloadavg()`` right after the call.
    load_average: tuple[float, float, float]
    #: Stateful only (from the processor's BatchReport), else None.
    task_s: float | None = None
    commit_s: float | None = None
    sink_s: float | None = None
    driver_other_s: float | None = None
    report_seconds: float | None = None


def own_pids(broker: Broker) -> list[int]:
    """The broker's JVMs and every process this one started (Spark's JVM, its Python
    workers): their CPU is the benchmark's, not other processes' load."""
    pids = set(broker.pids())
    pids.update(child.pid for child in psutil.Process().children(recursive=True))
    pids.discard(os.getpid())
    return sorted(pids)


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return (round(one, 2), round(five, 2), round(fifteen, 2))


def batch_frames(count: int, batches: int, users: int) -> list[pd.DataFrame]:
    """``batches`` batches of ``count`` events, then the check batch (seq runs on)."""
    frame = pd.DataFrame.from_records(
        list(events(count * batches + CHECK_EVENTS, users)), columns=COLUMNS)
    bounds = [*(i * count for i in range(batches + 1)), len(frame)]
    return [frame.iloc[lo:hi].reset_index(drop=True) for lo, hi in pairwise(bounds)]


def state_config(broker: Broker, label: str) -> StreamingStateConfig:
    """A fresh application with its own topics."""
    topics = {name: unique_topic(f"stream-{label}-{name}")
              for name in ("changelog", "snapshots", "checkpoints")}
    broker.topics.extend(topics.values())
    return StreamingStateConfig(
        application=f"bench-overhead-{label}-{uuid.uuid4().hex[:8]}",
        operator_id=OPERATOR,
        bootstrap_servers=broker.bootstrap_servers,
        client_config={k: v for k, v in broker.client_config.items()
                       if k != "bootstrap.servers"},
        changelog_topic=topics["changelog"],
        snapshot_topic=topics["snapshots"],
        checkpoint_topic=topics["checkpoints"],
        partitions=PARTITIONS,
        parallelism=PARALLELISM,
        materialization_interval_s=None,
    )


def timed_stateless(broker: Broker, side: str, df: Any, batch_id: int, size: int,
                    users: int) -> BatchRun:
    """One stateless batch: bucketed (as the stateful path) or grouped by user."""
    from pyspark.sql import functions as F

    gc.collect()
    foreign = ForeignLoad(own_pids(broker))
    start = time.perf_counter()
    if side == STATELESS:
        bucketed = df.withColumn(BUCKET_COLUMN, F.expr(BUCKET_EXPR))
        out = (partition_by_subtask(bucketed, BUCKET_COLUMN, PARALLELISM)
               .mapInPandas(stateless_bucket, OUTPUT_SCHEMA).toPandas())
    else:
        out = df.groupBy("user").applyInPandas(stateless_user, OUTPUT_SCHEMA).toPandas()
    seconds = time.perf_counter() - start
    if len(out) != users:
        raise RuntimeError(f"{side} batch {batch_id}: {len(out)} rows out, {users} users")
    return BatchRun(side, batch_id, size, users, seconds, len(out), foreign.share(),
                    load_average())


def timed_stateful(broker: Broker, processor: StatefulProcessor, df: Any, batch_id: int,
                   size: int, users: int) -> BatchRun:
    """One batch through the processor, as ``foreachBatch`` calls it."""
    gc.collect()
    foreign = ForeignLoad(own_pids(broker))
    start = time.perf_counter()
    processor(df, batch_id)
    seconds = time.perf_counter() - start
    report = processor.reports[-1]
    if report.batch_id != batch_id or not report.committed or report.rows_out != users:
        raise RuntimeError(f"stateful batch {batch_id}: {report}")
    return BatchRun(
        STATEFUL, batch_id, size, users, seconds, report.rows_out, foreign.share(),
        load_average(), report.task_s, report.commit_s, report.sink_s,
        report.seconds - report.task_s - report.commit_s - report.sink_s, report.seconds)


def check_state(spark: Any, processor: StatefulProcessor, frames: list[pd.DataFrame],
                batch_id: int) -> int:
    """One more batch through a capturing sink: its users' totals must cover every batch."""
    captured: list[pd.DataFrame] = []

    def sink(frame: Any, _batch_id: int) -> None:
        captured.append(frame.toPandas())

    processor.sink = sink
    try:
        processor(spark.createDataFrame(frames[-1][COLUMNS]), batch_id)
    finally:
        processor.sink = None
    all_events = pd.concat(frames, ignore_index=True).to_dict("records")
    expected = expected_state(iter(all_events))
    got = captured[0]
    for row in got.itertuples(index=False):
        want = expected[str(row.user)]
        if int(row.events) != want["events"] or abs(float(row.spent) - want["spent"]) > 1e-6:
            raise RuntimeError(f"state of {row.user}: events {row.events}, spent {row.spent}; "
                               f"expected {want['events']}, {want['spent']}")
    return len(got)


def summary(runs: list[BatchRun]) -> dict[str, float]:
    """Median and min seconds of one side's runs (and the stateful split)."""
    result = {"median_s": median(r.seconds for r in runs),
              "min_s": min(r.seconds for r in runs)}
    for name in ("task_s", "commit_s", "sink_s", "driver_other_s"):
        values = [getattr(r, name) for r in runs if getattr(r, name) is not None]
        if values:
            result[f"{name}_median"] = median(values)
    return result


def size_case(broker: Broker, spark: Any, base_count: int, minimum: int, batches: int,
              per_user: bool) -> dict[str, Any]:
    count = int(scaled(base_count, minimum=minimum))
    n_users = int(scaled(USERS, minimum=MIN_USERS))
    names = [STATELESS, *([PER_USER] if per_user else []), STATEFUL]
    print(f"\n[streaming overhead] {count:,} events per batch, {n_users:,} users, "
          f"1 warm-up + {batches} measured batches of {', '.join(names)}", flush=True)
    frames = batch_frames(count, batches + 1, n_users)
    users = [int(f["user"].nunique()) for f in frames]
    dfs = [spark.createDataFrame(f[COLUMNS]) for f in frames[:-1]]
    config = state_config(broker, str(count))
    processor = stateful_foreach_batch(config, update_user, "user", OUTPUT_SCHEMA,
                                       order_by=["seq"])

    def measure(side: str, b: int) -> BatchRun:
        if side == STATEFUL:
            return timed_stateful(broker, processor, dfs[b], b, len(frames[b]), users[b])
        return timed_stateless(broker, side, dfs[b], b, len(frames[b]), users[b])

    def line(label: str, batch: list[BatchRun]) -> str:
        parts = []
        for r in sorted(batch, key=lambda r: names.index(r.side)):
            text = f"{r.side} {r.seconds:.3f} s"
            if r.side == STATEFUL:
                text += (f" (task {r.task_s:.3f}, commit {r.commit_s:.3f}, "
                         f"driver {r.driver_other_s:.3f})")
            parts.append(text)
        share = max(r.foreign_cpu_share for r in batch)
        return (f"  {label:9s} {'   '.join(parts)}   others' CPU <= {share:.0%}, "
                f"load {batch[-1].load_average[0]:.2f}")

    started = time.perf_counter()
    load_before = load_average()
    try:
        warmup = [measure(side, 0) for side in names]
        print(line("warm-up", warmup), flush=True)
        runs: list[BatchRun] = []
        for batch_id in range(1, batches + 1):
            # Rotate which side goes first, so none always runs right after another.
            shift = (batch_id - 1) % len(names)
            batch = [measure(side, batch_id) for side in names[shift:] + names[:shift]]
            runs.extend(batch)
            print(line(f"batch {batch_id}", batch), flush=True)
        checked = check_state(spark, processor, frames, batches + 1)
        print(f"  state checked: {checked} users' totals equal all events fed in", flush=True)
    finally:
        processor.close()
    elapsed = time.perf_counter() - started
    changelog_records = broker.record_count(config.changelog_topic)
    sides = {name: summary([r for r in runs if r.side == name]) for name in names}
    base = sides[STATELESS]["median_s"]
    ours = sides[STATEFUL]["median_s"]
    case: dict[str, Any] = {
        "events_per_batch": count,
        "users": n_users,
        "users_per_batch": median(users[1:-1]),
        "subtask_partitions": {str(k): v for k, v in
                               processor.reports[-1].subtask_partitions.items()},
        "batches": batches,
        "stateless_median_s": base,
        "stateful_median_s": ours,
        "ratio": ours / base,
        "overhead_s": ours - base,
        "overhead_us_per_event": (ours - base) / count * 1e6,
        "stateful_split_median_s": {
            "task_s": sides[STATEFUL]["task_s_median"],
            "commit_s": sides[STATEFUL]["commit_s_median"],
            "sink_s": sides[STATEFUL]["sink_s_median"],
            "driver_other_s": sides[STATEFUL]["driver_other_s_median"],
        },
        "sides": sides,
    }
    if per_user:
        case["per_user_median_s"] = sides[PER_USER]["median_s"]
        case["ratio_vs_per_user"] = ours / sides[PER_USER]["median_s"]
    case.update({
        "foreign_cpu_share_median": median(r.foreign_cpu_share for r in runs),
        "foreign_cpu_share_max": max(r.foreign_cpu_share for r in runs),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "changelog_records": changelog_records,
        "events_fed": sum(len(f) for f in frames),
        "state_checked_users": checked,
        "case_seconds": elapsed,
        "application": config.application,
        "warmup": [asdict(r) for r in warmup],
        "runs": [asdict(r) for r in runs],
    })
    return case


def start_spark() -> Any:
    """The ``local[2]`` session, bound to 127.0.0.1."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from spark_integration.sessions.session import local_session

    return local_session(
        "bench-streaming-overhead", parallelism=PARALLELISM,
        extra_config={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                      "spark.ui.showConsoleProgress": "false"})


def run(broker: Broker | None = None, batches: int = 5, per_user: bool = False,
        spark: Any = None) -> dict[str, Any]:
    """Every size (on ``broker``, or a fresh local one; in ``spark``, or a session of its
    own, stopped at the end); returns the JSON-able results."""
    if broker is None:
        with kafka_broker() as own:
            return run(own, batches, per_user, spark)
    if spark is None:
        own_spark = start_spark()
        try:
            return run(broker, batches, per_user, own_spark)
        finally:
            own_spark.stop()
    from spark_integration.sessions.session import spark_version

    cases = [size_case(broker, spark, base_count, minimum, batches, per_user)
             for base_count, minimum in SIZES]
    check = input_check_case(broker, spark, state_config(broker, "input-check"))
    return {
        "name": "streaming_overhead",
        "spark": spark_version(),
        "parallelism": PARALLELISM,
        "partitions": PARTITIONS,
        "max_parallelism": MAX_PARALLELISM,
        "bucket_expr": BUCKET_EXPR,
        "materialization": None,
        "cases": cases,
        "input_check": check,
    }


def report(results: dict[str, Any]) -> str:
    per_user = any("per_user_median_s" in case for case in results["cases"])
    rows = []
    for case in results["cases"]:
        split = case["stateful_split_median_s"]
        row = [
            f"{case['events_per_batch']:,}",
            f"{case['stateless_median_s'] * 1000:,.0f}",
            f"{case['stateful_median_s'] * 1000:,.0f}",
            ratio_text(case["ratio"]),
            f"{case['overhead_s'] * 1000:+,.0f}",
            f"{case['overhead_us_per_event']:+,.1f}",
            f"{split['task_s'] * 1000:,.0f}",
            f"{split['commit_s'] * 1000:,.0f}",
            f"{split['driver_other_s'] * 1000:,.0f}",
        ]
        if per_user:
            row += [f"{case['per_user_median_s'] * 1000:,.0f}",
                    ratio_text(case["ratio_vs_per_user"])]
        row += [f"{case['foreign_cpu_share_median']:.0%}",
                " / ".join(f"{x:.1f}" for x in case["load_average_after"])]
        rows.append(row)
    headers = ["events/batch", "stateless ms", "stateful ms", "ratio", "overhead ms",
               "us/event", "task ms", "commit ms", "driver ms"]
    if per_user:
        headers += ["per-user ms", "ratio vs per-user"]
    check = results["input_check"]
    return table([*headers, "others' CPU", "load 1/5/15"], rows) + (
        f"\ninput offsets check (Kafka source query, {check['events_per_batch']:,} events "
        f"per batch, {check['batches']} batches): median {check['check_median_s'] * 1000:.1f} "
        f"ms per batch ({check['check_share_of_batch']:.1%} of the batch); the batch "
        f"time's noise (MAD) {check['batch_mad_s'] * 1000:.1f} ms: "
        f"{'PASS' if check['within_noise'] else 'MISS'} (target: within the noise)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write the results to this file")
    parser.add_argument("--batches", type=int, default=5,
                        help="measured batches per size (after one warm-up)")
    parser.add_argument("--per-user", action="store_true",
                        help="also measure the stateless function grouped by user in Spark "
                             "(~5 ms of Spark per user and batch: slow)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    # Spark's JVM and the broker start at the same time (each takes seconds).
    with ThreadPoolExecutor(1) as pool:
        spark_future = pool.submit(start_spark)
        stopped = False
        try:
            with kafka_broker() as broker:
                spark = spark_future.result()
                print(f"broker and Spark up in {time.perf_counter() - started:.1f} s",
                      flush=True)
                try:
                    results = run(broker, batches=args.batches, per_user=args.per_user,
                                  spark=spark)
                    results["machine"] = machine_info()
                finally:
                    stopped = True
                    spark.stop()  # before the broker goes: its workers hold Kafka clients
        finally:
            if not stopped:  # the broker did not come up: Spark still has to go
                spark_future.result().stop()
    results["total_s"] = time.perf_counter() - started
    print("\nper-batch medians (ratio = stateful / stateless; overhead = stateful - stateless, "
          "per batch and per event; stateful split: task = Spark job, commit = checkpoint "
          "commit, driver = the rest of the call)")
    print(report(results))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
