"""The main job: a clickstream through Spark Structured Streaming with exactly-once state.

1. Uses the broker in ``KAFKA_BOOTSTRAP_SERVERS`` or starts a local Apache Kafka.
2. Writes a clickstream (JSON events keyed by user) to an input topic, and the same clicks
   with event times to a second one.
3. Runs two streaming queries side by side (input read with Spark's Kafka connector,
   ``format("kafka")``) at parallelism 2: the clickstream (``examples.clickstream``:
   per-user event count, running total, count per kind, last pages) and the sessions
   (``examples.sessions``: a session closes 30 minutes of event time after a user's last
   click, by an event-time timer, and its summary is written out; a TTL'd list of each
   user's recent pages). Each driver is killed with SIGKILL once its application
   committed two checkpoints.
4. Restarts both at parallelism 3 until every event is processed: state and timers follow
   their key groups.
5. Reads both states back with the Spark reader (``format("kafka-changelog")``, mode
   ``state``) and checks them against the input: the clickstream's state equals the state
   computed from all events, its output topic holds every batch's outputs exactly once;
   the session summaries written out plus the sessions still open in the state are
   exactly the sessions of the clicks, each once.

Spark runs in ``local[2]`` (``local[3]`` for the restart) unless ``--master
spark://host:port`` names a cluster, or ``--cluster local`` starts a standalone
cluster on this machine (a master and two workers of one core each) for the run.

Run it with ``./scripts/demo.sh`` (installs everything first) or, from the repository
root, ``python -m examples.streaming_demo [--events N] [--master URL | --cluster local]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kafka_changelog.kafka.checkpoint_store import CheckpointStoreConfig, KafkaCheckpointStore

from .changelog_demo import broker, progress
from .clickstream import expected_state, output_problems, produce_events, read_outputs
from .events import events
from .sessions import clicks, closing_clicks, expected_sessions, produce_clicks, read_sessions

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


@dataclass(frozen=True)
class Job:
    """One of the demo's two streaming queries: its module and its topics (by run id)."""

    module: str
    suffix: str
    input_topic: str
    output_topic: str
    #: The job's own options.
    options: tuple[str, ...] = ()

    def application(self, run: str) -> str:
        return f"{run}{self.suffix}"


#: Per-user totals, kinds and last pages (examples.clickstream).
CLICKSTREAM = Job("examples.clickstream", "", "clicks", "totals")
#: Event-time sessions closed by timers, a TTL'd list of recent pages (examples.sessions).
SESSIONS = Job("examples.sessions", "-sessions", "clicks-time", "sessions")


def job_command(servers: str, run: str, checkpoint_dir: str, parallelism: int, count: int,
                per_batch: int, spark: Spark | None = None, job: Job = CLICKSTREAM
                ) -> list[str]:
    spark = spark or Spark()
    engine = ["--master", spark.master] if spark.master else []
    for key, value in spark.config.items():
        engine += ["--spark-conf", f"{key}={value}"]
    app = job.application(run)
    return [sys.executable, "-m", job.module,
            "--bootstrap-servers", servers, "--application", app,
            "--input-topic", f"{run}-{job.input_topic}",
            "--output-topic", f"{run}-{job.output_topic}",
            "--topic-prefix", app, "--checkpoint-dir", checkpoint_dir,
            "--parallelism", str(parallelism), "--expected-events", str(count),
            "--max-per-batch", str(per_batch), "--materialization-interval", "3",
            *job.options, *engine]


def checkpoint_ids(store: KafkaCheckpointStore, application: str) -> list[int]:
    return store.checkpoint_ids(application)


def kill_after_two_checkpoints(children: dict[Job, subprocess.Popen[Any]],
                               stores: dict[Job, KafkaCheckpointStore], run_id: str) -> None:
    """SIGKILL each child once its application committed two checkpoints."""
    started = time.monotonic()
    alive = dict(children)
    while alive:
        time.sleep(0.5)
        for job, child in list(alive.items()):
            ids = checkpoint_ids(stores[job], job.application(run_id))
            if child.poll() is not None:
                del alive[job]
            elif len(ids) >= 2:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
                del alive[job]
                say(f"killed the {job.module} driver (kill -9) after checkpoints {ids}")
        if alive and time.monotonic() - started > 600:
            for child in alive.values():
                child.kill()
            raise TimeoutError("run 1 committed no two checkpoints within 600 s")


def run(count: int, users: int, per_batch: int, spark: Spark | None = None,
        keep_broker: bool = False) -> int:
    """The whole demo; returns the exit code (``keep_broker``: see ``--keep-broker``)."""
    spark = spark or Spark()
    jobs = (CLICKSTREAM, SESSIONS)
    with broker(keep_broker) as settings:
        servers = settings["bootstrap.servers"]
        run_id = f"demo-{uuid.uuid4().hex[:6]}"
        say(f"writing {count} click events of {users} users to topic {run_id}-clicks, and "
            f"with event times to {run_id}-clicks-time ...")
        produce_events(settings, f"{run_id}-clicks", count, users)
        # Then one more user's clicks, later in event time: in the batches that read them,
        # the watermark passes every open session, and event-time timers close them.
        all_clicks = clicks(count, users)
        all_clicks += closing_clicks(all_clicks, 2 * per_batch)
        # One partition: the clicks are read in event-time order, so none is later than
        # the allowed lateness (Spark's Kafka source does not read partitions in step).
        produce_clicks(settings, f"{run_id}-clicks-time", all_clicks, partitions=1)
        client_config = {k: v for k, v in settings.items() if k != "bootstrap.servers"}
        stores = {job: KafkaCheckpointStore(CheckpointStoreConfig(
            bootstrap_servers=servers, topic=f"{job.application(run_id)}-checkpoints",
            client_config=client_config)) for job in jobs}
        directories = {job: tempfile.mkdtemp(prefix="kafka-changelog-demo-") for job in jobs}

        def start(job: Job, parallelism: int, output: int | None) -> subprocess.Popen[Any]:
            expected = len(all_clicks) if job is SESSIONS else count
            command = job_command(servers, run_id, directories[job], parallelism, expected,
                                  per_batch, spark, job)
            return subprocess.Popen(command, stdout=output, stderr=subprocess.DEVNULL,
                                    text=True)

        try:
            say(f"run 1: the clickstream and the sessions queries at parallelism 2 on "
                f"{spark.describe()}; each will be killed with SIGKILL")
            kill_after_two_checkpoints({job: start(job, 2, subprocess.DEVNULL) for job in jobs},
                                       stores, run_id)
            say("run 2: both restart at parallelism 3: state and timers follow the key groups")
            restarted = time.monotonic()
            children = {job: start(job, 3, subprocess.PIPE) for job in jobs}
            summary = {}
            for job, child in children.items():
                out, _ = child.communicate()
                if child.returncode != 0:
                    say(f"FAIL: run 2 of {job.module} exited with {child.returncode}")
                    return 1
                summary[job] = json.loads(out.strip().splitlines()[-1])
            run2_s = time.monotonic() - restarted
            latest = {job: stores[job].latest(job.application(run_id)) for job in jobs}
            retained = checkpoint_ids(stores[CLICKSTREAM], run_id)
        finally:
            for store in stores.values():
                store.close()
            # Spark's checkpointLocations of this run: the state is in Kafka.
            for directory in directories.values():
                shutil.rmtree(directory, ignore_errors=True)
        say("reading the state back with spark.read.format('kafka-changelog') ...")
        read_started = time.monotonic()
        rows = read_states(settings, {job.application(run_id): checkpoint.checkpoint_id
                                      for job, checkpoint in latest.items()
                                      if checkpoint is not None}, spark)
        read_s = time.monotonic() - read_started
        state = clickstream_state(rows[CLICKSTREAM.application(run_id)])
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
        session_rows = rows[SESSIONS.application(run_id)]
        closed = sorted((user, first, last, n) for _, user, first, last, n
                        in read_sessions(settings, f"{run_id}-sessions"))
        still_open = open_sessions(session_rows)
        sessions = expected_sessions(all_clicks)
        found = sorted(closed + still_open)
        if found != sessions:
            missing = sorted(set(sessions) - set(found))
            unexpected = sorted(set(found) - set(sessions))
            say(f"FAIL: {len(closed)} sessions in {run_id}-sessions and {len(still_open)} open "
                f"in the state are not the {len(sessions)} sessions of the clicks: missing "
                f"{missing[:3]} ({len(missing)}), not expected {unexpected[:3]} "
                f"({len(unexpected)}); late clicks dropped in run 2: "
                f"{summary[SESSIONS]['late_rows']}")
            return 1
        say(f"sessions: {len(closed)} closed (by their event-time timers or a later click) "
            f"written exactly once to {run_id}-sessions, {len(still_open)} open in the state: "
            f"exactly the {len(sessions)} sessions of the clicks")
        recent = session_rows[session_rows["state"] == "recent_pages"]
        print()
        print("=== kafka-changelog streaming demo ===")
        print(f"events              {count} from {users} users, read with Spark's "
              "format('kafka')")
        print(f"spark               {spark.describe()}")
        clickstream_latest = latest[CLICKSTREAM]
        assert clickstream_latest is not None
        print(f"checkpoints         latest {clickstream_latest.checkpoint_id} of "
              f"{len(clickstream_latest.subtasks)} subtasks; retained {retained} (older ones "
              "garbage-collected)")
        print(f"run 2               {summary[CLICKSTREAM]['batches']} batches in {run2_s:.1f} s "
              "(Spark start included) after a kill -9 and a rescale 2 -> 3")
        restore = (f"{summary[CLICKSTREAM]['restore_s']:.2f} s"
                   if summary[CLICKSTREAM]["restore_s"] is not None else "none (no checkpoint yet)")
        print(f"restore after kill  {restore} (slowest subtask: snapshot + changelog tail, "
              "at the new parallelism)")
        print(f"materializations    {summary[CLICKSTREAM]['materializations']} snapshots in run "
              "2's checkpoints, made while the query ran")
        print(f"spark state read    {read_s:.1f} s (both applications)")
        print(f"outputs             {len(outputs)} records of {output_batches} batches in "
              f"{run_id}-totals, committed with their checkpoints (exactly once)")
        print(f"sessions            {len(closed)} closed, {len(still_open)} open; run 2 fired "
              f"{summary[SESSIONS]['timers_fired']} event-time timers, watermark now "
              f"{_utc(summary[SESSIONS]['watermarks'][-1])}")
        if len(recent):
            print(f"recent pages (TTL)  {len(recent)} entries, each expiring 10 minutes after "
                  f"it was written (the first at {recent['expires_at'].min()} UTC)")
        print("look at the changelog and the outputs with kcat:")
        print(f"  kcat -C -b {servers} -t {run_id}-changelog -o beginning -e -c 5 "
              "-f '%p@%o key=%k headers=%h\\n'")
        print(f"  kcat -C -b {servers} -t {run_id}-totals -o beginning -e -c 5 "
              "-f 'batch %h: %s\\n'")
        print(f"  kcat -C -b {servers} -t {run_id}-sessions -o beginning -e -c 5 -f '%s\\n'")
        print(f"  kafka-changelog -b {servers} topics --topic {run_id}-changelog")
    return 0


def _utc(ms: int | None) -> str:
    if ms is None:
        return "none yet"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def read_states(settings: dict[str, Any], checkpoints: dict[str, int],
                engine: Spark | None = None) -> dict[str, pd.DataFrame]:
    """Each application's state rows at its checkpoint, read with the Spark reader
    (``format("kafka-changelog")``, mode ``state``; the topics named after the
    application)."""
    from spark_integration import register, spark_session

    engine = engine or Spark()
    spark = spark_session(engine.master or "local[2]", "kafka-changelog-demo-read", 2,
                          engine.config)
    try:
        register(spark)
        found = {}
        for application, checkpoint_id in checkpoints.items():
            reader = spark.read.format("kafka-changelog").option("mode", "state") \
                .option("application", application) \
                .option("checkpoint", str(checkpoint_id)) \
                .option("changelog.topic", f"{application}-changelog") \
                .option("snapshot.topic", f"{application}-snapshots") \
                .option("checkpoint.topic", f"{application}-checkpoints")
            for key, value in settings.items():
                reader = reader.option(f"kafka.{key}", str(value))
            found[application] = reader.load().toPandas()
        return found
    finally:
        spark.stop()


def clickstream_state(rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per-user state of the clickstream job from its state rows, shaped like
    :func:`~examples.clickstream.expected_state`."""
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


def open_sessions(rows: pd.DataFrame) -> list[tuple[str, int, int, int]]:
    """The sessions job's open sessions in its state rows: (user, start, end, clicks)."""
    fields: dict[str, dict[str, int]] = {}
    for row in rows[rows["state"].isin(["session_start", "session_last", "session_clicks"])] \
            .itertuples(index=False):
        fields.setdefault(bytes(row.key).decode(), {})[row.state] = int(row.value_decoded)
    return sorted((user, f["session_start"], f["session_last"], f["session_clicks"])
                  for user, f in fields.items())


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
