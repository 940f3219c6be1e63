"""A host lost and back, on a Spark standalone cluster of two hosts, ``state_backend="rocksdb"``.

The workload of :mod:`benchmarks.bench_cluster_state` (the clickstream function,
``--users`` users, ``--events`` events per batch, parallelism 2, no materialization) on
``LocalSparkCluster(workers=2, cores_per_worker=1, hosts=True)``: two "hosts"
(127.0.0.2 and 127.0.0.3), each one core and its own host-local state directory, so each
holds one subtask's store once placement has settled. Before batch ``LOSE_AT`` (of
``--batches``, default 50: batch 30) the second host's worker is killed -9 with its
executor and Python workers; before batch ``BACK_AT`` (40) it is started again, on the
same address with the same directory (its stores as it left them), and the benchmark
waits until the application has an executor there again.

What it reports, against the issue's goals:

- warm batches before the loss (from ``WARM_FROM``): subtask-batches restored from
  Kafka (goal 0) and p90 batch time / median (goal <= 1.15x);
- the first batch after the loss: subtasks restored in full (goal: at most the subtasks
  that lived on the lost host, one here) and its time against the warm median; the
  batches after it until the host is back: restores (goal 0);
- after the host is back: where each subtask's state came from (``caught-up`` when a
  subtask returns to the copy it left there and replays only the changelog since), the
  seconds getting it (``attach_s``) against the full restores' seconds, and restores in
  the batches after the first one back (goal 0), and their median batch time against the
  warm median (both hosts used again: the driver places the subtasks anew when executors
  join).

Run: ``PYTHONPATH=. python -m benchmarks.bench_host_loss [--batches N] [--json FILE]``
(default ``benchmarks/results/host_loss.json``; ``BENCH_SCALE`` scales users and events).
"""

from __future__ import annotations

import os
import sys
import time
from statistics import median
from typing import Any

from benchmarks.bench_cluster_state import (
    EVENTS,
    FAST_DRIVER,
    PARALLELISM,
    USERS,
    WARM_FROM,
    frames,
    measured_run,
    own_pids,
    run_backend,
)
from benchmarks.common import (
    RESULTS_DIR,
    Broker,
    percentile,
    scaled,
    table,
    verdict,
    write_json,
)

DEFAULT_JSON = RESULTS_DIR / "host_loss.json"
#: Where in the run the host goes and comes back, as shares of the batches.
LOSE_SHARE, BACK_SHARE = 0.6, 0.8
#: Subtasks per host once placement has settled: 2 subtasks on 2 one-core hosts.
SUBTASKS_PER_HOST = PARALLELISM // 2
P90_TARGET = 1.15
EXECUTOR_WAIT_S = 120.0


def wait_for_executors(spark: Any, count: int, timeout: float = EXECUTOR_WAIT_S) -> float:
    """Wait until the application has ``count`` executors (the driver not counted);
    returns the seconds waited."""
    started = time.monotonic()
    tracker = spark.sparkContext.statusTracker()
    while len(tracker.getExecutorInfos()) - 1 < count:
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"the application has no {count} executors after {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def summarize(runs: list[dict[str, Any]], lose_at: int, back_at: int) -> dict[str, Any]:
    """The figures of one run (``runs``: ``run_backend``'s per-batch records)."""

    def restored(selected: list[dict[str, Any]]) -> int:
        return sum(s == "restored" for r in selected for s in r["sources"])

    warm = runs[WARM_FROM:lose_at]
    warm_s = [r["seconds"] for r in warm]
    warm_median = median(warm_s)
    p90 = percentile(warm_s, 90)
    first_lost, after_lost = runs[lose_at], runs[lose_at + 1:back_at]
    first_back, after_back = runs[back_at], runs[back_at + 1:]
    back_sources = [s for r in runs[back_at:back_at + 3] for s in r["sources"]]
    caught_up_s = [a for r in runs[back_at:] for s, a in zip(r["sources"], r["attach_s"],
                                                               strict=True)
                   if s == "caught-up"]
    restore_s = [a for r in runs for s, a in zip(r["sources"], r["attach_s"], strict=True)
                 if s == "restored"]
    checks = {
        "warm_restores": restored(warm) == 0,
        "p90_over_median": p90 / warm_median <= P90_TARGET,
        "first_batch_after_loss": restored([first_lost]) <= SUBTASKS_PER_HOST,
        "restores_while_lost": restored(after_lost) == 0,
        "restores_after_back": restored(after_back) == 0,
    }
    return {
        "lose_at": lose_at, "back_at": back_at,
        "warm_restores": restored(warm), "warm_median_s": warm_median, "warm_p90_s": p90,
        "p90_over_median": p90 / warm_median,
        "first_batch_after_loss": {"restored": restored([first_lost]),
                                   "seconds": first_lost["seconds"],
                                   "over_warm_median": first_lost["seconds"] / warm_median,
                                   "sources": first_lost["sources"]},
        "restores_while_lost": restored(after_lost),
        "first_batches_back_sources": back_sources,
        "first_batch_back_s": first_back["seconds"],
        "restores_after_back": restored(after_back),
        "back_median_s": median(r["seconds"] for r in after_back),
        "back_median_over_warm": median(r["seconds"] for r in after_back) / warm_median,
        "caught_up_s": caught_up_s, "restore_s": restore_s,
        "checks": checks, "verdict": verdict(all(checks.values())),
    }


def run(broker: Broker, batches: int) -> dict[str, Any]:
    from spark_integration.sessions.session import spark_session
    from tests.spark.standalone import LocalSparkCluster

    if batches < 20:
        raise SystemExit(f"--batches {batches}: at least 20 (warm batches, a loss, a return)")
    lose_at, back_at = int(batches * LOSE_SHARE), int(batches * BACK_SHARE)
    users = int(scaled(USERS, minimum=200))
    per_batch = int(scaled(EVENTS, minimum=200))
    data = frames(users, per_batch, batches)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with LocalSparkCluster(workers=2, cores_per_worker=1, hosts=True) as cluster:
        spark = spark_session(cluster.master_url, "bench-host-loss", PARALLELISM,
                              {**cluster.session_config(), **FAST_DRIVER})
        waited: dict[str, float] = {}

        def lose() -> None:
            cluster.kill_worker(1)

        def come_back() -> None:
            cluster.restart_worker(1)
            waited["executor_back_s"] = wait_for_executors(spark, 2)

        try:
            wait_for_executors(spark, 2)
            case = run_backend(broker, spark, "cluster, 2 hosts", "rocksdb", data,
                               own_pids(broker), host_dirs=True,
                               before={lose_at: lose, back_at: come_back})
        finally:
            spark.stop()
    summary = summarize(case["runs"], lose_at, back_at)
    return {"name": "host_loss", "users": users, "events_per_batch": per_batch,
            "batches": batches, "warm_from": WARM_FROM, **waited, **summary,
            "runs": case["runs"], "others_cpu_share": case["others_cpu_share"]}


def report(results: dict[str, Any]) -> str:
    first = results["first_batch_after_loss"]
    caught, restores = results["caught_up_s"], results["restore_s"]
    rows = [
        ["warm batches: restored subtask-batches", str(results["warm_restores"]), "0"],
        ["warm batches: p90 / median",
         f"{results['p90_over_median']:.3f}x ({results['warm_p90_s']:.2f} / "
         f"{results['warm_median_s']:.2f} s)", f"<= {P90_TARGET}x"],
        ["first batch after the loss: subtasks restored",
         f"{first['restored']} ({first['seconds']:.2f} s, "
         f"{first['over_warm_median']:.2f}x the warm median)", f"<= {SUBTASKS_PER_HOST}"],
        ["later batches while lost: restored", str(results["restores_while_lost"]), "0"],
        ["first batches back: sources", "/".join(results["first_batches_back_sources"]), "-"],
        ["catch-up s / full restore s (means)",
         (f"{sum(caught) / len(caught):.3f} / {sum(restores) / len(restores):.3f}"
          if caught and restores else f"{len(caught)} catch-ups, {len(restores)} restores"),
         "-"],
        ["batches after the first back: restored", str(results["restores_after_back"]), "0"],
        ["batches after the first back: median / warm median",
         f"{results['back_median_over_warm']:.2f}x ({results['back_median_s']:.2f} s)", "-"],
    ]
    return table(["figure", "measured", "goal"], rows)


def main(argv: list[str] | None = None) -> int:
    results, json_path = measured_run(run, __doc__, DEFAULT_JSON, argv)
    print(f"\na host lost before batch {results['lose_at']} and back before batch "
          f"{results['back_at']} ({results['users']:,} users, {results['events_per_batch']:,} "
          f"events per batch, {results['batches']} batches, parallelism {PARALLELISM})")
    print(report(results))
    print(f"result: {results['verdict']}")
    write_json(json_path, results)
    return 0

if __name__ == "__main__":
    sys.exit(main())
