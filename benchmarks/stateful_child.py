"""One side of ``bench_spark_stateful`` in a process of its own (and a JVM of its own).

``python -m benchmarks.stateful_child SPEC.json``: SPEC names the side, the phase,
the input directory, the checkpoint location and where to write the results.

- phase ``run``: start the side's query on the input files, process everything there
  (``processAllAvailable``), write the results (each batch's progress and output
  checksum; ours: the processor's batch reports) to ``out``, print ``READY`` and wait
  to be killed: the parent kills the whole process group with SIGKILL.
- phase ``restart``: in a new process (new JVM), start the same query again from the
  same ``checkpointLocation`` (and, for ours, the same Kafka topics and local state
  directory), process the new input, stop the query, read the sampled users' final
  state (not timed) and write the results.

The batch time is Spark's own ``durationMs.triggerExecution`` of each micro-batch
(``query.recentProgress``), the same measure for every side: everything the trigger
did, from planning the batch to committing it, the sink (and so ours, which runs
inside ``foreachBatch``) included.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.stateful_registry import RunContext, Side
from benchmarks.stateful_workload import CHECKSUM_SQL, INPUT_SCHEMA, Checksum

#: Session settings of every side (the same session for all: Spark's state store is
#: RocksDB with changelog checkpointing, which transformWithState requires).
SESSION_CONFIG = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.numRecentProgressUpdates": "10000",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
#: What ``spark_integration.sessions.session.spark_session`` sets, for a child that must not import
#: the library (``plain_session``: Spark's sides under another PySpark release).
PLAIN_SESSION_CONFIG = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}
READY = "READY"
#: The sides module, input schema and checksum of ``bench_spark_stateful`` (a spec may
#: name others: ``sides_module``, ``input_schema``, ``source_select``, ``checksum_sql``).
DEFAULT_SIDES = "benchmarks.stateful_sides"


def _session(spec: dict[str, Any], app_name: str) -> Any:
    """The child's ``local[2]`` session (:data:`SESSION_CONFIG` and the spec's
    ``session_config``), through the library unless the spec says ``plain_session``."""
    config = {**SESSION_CONFIG, "spark.driver.memory": spec["driver_memory"],
              **spec.get("session_config", {})}
    if not spec.get("plain_session"):
        from spark_integration.sessions.session import spark_session

        return spark_session("local[2]", app_name, 2, config, kafka_connector=False)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in {**PLAIN_SESSION_CONFIG, **config}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: the parent polls for the file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)


def _progress(query: Any) -> list[dict[str, Any]]:
    """Every micro-batch that had input: batch id, rows and durations (ms)."""
    found = []
    for progress in query.recentProgress:
        rows = int(progress["numInputRows"])
        if rows <= 0:
            continue
        durations = dict(progress["durationMs"])
        found.append({"batch_id": int(progress["batchId"]), "rows": rows,
                      "trigger_ms": int(durations.get("triggerExecution", 0)),
                      "add_batch_ms": int(durations.get("addBatch", 0)),
                      "durations_ms": {k: int(v) for k, v in durations.items()},
                      "timestamp": str(progress["timestamp"])})
    return found


def _reports(ctx: RunContext) -> list[dict[str, Any]]:
    """Our processor's batch reports, the parts the benchmark uses."""
    processor = ctx.extras.get("processor")
    if processor is None:
        return []
    return [{"batch_id": r.batch_id, "checkpoint_id": r.checkpoint_id, "kind": r.kind,
             "committed": r.committed, "rows_out": r.rows_out, "seconds": r.seconds,
             "task_s": r.task_s, "commit_s": r.commit_s, "sink_s": r.sink_s,
             "restore_s": {str(k): v for k, v in r.restore_s.items()},
             "state_source": {str(k): m.state_source for k, m in r.subtask_metrics.items()},
             "attach_s": {str(k): m.attach_s for k, m in r.subtask_metrics.items()},
             "timers_fired": sum(m.timers_fired for m in r.subtask_metrics.values()),
             "late_rows": sum(m.late_rows for m in r.subtask_metrics.values()),
             "state_rows": sum(m.state_rows for m in r.subtask_metrics.values()),
             "materializations_started": sum(m.materializations_started
                                             for m in r.subtask_metrics.values()),
             "materializations_completed": sum(m.materializations_completed
                                               for m in r.subtask_metrics.values())}
            for r in processor.reports]


def _watch(query: Any, path: Path, stop: threading.Event) -> None:
    """Keep ``path`` at the number of the last completed batch (for the parent's display)."""
    while not stop.wait(2.0):
        last = query.lastProgress
        if last is not None:
            path.write_text(str(last["batchId"]), encoding="utf-8")


def run(spec: dict[str, Any]) -> int:
    started = time.monotonic()
    sides = importlib.import_module(spec.get("sides_module", DEFAULT_SIDES)).SIDES
    side: Side = sides[spec["side"]]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = _session(spec, f"bench-stateful-{side.name}")
    session_s = time.monotonic() - started
    source = (spark.readStream.schema(spec.get("input_schema", INPUT_SCHEMA))
              .option("maxFilesPerTrigger", 1).parquet(spec["input_dir"]))
    if spec.get("source_select"):
        source = source.selectExpr(*spec["source_select"])
    checksum_sql = spec.get("checksum_sql", CHECKSUM_SQL)
    checksums: dict[int, list[int]] = {}

    def sink(df: Any, batch_id: int) -> None:
        row = df.selectExpr(*checksum_sql).collect()[0]
        checksums[batch_id] = Checksum.of_row(row).as_list()

    ctx = RunContext(spark, source, sink, spec["checkpoint_dir"], spec.get("state_config"),
                     spec.get("corrupt_user"))
    out = Path(spec["out"])
    stop = threading.Event()
    query = side.start(ctx)
    watcher = threading.Thread(target=_watch, args=(query, out.with_suffix(".batch"), stop),
                               daemon=True)
    watcher.start()
    query.processAllAvailable()
    processed_s = time.monotonic() - started
    if query.exception() is not None:
        raise RuntimeError(f"{side.name}: the query failed: {query.exception()}")
    progress = _progress(query)
    results: dict[str, Any] = {
        "side": side.name, "phase": spec["phase"], "pid": os.getpid(),
        "spark_version": spark.version,
        "session_s": session_s, "processed_s": processed_s,
        "progress": progress,
        "checksums": {str(k): v for k, v in sorted(checksums.items())},
        "reports": _reports(ctx),
    }
    if len(progress) != spec["expected_batches"]:
        results["error"] = (f"{len(progress)} batches with input, expected "
                            f"{spec['expected_batches']}")
    if spec["phase"] == "run":
        _write_json(out, results)
        print(READY, flush=True)
        while True:  # the parent kills this process group (kill -9)
            time.sleep(3600)
    stop.set()
    query.stop()
    if side.read_state is not None and spec.get("state_permille"):
        state_started = time.monotonic()
        results["state"] = side.read_state(ctx, int(spec["state_permille"]))
        results["state_read_s"] = time.monotonic() - state_started
    processor = ctx.extras.get("processor")
    if processor is not None:
        processor.close()
    _write_json(out, results)
    spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m benchmarks.stateful_child SPEC.json")
    return run(json.loads(Path(args[0]).read_text(encoding="utf-8")))


if __name__ == "__main__":
    sys.exit(main())
