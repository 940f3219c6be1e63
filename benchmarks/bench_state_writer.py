"""The state writer's throughput against the reader's, on a 1,000,000-key state.

One application is written directly with the storage (four subtasks, 16 partitions): one
checkpoint setting each of KEYS keys of an ``int64`` value state once (changelog only).
Then, in a ``local[2]`` session:

- the baseline, the reader: ``spark.read.format("kafka-changelog")`` in mode ``state``,
  ``count(*)`` (every key restored from the changelog and turned into a row);
- the writer: the same rows, read once and cached in Spark beforehand, written back with
  ``df.write.format("kafka-changelog").mode("overwrite")`` (each task writes its rows'
  entries as snapshot layers of the new backends, a layer per key group it has rows of;
  the driver commits the checkpoint naming them), from the call to its return.

Exactness is checked after every write: the state read back equals the rows written (no
row missing, none added, every value the same: ``exceptAll`` both ways is empty).

Each query runs once unmeasured, then ``--rounds`` times (default 2; the best counts). The
ratio is the writer's rows/s over the reader's. No target is set: the figure says what a
state write of a large state costs next to reading it.

Run: ``PYTHONPATH=. python -m benchmarks.bench_state_writer [--json FILE] [--rounds N]``
(default ``benchmarks/results/state_writer.json``; ``BENCH_SCALE`` scales KEYS).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_change_feed import Run, measure, options, report, state_batch, write_app
from benchmarks.common import (
    RESULTS_DIR,
    Broker,
    kafka_broker,
    machine_info,
    scaled,
    write_json,
)
from kafka_changelog.state import INT64, value_state

DEFAULT_JSON = RESULTS_DIR / "state_writer.json"
KEYS = 1_000_000
#: The benchmark application's one state (bench_change_feed's ``state_batch`` writes it).
COUNT = value_state("count", INT64)


def run(broker: Broker, rounds: int = 2) -> dict[str, Any]:
    """Write the application, read and write its state; the JSON-able results."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    keys = int(scaled(KEYS, minimum=10_000))
    print(f"\n[state writer] writing a {keys:,}-key state", flush=True)
    started = time.perf_counter()
    app = write_app(broker, "writer", state_batch(keys))
    print(f"  written in {time.perf_counter() - started:.1f} s", flush=True)

    from spark_integration import declared_states, register
    from spark_integration.sessions.session import local_session

    spark = local_session(
        app_name="bench-state-writer", parallelism=2,
        extra_config={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                      "spark.driver.memory": "2g", "spark.ui.showConsoleProgress": "false"})
    runs: list[Run] = []
    try:
        register(spark)
        read_options = options(broker, app, mode="state")
        write_options = {k: v for k, v in options(broker, app).items()}
        write_options["states"] = declared_states([COUNT])
        rows = spark.read.format("kafka-changelog").options(**read_options).load().select(
            "state", "key", "value").cache()
        if rows.count() != keys:
            raise RuntimeError(f"the state read has {rows.count()} rows, expected {keys}")

        def read() -> int:
            df = spark.read.format("kafka-changelog").options(**read_options).load()
            return int(df.count())

        def write() -> int:
            rows.write.format("kafka-changelog").options(**write_options).mode(
                "overwrite").save()
            return keys

        def check() -> None:
            after = spark.read.format("kafka-changelog").options(**read_options).load().select(
                "state", "key", "value")
            missing, added = rows.exceptAll(after).count(), after.exceptAll(rows).count()
            if missing or added:
                raise RuntimeError(f"the state written differs from the rows: {missing} rows "
                                   f"missing, {added} added")

        runs += measure(broker, "reader", read, keys, rounds)
        runs += measure(broker, "writer", write, keys, rounds, check)
        rows.unpersist()
    finally:
        spark.stop()
    best = {impl: min((r for r in runs if r.impl == impl), key=lambda r: r.seconds)
            for impl in dict.fromkeys(r.impl for r in runs)}
    return {
        "name": "state_writer",
        "keys": keys,
        "rounds": rounds,
        "ratio": best["writer"].rows_per_s / best["reader"].rows_per_s,
        "best": {impl: r.as_dict() for impl, r in best.items()},
        "runs": [r.as_dict() for r in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="write the results to this file")
    parser.add_argument("--rounds", type=int, default=2, help="measured runs of each side")
    args = parser.parse_args(argv)
    with kafka_broker() as broker:
        results = run(broker, rounds=args.rounds)
        results["machine"] = machine_info()
    print(f"\nstate writer against the reader, a {results['keys']:,}-key state; best run of "
          "each")
    print(report(results))
    print(f"writer / reader, rows/s: {results['ratio']:.3f}x (no target)")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
