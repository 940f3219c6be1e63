"""Where a subtask's state comes from, batch after batch, on a Spark standalone cluster of two
workers, as one host and as two hosts, and in ``local[2]``, with ``state_backend="rocksdb"``
and ``"memory"``.

Spark hands a micro-batch's task for subtask ``i`` to any free executor, and within it to
any free Python worker: with ``"memory"`` a task that lands elsewhere than the subtask's
previous one restores the subtask's state from Kafka; with ``"rocksdb"`` it reattaches
the subtask's store from the host's local state directory when the store is on that
host. On one host (both workers share the machine's state directory, as executors of
one host do) every store is there; on two hosts (``LocalSparkCluster(hosts=True)``: each
worker binds a loopback address and has a state directory of its own) a subtask whose
task lands on the other host finds no store at its checkpoint there. The processor's
reports say which happened, per subtask and batch (``BatchReport.subtask_metrics[s].state_source``:
``reattached``, ``reattached-local``, ``restored``, ``fresh``).

Workload: the clickstream function (:func:`examples.clickstream.update_user`:
per user a count, a total, a count per kind and the last five pages), ``--users``
(default 20,000) users, ``--events`` (default 20,000) events per batch, ``--batches``
(default 50) batches, each a static DataFrame handed to the processor as
``foreachBatch`` does, parallelism 2, no materialization. Per engine (the cluster as one
host, then as two hosts: ``LocalSparkCluster(workers=2, cores_per_worker=1, hosts=...)``,
then ``local[2]``) and backend:

- the share of subtask-batches restored from Kafka, over all batches after the first
  (``fresh``) and over the warm ones (from batch 5 on; goal: 0 with ``"rocksdb"``, on
  one host and on two);
- median and p90 batch seconds; the cluster's median against ``local[2]``'s.

Run: ``PYTHONPATH=. python -m benchmarks.bench_cluster_state [--batches N] [--json FILE]``
(default ``benchmarks/results/cluster_state.json``; ``BENCH_SCALE`` scales users and
events; ``PYTHONPATH`` must name this checkout: the executors' Python workers import the
library from there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd

from benchmarks.common import (
    RESULTS_DIR,
    Broker,
    ForeignLoad,
    kafka_broker,
    machine_info,
    percentile,
    ratio_text,
    scaled,
    table,
    unique_topic,
    verdict,
    write_json,
)
from examples.clickstream import OUTPUT_SCHEMA, update_user
from examples.events import events
from spark_integration.streaming import StreamingStateConfig, stateful_foreach_batch

DEFAULT_JSON = RESULTS_DIR / "cluster_state.json"
USERS = 20_000
EVENTS = 20_000
BATCHES = 50
WARM_FROM = 5
PARALLELISM = 2
COLUMNS = ["user", "seq", "kind", "page", "amount"]
BACKENDS = ("rocksdb", "memory")
FAST_DRIVER = {"spark.driver.extraJavaOptions":
               "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData"}


def frames(users: int, per_batch: int, batches: int) -> list[pd.DataFrame]:
    """The batches' events (``seq`` increasing across batches)."""
    frame = pd.DataFrame.from_records(list(events(per_batch * batches, users)),
                                      columns=COLUMNS)
    return [frame.iloc[i * per_batch:(i + 1) * per_batch].reset_index(drop=True)
            for i in range(batches)]


def run_backend(broker: Broker, spark: Any, engine: str, backend: str,
                batches: list[pd.DataFrame], own: list[int], *, host_dirs: bool = False,
                before: dict[int, Callable[[], None]] | None = None) -> dict[str, Any]:
    """Run ``batches`` through a processor of ``backend`` on ``spark``. ``host_dirs``:
    every host keeps its stores in its own default state directory (else all share one
    directory, made here). ``before``: what to do before some batches (by batch id; not
    timed)."""
    topics = {name: unique_topic(f"cluster-{backend}-{name}")
              for name in ("changelog", "snapshots", "checkpoints")}
    broker.topics.extend(topics.values())
    local_dir = None if host_dirs else tempfile.mkdtemp(prefix="bench-cluster-state-")
    config = StreamingStateConfig(
        application=f"bench-cluster-{backend}-{uuid.uuid4().hex[:8]}", operator_id="users",
        bootstrap_servers=broker.bootstrap_servers,
        client_config={k: v for k, v in broker.client_config.items()
                       if k != "bootstrap.servers"},
        changelog_topic=topics["changelog"], snapshot_topic=topics["snapshots"],
        checkpoint_topic=topics["checkpoints"], partitions=8, parallelism=PARALLELISM,
        materialization_interval_s=None, state_backend=backend, local_state_dir=local_dir)
    processor = stateful_foreach_batch(config, update_user, "user", OUTPUT_SCHEMA,
                                       order_by=["seq"])
    print(f"\n[{engine}, {backend}] {len(batches)} batches of {len(batches[0]):,} events",
          flush=True)
    runs: list[dict[str, Any]] = []
    load = ForeignLoad(own)
    try:
        for batch_id, frame in enumerate(batches):
            if before and batch_id in before:
                before[batch_id]()
                print(f"  before batch {batch_id}: {before[batch_id].__name__}", flush=True)
            df = spark.createDataFrame(frame)
            started = time.perf_counter()
            processor(df, batch_id)
            seconds = time.perf_counter() - started
            report = processor.reports[-1]
            subtasks = [report.subtask_metrics[s] for s in sorted(report.subtask_metrics)]
            sources = [m.state_source for m in subtasks]
            restore_s = sum(report.restore_s.values())
            runs.append({"batch_id": batch_id, "seconds": seconds, "sources": sources,
                         "restore_s": restore_s, "attach_s": [m.attach_s for m in subtasks],
                         "hosts": [m.host for m in subtasks],
                         "state_rows": sum(m.state_rows
                                           for m in report.subtask_metrics.values())})
            if batch_id % 10 == 0 or "restored" in sources:
                print(f"  batch {batch_id:3d}: {seconds:6.2f} s {'/'.join(sources)}"
                      + (f" (restore {restore_s:.2f} s)" if restore_s else ""), flush=True)
    finally:
        processor.close()
        if local_dir is not None:
            shutil.rmtree(local_dir, ignore_errors=True)
    after_first = runs[1:]
    warm = runs[WARM_FROM:]

    def restored_share(selected: list[dict[str, Any]]) -> float:
        tasks = [s for r in selected for s in r["sources"]]
        return float(sum(s == "restored" for s in tasks) / max(1, len(tasks)))

    batch_seconds: list[float] = [r["seconds"] for r in after_first]
    counts: dict[str, int] = {}
    for r in after_first:
        for source in r["sources"]:
            counts[source] = counts.get(source, 0) + 1
    return {"engine": engine, "backend": backend, "batches": len(runs),
            "restored_share": restored_share(after_first),
            "restored_share_warm": restored_share(warm), "sources": counts,
            "median_s": median(batch_seconds), "p90_s": percentile(batch_seconds, 90),
            "restore_s_total": sum(r["restore_s"] for r in runs),
            "others_cpu_share": round(load.share(), 3), "runs": runs}


def own_pids(broker: Broker) -> list[int]:
    import psutil

    pids = set(broker.pids())
    pids.update(child.pid for child in psutil.Process().children(recursive=True))
    return sorted(pids)


def run(broker: Broker, batches: int) -> dict[str, Any]:
    from spark_integration.sessions.session import spark_session
    from tests.spark.standalone import LocalSparkCluster

    users = int(scaled(USERS, minimum=200))
    per_batch = int(scaled(EVENTS, minimum=200))
    data = frames(users, per_batch, batches)
    results: list[dict[str, Any]] = []
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for engine, hosts in (("cluster, 1 host", False), ("cluster, 2 hosts", True)):
        with LocalSparkCluster(workers=2, cores_per_worker=1, hosts=hosts) as cluster:
            spark = spark_session(cluster.master_url, "bench-cluster-state", PARALLELISM,
                                  {**cluster.session_config(), **FAST_DRIVER})
            try:
                for backend in BACKENDS:
                    results.append(run_backend(broker, spark, engine, backend, data,
                                               own_pids(broker), host_dirs=hosts))
            finally:
                spark.stop()
    spark = spark_session("local[2]", "bench-cluster-state-local", PARALLELISM, FAST_DRIVER)
    try:
        for backend in BACKENDS:
            results.append(run_backend(broker, spark, "local[2]", backend, data,
                                       own_pids(broker)))
    finally:
        spark.stop()
    local = {r["backend"]: r for r in results if r["engine"] == "local[2]"}
    for r in results:
        r["median_vs_local"] = r["median_s"] / local[r["backend"]]["median_s"]
        if r["backend"] == "rocksdb":
            r["verdict"] = verdict(r["restored_share_warm"] == 0)
    return {"name": "cluster_state", "users": users, "events_per_batch": per_batch,
            "batches": batches, "warm_from": WARM_FROM, "cases": results}


def report(results: dict[str, Any]) -> str:
    rows = []
    for r in results["cases"]:
        sources = ", ".join(f"{k} {v}" for k, v in sorted(r["sources"].items()))
        rows.append([
            r["engine"], r["backend"], f"{r['restored_share']:.0%}",
            f"{r['restored_share_warm']:.0%}", sources, f"{r['restore_s_total']:.1f}",
            f"{r['median_s']:.2f}", f"{r['p90_s']:.2f}", ratio_text(r["median_vs_local"]),
            f"{r['others_cpu_share']:.0%}", r.get("verdict", "-"),
        ])
    return table(["engine", "backend", "restored", f"restored from batch {results['warm_from']}",
                  "subtask-batches by source", "restore s", "median s", "p90 s",
                  "median / local[2]", "others' CPU", "0 restores warm"], rows)


def measured_run(run: Callable[[Broker, int], dict[str, Any]], doc: str | None,
                 default_json: Path, argv: list[str] | None) -> tuple[dict[str, Any], Path]:
    """Parse ``--json``/``--batches``, then ``run`` against a fresh broker; the results
    (with the machine and the total seconds) and where to write them."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--json", type=Path, default=default_json)
    parser.add_argument("--batches", type=int, default=BATCHES)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with kafka_broker() as broker:
        results = run(broker, args.batches)
        results["machine"] = machine_info()
    results["total_s"] = time.perf_counter() - started
    return results, args.json


def main(argv: list[str] | None = None) -> int:
    results, json_path = measured_run(run, __doc__, DEFAULT_JSON, argv)
    print(f"\nstate sources and batch times ({results['users']:,} users, "
          f"{results['events_per_batch']:,} events per batch, {results['batches']} batches, "
          f"parallelism {PARALLELISM}; batch 0 is fresh and not counted)")
    print(report(results))
    write_json(json_path, results)
    return 0

if __name__ == "__main__":
    sys.exit(main())
