"""The main job: a clickstream through Spark Structured Streaming with exactly-once state.

1. Uses the broker in ``KAFKA_BOOTSTRAP_SERVERS`` or starts a local Apache Kafka.
2. Writes a clickstream (JSON events keyed by user) to an input topic.
3. Runs the streaming query (``examples.clickstream``: input read with Spark's
   Kafka connector, ``format("kafka")``) at parallelism 2, keeping per-user state (event
   count, running total, count per kind, last pages) with kafka-changelog, and kills its
   driver with SIGKILL once two checkpoints are committed.
4. Restarts it at parallelism 3 until every event is processed.
5. Reads the state back with the Spark reader (``format("kafka-changelog")``, mode
   ``state``) and checks it equals the state computed directly from all input events,
   and that the output topic holds every batch's outputs exactly once.

Spark runs in ``local[2]`` (``local[3]`` for the restart) unless ``--master
spark://host:port`` names a cluster, or ``--cluster local`` starts a standalone
cluster on this machine (a master and two workers of one core each) for the run.

Run it with ``./scripts/demo.sh`` (installs everything first) or, from the repository
root, ``python -m examples.streaming_demo [--events N] [--master URL | --cluster local]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore

from .changelog_demo import broker, progress
from .clickstream import expected_state, output_problems, produce_events, read_outputs
from .events import events

say = progress


@dataclass(frozen=True)
class Spark:
    """Where the demo's Spark runs: ``local[n]`` (no master) or a cluster."""

    master: str | None = None
    config: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return self.master or "local[2], then local[3]"


@contextlib.contextmanager
def spark_engine(master: str | None, cluster: str | None,
                 config: dict[str, str]) -> Iterator[Spark]:
    """The Spark to run on; with ``cluster == "local"``, a standalone cluster started
    here (and stopped at the end)."""
    if cluster is None:
        yield Spark(master, config)
        return
    from tests.spark.standalone import LocalSparkCluster

    say("starting a local Spark standalone cluster (master + 2 workers, 1 core each) ...")
    started = time.monotonic()
    with LocalSparkCluster(workers=2, cores_per_worker=1) as local:
        say(f"Spark master up at {local.master_url} in {time.monotonic() - started:.1f} s")
        yield Spark(local.master_url, {**local.session_config(), **config})
    say("Spark cluster stopped")


def job_command(servers: str, run: str, checkpoint_dir: str, parallelism: int, count: int,
                per_batch: int, spark: Spark | None = None) -> list[str]:
    spark = spark or Spark()
    engine = ["--master", spark.master] if spark.master else []
    for key, value in spark.config.items():
        engine += ["--spark-conf", f"{key}={value}"]
    return [sys.executable, "-m", "examples.clickstream",
            "--bootstrap-servers", servers, "--application", run,
            "--input-topic", f"{run}-clicks", "--output-topic", f"{run}-totals",
            "--topic-prefix", run, "--checkpoint-dir", checkpoint_dir,
            "--parallelism", str(parallelism), "--expected-events", str(count),
            "--max-per-batch", str(per_batch), "--materialization-interval", "3", *engine]


def checkpoint_ids(store: KafkaCheckpointStore, run: str) -> list[int]:
    return store.checkpoint_ids(run)


def run(count: int, users: int, per_batch: int, spark: Spark | None = None,
        keep_broker: bool = False) -> int:
    """The whole demo; returns the exit code (``keep_broker``: see ``--keep-broker``)."""
    spark = spark or Spark()
    with broker(keep_broker) as settings:
        servers = settings["bootstrap.servers"]
        run_id = f"demo-{uuid.uuid4().hex[:6]}"
        say(f"writing {count} click events of {users} users to topic {run_id}-clicks ...")
        produce_events(settings, f"{run_id}-clicks", count, users)
        checkpoint_dir = tempfile.mkdtemp(prefix="kafka-changelog-demo-")
        store = KafkaCheckpointStore(CheckpointStoreConfig(
            bootstrap_servers=servers, topic=f"{run_id}-checkpoints",
            client_config={k: v for k, v in settings.items() if k != "bootstrap.servers"}))
        try:
            say(f"run 1: streaming query at parallelism 2 on {spark.describe()}; it will be "
                "killed with SIGKILL")
            child = subprocess.Popen(job_command(servers, run_id, checkpoint_dir, 2, count,
                                                 per_batch, spark), stderr=subprocess.DEVNULL)
            started = time.monotonic()
            while len(checkpoint_ids(store, run_id)) < 2 and child.poll() is None:
                time.sleep(0.5)
                if time.monotonic() - started > 600:
                    child.kill()
                    raise TimeoutError("run 1 committed no two checkpoints within 600 s")
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
                say(f"killed the driver (kill -9) after checkpoints "
                    f"{checkpoint_ids(store, run_id)}")
            say("run 2: restart at parallelism 3: state follows the key groups")
            restarted = time.monotonic()
            done = subprocess.run(job_command(servers, run_id, checkpoint_dir, 3, count,
                                              per_batch, spark), stderr=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, text=True, check=False)
            run2_s = time.monotonic() - restarted
            if done.returncode != 0:
                say(f"FAIL: run 2 exited with {done.returncode}")
                return 1
            summary = json.loads(done.stdout.strip().splitlines()[-1])
            latest = store.latest(run_id)
            assert latest is not None
            retained = checkpoint_ids(store, run_id)
        finally:
            store.close()
        say("reading the state back with spark.read.format('kafka-changelog') ...")
        read_started = time.monotonic()
        state = read_state(settings, run_id, latest.checkpoint_id, spark)
        read_s = time.monotonic() - read_started
        expected = expected_state(events(count, users))
        if state != expected:
            wrong = [u for u in expected if state.get(u) != expected[u]]
            say(f"FAIL: state of {len(wrong)} users differs, e.g. {wrong[:3]}")
            return 1
        say(f"state of all {len(expected)} users equals the state computed from the events")
        outputs = read_outputs(settings, f"{run_id}-totals")
        problems = output_problems(outputs, expected)
        if problems:
            say(f"FAIL: output topic {run_id}-totals: {'; '.join(problems)}")
            return 1
        output_batches = len({batch for batch, *_ in outputs})
        say(f"output topic {run_id}-totals: {len(outputs)} records of {output_batches} "
            "batches, each batch's exactly once, the last totals equal the state")
        print()
        print("=== kafka-changelog streaming demo ===")
        print(f"events              {count} from {users} users, read with Spark's "
              "format('kafka')")
        print(f"spark               {spark.describe()}")
        print(f"checkpoints         latest {latest.checkpoint_id} of {len(latest.subtasks)} "
              f"subtasks; retained {retained} (older ones garbage-collected)")
        print(f"run 2               {summary['batches']} batches in {run2_s:.1f} s (Spark "
              "start included) after a kill -9 and a rescale 2 -> 3")
        restore = (f"{summary['restore_s']:.2f} s" if summary["restore_s"] is not None
                   else "none (no checkpoint yet)")
        print(f"restore after kill  {restore} (slowest subtask: snapshot + changelog tail, "
              "at the new parallelism)")
        print(f"materializations    {summary['materializations']} snapshots in run 2's "
              "checkpoints, made while the query ran")
        print(f"spark state read    {read_s:.1f} s")
        print(f"outputs             {len(outputs)} records of {output_batches} batches in "
              f"{run_id}-totals, committed with their checkpoints (exactly once)")
        print("look at the changelog and the outputs with kcat:")
        print(f"  kcat -C -b {servers} -t {run_id}-changelog -o beginning -e -c 5 "
              "-f '%p@%o key=%k headers=%h\\n'")
        print(f"  kcat -C -b {servers} -t {run_id}-totals -o beginning -e -c 5 "
              "-f 'batch %h: %s\\n'")
        print(f"  kafka-changelog -b {servers} topics --topic {run_id}-changelog")
    return 0


def read_state(settings: dict[str, Any], run_id: str, checkpoint_id: int,
               engine: Spark | None = None) -> dict[str, dict[str, Any]]:
    """Per-user state from the Spark reader, shaped like :func:`expected_state`."""
    from spark_integration.datasource import register
    from spark_integration.session import spark_session

    engine = engine or Spark()
    spark = spark_session(engine.master or "local[2]", "kafka-changelog-demo-read", 2,
                          engine.config)
    try:
        register(spark)
        reader = spark.read.format("kafka-changelog").option("mode", "state") \
            .option("application", run_id).option("checkpoint", str(checkpoint_id)) \
            .option("changelog.topic", f"{run_id}-changelog") \
            .option("snapshot.topic", f"{run_id}-snapshots") \
            .option("checkpoint.topic", f"{run_id}-checkpoints")
        for key, value in settings.items():
            reader = reader.option(f"kafka.{key}", str(value))
        rows = reader.load().toPandas()
    finally:
        spark.stop()
    users: dict[str, dict[str, Any]] = {}
    for row in rows.sort_values(["state", "key", "list_index"], na_position="first") \
            .itertuples(index=False):
        user = bytes(row.key).decode()
        s = users.setdefault(user, {"events": 0, "spent": None, "kinds": {},
                                    "last_pages": []})
        if row.state == "events":
            s["events"] = int(row.value_decoded)
        elif row.state == "spent":
            s["spent"] = float(row.value_decoded)
        elif row.state == "kinds":
            s["kinds"][bytes(row.map_key).decode()] = int(row.value_decoded)
        elif row.state == "last_pages":
            s["last_pages"].append(row.value_decoded)
    return users


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description="kafka-changelog streaming demo")
    parser.add_argument("--events", type=int, default=6000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--per-batch", type=int, default=1000)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--master", help="run the query on this Spark cluster "
                       "(spark://host:port); default: local[n]")
    where.add_argument("--cluster", choices=["local"],
                       help="start a Spark standalone cluster on this machine and run on it")
    parser.add_argument("--keep-broker", action="store_true",
                        help="keep the local broker the demo started running afterwards (until "
                             "Ctrl-C), so the kcat and kafka-changelog commands it prints work")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the query's sessions (repeatable), e.g. "
                             "spark.pyspark.python=/path/to/python on a cluster")
    args = parser.parse_args(argv)
    config = dict(item.split("=", 1) for item in args.spark_conf)
    with spark_engine(args.master, args.cluster, config) as spark:
        return run(args.events, args.users, args.per_batch, spark, args.keep_broker)


if __name__ == "__main__":
    sys.exit(main())
